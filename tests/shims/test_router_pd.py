"""Router-scoring and P/D spans, checked against the llm-d/vLLM shapes they imitate."""

from __future__ import annotations

import json

from opentelemetry.trace import SpanKind

from railtrace_tracing import semconv as sc
from railtrace_tracing._common import extract_context
from railtrace_tracing.pd import EngineRecorder, PDProxyRecorder
from railtrace_tracing.router_scoring import Candidate, SchedulingRecorder

MS = 1_000_000


def by_name(exporter) -> dict[str, object]:
    return {s.name: s for s in exporter.get_finished_spans()}


def test_profile_run_emits_llm_d_tree_with_full_candidate_list(otel) -> None:
    provider, exporter = otel
    cands = [
        Candidate(
            "10.0.1.5:8000", 0.91, {"prefix-cache-scorer": 0.9, "load": 0.95}, "z/b1/s1/h5", "decode-5"
        ),
        Candidate("10.0.2.7:8000", 0.90, {"prefix-cache-scorer": 0.8, "load": 1.0}, "z/b2/s3/h7", "decode-7"),
    ]
    t0 = 1_700_000_000_000_000_000
    SchedulingRecorder(provider).record(
        "decode",
        cands,
        "10.0.2.7:8000",
        scorers={"prefix-cache-scorer": 2.0, "load": 1.0},
        filtered_from=3,
        model="llama",
        request_id="chatcmpl-1",
        start_time_ns=t0,
        end_time_ns=t0 + MS,
    )
    spans = by_name(exporter)
    assert set(spans) == {
        sc.SPAN_RUN_SCHEDULER_PROFILE,
        sc.SPAN_FILTER_ENDPOINTS,
        sc.SPAN_EPP_SCORING,
        sc.SPAN_EPP_SCORER_PREFIX + "prefix-cache-scorer",
        sc.SPAN_EPP_SCORER_PREFIX + "load",
        sc.SPAN_PICK_ENDPOINTS,
    }
    prof = spans[sc.SPAN_RUN_SCHEDULER_PROFILE]
    assert prof.attributes[sc.EPP_PROFILE_NAME] == "decode"
    assert (prof.start_time, prof.end_time) == (t0, t0 + MS)
    pick = spans[sc.SPAN_PICK_ENDPOINTS]
    assert pick.parent.span_id == prof.context.span_id
    assert pick.attributes[sc.EPP_PICKER_TOP_ENDPOINTS] == ("10.0.2.7:8000",)
    assert pick.attributes[sc.ROUTER_CANDIDATE_ENDPOINTS] == ("10.0.1.5:8000", "10.0.2.7:8000")
    assert pick.attributes[sc.ROUTER_CANDIDATE_TOPOLOGY] == ("z/b1/s1/h5", "z/b2/s3/h7")
    assert json.loads(pick.attributes[sc.ROUTER_CANDIDATE_SCORER_SCORES][1])["load"] == 1.0
    scorer = spans[sc.SPAN_EPP_SCORER_PREFIX + "prefix-cache-scorer"]
    assert scorer.parent.span_id == spans[sc.SPAN_EPP_SCORING].context.span_id
    assert (
        scorer.attributes[sc.EPP_SCORER_WEIGHT] == 2.0 and scorer.attributes[sc.EPP_SCORER_SCORE_MAX] == 0.9
    )
    assert spans[sc.SPAN_FILTER_ENDPOINTS].attributes[sc.EPP_FILTER_CANDIDATES] == 3
    for s in spans.values():
        assert t0 <= s.start_time <= s.end_time <= t0 + MS


def test_pd_proxy_decode_is_child_of_prefill_with_rollups(otel) -> None:
    provider, exporter = otel
    rec = PDProxyRecorder(provider)
    t0 = 1_700_000_000_000_000_000
    incoming = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    with (
        rec.request(
            "POST",
            "/v1/chat/completions",
            headers=incoming,
            request_id="pd-1",
            start_time_ns=t0,
            end_time_ns=t0 + 500 * MS,
        ) as req,
        req.prefill("10.0.0.7:8000", start_time_ns=t0 + 1 * MS, end_time_ns=t0 + 51 * MS) as p,
    ):
        p.status_code = 200
        with req.decode("10.0.1.5:8000", start_time_ns=t0 + 52 * MS, end_time_ns=t0 + 499 * MS) as d:
            hdrs = d.headers()
            params = d.kv_transfer_params({"remote_engine_id": "e7", "remote_host": "10.0.0.7"})
    spans = by_name(exporter)
    server = spans["llm_d.pd_proxy.POST /v1/chat/completions"]
    fwd, pre, dec = spans[sc.SPAN_PD_FORWARD], spans[sc.SPAN_PD_PREFILL], spans[sc.SPAN_PD_DECODE]
    assert server.kind is SpanKind.SERVER and server.parent.span_id == 0x00F067AA0BA902B7
    assert fwd.parent.span_id == server.context.span_id and pre.parent.span_id == fwd.context.span_id
    assert dec.parent.span_id == pre.context.span_id  # the sidecar's nesting
    assert (
        pre.attributes[sc.PD_PREFILL_STATUS] == 200 and pre.attributes[sc.PD_PREFILL_LEG_DURATION_MS] == 50.0
    )
    assert dec.attributes[sc.PD_TRUE_TTFT_MS] == 52.0 and dec.attributes[sc.PD_TOTAL_DURATION_MS] == 499.0
    assert (
        dec.attributes[sc.PD_REQUEST_ID] == "pd-1" and fwd.attributes[sc.PD_PREFILL_TARGET] == "10.0.0.7:8000"
    )
    assert hdrs["x-request-id"] == "pd-1"
    ctx = extract_context(params[sc.KV_PARAM_TRACE_HEADERS])
    from opentelemetry import trace

    assert trace.get_current_span(ctx).get_span_context().span_id == dec.context.span_id


def test_engine_llm_request_in_seconds_with_decode_queue(otel) -> None:
    provider, exporter = otel
    t0 = 1_700_000_000_000_000_000
    EngineRecorder(provider, role="decode").llm_request(
        request_id="chatcmpl-1",
        arrival_time_ns=t0,
        scheduled_time_ns=t0 + 322 * MS,
        first_token_time_ns=t0 + 343 * MS,
        last_token_time_ns=t0 + 3091 * MS,
        prompt_tokens=2071,
        completion_tokens=200,
        trace_headers={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
    )
    [span] = exporter.get_finished_spans()
    a = span.attributes
    assert span.name == sc.SPAN_VLLM_REQUEST and span.kind is SpanKind.SERVER
    assert abs(a[sc.VLLM_QUEUE] - 0.322) < 1e-9 and abs(a[sc.VLLM_TTFT] - 0.343) < 1e-9
    assert a[sc.LLM_D_ROLE] == "decode" and span.end_time == t0 + 3091 * MS
