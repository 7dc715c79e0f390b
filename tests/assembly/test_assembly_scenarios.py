"""Scenario traces -> RequestFacts, compared with their hand-written expected facts.

The traces go through the real OTLP decoder (JSON and protobuf), so these tests cover the
path the receivers take, not a hand-built Span list.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from railtrace.assembly import assemble, request_keys
from railtrace.model import RequestFacts
from railtrace.otlp.reference import decode
from tests.fixtures.otlp_fixtures import (
    load_expected,
    load_spans,
    protobuf_body,
    scenario_names,
    split_protobuf_bodies,
)

SCENARIOS = scenario_names()


def _approx(actual: float | None, expected: float | None, what: str) -> None:
    if expected is None:
        assert actual is None, f"{what}: expected None, got {actual}"
    else:
        assert actual == pytest.approx(expected, abs=1e-6), f"{what}: {actual} != {expected}"


def check_facts(facts: RequestFacts, exp: dict[str, Any]) -> None:
    assert facts.trace_id == exp["trace_id"]
    assert facts.trace_ids == exp["trace_ids"]
    assert facts.request_id == exp["request_id"]
    assert facts.model == exp["model"]
    _approx(facts.ttft_s, exp["ttft_s"], "ttft_s")
    _approx(facts.e2e_s, exp["e2e_s"], "e2e_s")
    assert sorted(facts.breakdown_s) == sorted(exp["breakdown_s"]), facts.timing_sources
    for stage, value in exp["breakdown_s"].items():
        _approx(facts.breakdown_s[stage], value, f"breakdown_s[{stage}] ({facts.timing_sources.get(stage)})")
    for leg in ("prefill", "decode"):
        endpoint = getattr(facts, leg)
        for key, value in exp[leg].items():
            assert getattr(endpoint, key) == value, f"{leg}.{key}: {getattr(endpoint, key)!r} != {value!r}"
    if exp["kv"] is None:
        assert facts.kv is None
    else:
        assert facts.kv is not None
        for key, value in exp["kv"].items():
            if key == "duration_s":
                _approx(facts.kv.duration_s, value, "kv.duration_s")
            else:
                assert getattr(facts.kv, key) == value, f"kv.{key}"
    assert [[p.profile, p.chosen, len(p.candidates), p.source] for p in facts.picks] == exp["picks"]
    assert [f.name for f in facts.flags] == exp["flags"]
    evidence = " ".join(f.evidence for f in facts.flags)
    for fragment in exp["flag_evidence_contains"]:
        assert fragment in evidence, f"{fragment!r} not in {evidence!r}"
    for flag in facts.flags:
        assert flag.span_id, "a flag names the span it is about"
    assert facts.span_count == exp["span_count"]
    assert facts.complete is exp["complete"]
    for key, fragment in exp["timing_sources_contain"].items():
        assert fragment in facts.timing_sources.get(key, ""), (key, facts.timing_sources)


def check_all(facts: list[RequestFacts], expected: list[dict[str, Any]]) -> None:
    assert len(facts) == len(expected), [f.trace_id for f in facts]
    for got, exp in zip(facts, expected, strict=True):
        check_facts(got, exp)


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_matches_expected_facts(name: str) -> None:
    expected = load_expected(name)
    spans = load_spans(name)
    late = set(expected.get("late_span_ids", []))
    check_all(assemble(spans), expected["requests"])
    if late:
        early = [s for s in load_spans(name) if s.span_id not in late]
        check_all(assemble(early), expected["before_late"])


@pytest.mark.parametrize("name", SCENARIOS)
def test_arrival_order_and_export_batching_change_nothing(name: str) -> None:
    expected = load_expected(name)["requests"]
    spans = load_spans(name)
    for seed in range(3):
        shuffled = copy.deepcopy(spans)
        random.Random(seed).shuffle(shuffled)
        check_all(assemble(shuffled), expected)
    # Every process exporting on its own, in protobuf.
    batched = [
        s for body in split_protobuf_bodies(name) for s in decode(body, "application/x-protobuf").spans
    ]
    check_all(assemble(batched), expected)


def test_protobuf_and_json_give_the_same_facts() -> None:
    name = "pd-rdma-happy-path"
    from_proto = decode(protobuf_body(name), "application/x-protobuf").spans
    assert assemble(from_proto) == assemble(load_spans(name))


def test_capture_ttft_is_client_side_not_the_decode_engine_alone() -> None:
    """0.343 s is vLLM's decode-side TTFT; the client waited the prefill leg (sidecar
    true_ttft_ms=50) and the gateway hop too."""
    (facts,) = assemble(load_spans("pd-capture-current"))
    assert facts.ttft_s == pytest.approx(0.002 + 0.050 + 0.343)
    sources = facts.timing_sources["ttft"]
    assert "llm_d.pd_proxy.true_ttft_ms" in sources
    assert "gen_ai.latency.time_to_first_token" in sources
    assert facts.timing_sources["prefill_leg"].startswith("parent chain: prefill@")
    assert facts.timing_sources["decode_leg"].startswith("parent chain: decode@")


def test_kv_transfer_is_taken_out_of_decode_queue_not_double_counted() -> None:
    (with_kv,) = assemble(load_spans("pd-rdma-happy-path"))
    (without_kv,) = assemble(load_spans("missing-kv-span"))
    assert with_kv.breakdown_s["kv_transfer"] + with_kv.breakdown_s["decode_queue"] == pytest.approx(
        without_kv.breakdown_s["decode_queue"]
    )
    assert with_kv.ttft_s == pytest.approx(without_kv.ttft_s)


def test_two_requests_in_one_batch_stay_apart() -> None:
    spans = load_spans("pd-capture-current") + load_spans("gie-legacy-epp-aggregated")
    facts = assemble(spans)
    assert len(facts) == 2
    check_facts(facts[0], load_expected("pd-capture-current")["requests"][0])
    check_facts(facts[1], load_expected("gie-legacy-epp-aggregated")["requests"][0])


def test_orphan_llm_request_alone_is_one_request_and_joins_when_the_rest_arrives() -> None:
    spans = load_spans("pd-v0.9-orphan-vllm")
    orphans = [s for s in spans if s.name == "llm_request"]
    alone = assemble(copy.deepcopy(orphans))
    assert len(alone) == 1  # both legs share the request id: one request
    assert alone[0].flags == []  # both engines traced, sidecar not: coverage, not a flag
    assert alone[0].coverage["recipe"] == "engines"
    assert alone[0].complete  # nothing traced lost its link; the rest joins when it arrives
    assert len(assemble(spans)) == 1


def test_request_keys_join_sidecar_header_and_vllm_ids() -> None:
    spans = load_spans("pd-rdma-happy-path")
    by_name: dict[str, set[str]] = {}
    for span in spans:
        for key in request_keys(span):
            by_name.setdefault(span.name, set()).add(key)
    uuid = "3f2b8c1e-9a4d-4e7b-8c2f-5d1a6b7e9c01"
    assert (
        by_name["prefill"]
        == by_name["decode"]
        == by_name["llm_request"]
        == by_name["llm_d.kv_transfer"]
        == {uuid}
    )


def test_assemble_returns_nothing_for_nothing() -> None:
    assert assemble([]) == []
    assert assemble([None, "span", 3]) == []  # type: ignore[list-item]


def _flip(span_id: str) -> str:
    return format(int(span_id, 16) ^ (2**64 - 1), "016x")


def test_one_client_trace_holding_two_requests_gives_two_facts() -> None:
    """A load generator that wraps its requests in one trace: each gateway.request is one request."""
    first = load_spans("pd-capture-current")
    second = copy.deepcopy(first)
    trace_id = first[0].trace_id
    for span in second:
        span.span_id = _flip(span.span_id)
        span.parent_span_id = _flip(span.parent_span_id) if span.parent_span_id else None
        for key in ("llm_d.pd_proxy.request_id", "gen_ai.request.id"):
            if isinstance(span.attributes.get(key), str):
                value = span.attributes[key].replace("3f2b8c1e", "44444444")
                span.attributes[key] = value.replace("c0ffee00", "55555555")
    client = copy.deepcopy(first[0])
    client.name, client.span_id, client.parent_span_id, client.service_name = (
        "benchmark run",
        "0123456789abcdef",
        None,
        "loadgen",
    )
    client.attributes, client.scope_name = {}, "loadgen"
    for span in first + second:
        if span.name == "gateway.request":
            span.parent_span_id = client.span_id
    facts = assemble([client, *first, *second])
    assert len(facts) == 2
    assert {f.request_id for f in facts} == {
        "3f2b8c1e-9a4d-4e7b-8c2f-5d1a6b7e9c01",
        "44444444-9a4d-4e7b-8c2f-5d1a6b7e9c01",
    }
    assert [(f.span_count, f.trace_id, f.flags) for f in facts] == [(25, trace_id, [])] * 2


def test_committed_fixtures_match_their_builder() -> None:
    """`python tests/fixtures/traces/build.py` rewrites them; a stale file fails here."""
    from tests.fixtures.otlp_fixtures import TRACES_DIR
    from tests.fixtures.traces.build import render

    rendered = render()
    assert sorted(rendered) == SCENARIOS
    for name, (trace, expected) in rendered.items():
        assert (TRACES_DIR / f"{name}.json").read_text() == trace, name
        assert (TRACES_DIR / f"{name}.expected.json").read_text() == expected, name


def test_kv_facts_from_several_transfer_spans_and_a_failure() -> None:
    """Per-rank transfers of one request add up; any TCP lane makes the request TCP; an error
    on any of them is the request's KV error."""
    spans = load_spans("pd-rdma-happy-path")
    (kv,) = [s for s in spans if s.name == "llm_d.kv_transfer"]
    second = copy.deepcopy(kv)
    second.span_id = _flip(kv.span_id)
    second.start_ns, second.end_ns = kv.start_ns + 1_000_000, kv.end_ns + 2_000_000
    second.attributes.update(
        {
            "llm_d.kv_transfer.transport": "tcp",
            "llm_d.kv_transfer.devices": ["tcp/eth0"],
            "error.type": "NIXL_ERR",
        }
    )
    second.status_code = 2
    (facts,) = assemble([*spans, second])
    assert facts.kv is not None
    assert facts.kv.transport == "tcp"
    assert facts.kv.bytes == 2 * 48_234_496
    assert facts.kv.devices == ["rc_mlx5/mlx5_3:1", "tcp/eth0"]
    assert facts.kv.error_type == "NIXL_ERR"
    assert facts.kv.duration_s == pytest.approx(0.0066 + 0.002)  # one process: first start to last end
    assert facts.breakdown_s["decode_queue"] == pytest.approx(0.0331 - 0.0086)


def test_kv_span_longer_than_the_queue_clamps_and_says_so() -> None:
    spans = load_spans("pd-rdma-happy-path")
    (kv,) = [s for s in spans if s.name == "llm_d.kv_transfer"]
    kv.end_ns = kv.start_ns + 500_000_000  # 0.5 s, more than the 0.0331 s vLLM queued
    (facts,) = assemble(spans)
    assert facts.breakdown_s["decode_queue"] == 0.0
    assert "clamped" in facts.timing_sources["decode_queue"]


def test_sidecar_untraced_but_context_intact_is_not_broken() -> None:
    spans = load_spans("pd-capture-current")
    gateway = next(s for s in spans if s.name == "gateway.request")
    kept = [
        s
        for s in spans
        if s.scope_name != "llm-d-router/pkg/sidecar/proxy" and "otelhttp" not in s.scope_name
    ]
    for span in kept:
        if span.name == "llm_request":
            span.parent_span_id = gateway.span_id
    (facts,) = assemble(kept)
    assert facts.flags == [] and facts.complete
    assert facts.prefill.service == "vllm-prefill" and facts.decode.service == "vllm-decode"
    assert facts.timing_sources["prefill_leg"] == "service.name"
    # Without the sidecar, TTFT is gateway offset + prefill engine e2e + decode engine TTFT.
    assert facts.ttft_s == pytest.approx(0.003 + 0.0477 + 0.343)


def test_decode_leg_from_the_sidecar_pod_when_the_engine_says_nothing() -> None:
    """nixlv2 runs the sidecar in the decode pod: with no engine `k8s.*` and no EPP pick, the
    sidecar's own pod (and address) stand for the decode leg, and the evidence says so."""
    spans = [s for s in load_spans("pd-capture-current") if s.name != "pick_endpoints"]
    for s in spans:
        s.resource = {k: v for k, v in s.resource.items() if not k.startswith("k8s.")}
        if s.name in ("forward_request", "prefill", "decode"):
            s.resource = {**s.resource, "k8s.pod.name": "decode-pod-7", "railtrace.otlp.peer": "10.0.2.41"}
        s.join_keys = None
    (facts,) = assemble(spans)
    assert (facts.decode.pod, facts.decode.identity) == ("decode-pod-7", "sidecar_pod")
    assert facts.decode.sidecar_peer == "10.0.2.41"


@pytest.mark.parametrize(("decode_status", "broken"), [(2, False), (0, True), (1, True)])
def test_a_decode_leg_that_failed_leaves_no_llm_request_and_no_broken_trace(
    decode_status: int, broken: bool
) -> None:
    """vLLM writes no `llm_request` for a request it aborted, which is what happens when the
    sidecar's decode leg gives up: then a prefill span without its decode span is expected. If
    the decode leg did not fail, the decode engine's span was lost: a broken trace."""
    spans = [s for s in load_spans("pd-capture-current") if s.name != "llm_request" or _is_prefill(s)]
    for span in spans:
        if span.name == "decode":
            span.status_code = decode_status
    (facts,) = assemble(spans)
    assert ("broken_trace" in [f.name for f in facts.flags]) is broken
    if broken:
        (flag,) = [f for f in facts.flags if f.name == "broken_trace"]
        assert "has no decode vLLM llm_request" in flag.evidence


def _is_prefill(span: Any) -> bool:
    return span.attributes.get("gen_ai.request.max_tokens") == 1
