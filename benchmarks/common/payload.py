"""Realistic OTLP payloads for the ingest benchmark: 8-span llm-d P/D requests, ~15
attributes per span, as the real stack emits them (names from the Jaeger capture and the
llm-d/vLLM references), 512 spans per export call."""

from __future__ import annotations

import random

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from railtrace.otlp.encode import key_value as _kv

SPANS_PER_TRACE = 8
MS = 1_000_000
T0 = 1_790_000_000 * 10**9

PROCESSES = {
    "epp": ("llm-d-router/epp", "llm-d-epp-7c9f-x2", "gke-a3u-cpu-1"),
    "sidecar": ("routing-sidecar", "decode-7b8c-4", "gke-a3u-gpu-17"),
    "prefill": ("vllm-prefill", "prefill-5d6f-2", "gke-a3u-gpu-03"),
    "decode": ("vllm-decode", "decode-7b8c-4", "gke-a3u-gpu-17"),
}


def _common(rng: random.Random, rid: str) -> dict[str, object]:
    return {
        "http.request.method": "POST",
        "url.path": "/v1/chat/completions",
        "server.address": f"10.8.{rng.randrange(256)}.{rng.randrange(256)}",
        "server.port": 8000,
        "network.protocol.version": "1.1",
        "user_agent.original": "python-httpx/0.27.0",
        "http.request.header.x-request-id": [rid],
        "gen_ai.request.model": "meta-llama/Llama-3.1-70B-Instruct",
    }


def spans_of_request(
    rng: random.Random, n: int
) -> list[tuple[str, str, str | None, dict[str, object], int, int]]:
    """(process, name, parent index, attributes, start offset, end offset) of the 8 spans."""
    rid = f"{rng.getrandbits(128):032x}"
    base = _common(rng, rid)
    total = rng.randrange(800, 4000) * MS
    prefill_ms = rng.randrange(30, 120)
    eps = [f"10.8.3.{i}:8000" for i in range(4)]
    return [
        (
            "epp",
            "gateway.request",
            None,
            {
                **base,
                "http.response.status_code": 200,
                "llm_d.epp.pd.disaggregation_used": True,
                "gen_ai.usage.input_tokens": 2071,
                "gen_ai.usage.output_tokens": 200,
                "llm_d.epp.pd.prefill_pod_address": "10.8.3.2",
                "llm_d.epp.pd.prefill_pod_port": "8000",
                "target_model": "llama-70b",
            },
            0,
            total,
        ),
        (
            "epp",
            "run_scheduler_profile",
            "0",
            {
                **base,
                "llm_d.epp.scheduling.profile.name": "decode",
                "llm_d.epp.filter.candidate_endpoints": 4,
                "llm_d.epp.filter.filtered_endpoints": 3,
                "llm_d.epp.picker.top_endpoints": eps[:2],
                "llm_d.epp.picker.top_scores": [0.91, 0.88],
                "llm_d.epp.picker.candidate_endpoints": 3,
            },
            MS // 10,
            MS // 5,
        ),
        (
            "epp",
            "run_scheduler_profile",
            "0",
            {
                **base,
                "llm_d.epp.scheduling.profile.name": "prefill",
                "llm_d.epp.filter.candidate_endpoints": 4,
                "llm_d.epp.filter.filtered_endpoints": 4,
                "llm_d.epp.picker.top_endpoints": eps[2:],
                "llm_d.epp.picker.top_scores": [0.7, 0.6],
                "llm_d.epp.picker.candidate_endpoints": 4,
            },
            MS // 5,
            MS // 4,
        ),
        (
            "sidecar",
            "forward_request",
            "0",
            {
                **base,
                "llm_d.pd_proxy.request_id": rid,
                "llm_d.pd_proxy.connector": "nixlv2",
                "llm_d.pd_proxy.prefill_target": "10.8.3.2:8000",
                "llm_d.pd_proxy.decode.target": "10.8.3.1:8000",
                "llm_d.pd_proxy.total_duration_ms": total / MS,
                "llm_d.pd_proxy.true_ttft_ms": prefill_ms + 1.0,
                "llm_d.pd_proxy.coordinator_overhead_ms": 0.4,
            },
            MS,
            total - MS,
        ),
        (
            "sidecar",
            "prefill",
            "3",
            {
                **base,
                "llm_d.pd_proxy.request_id": rid,
                "llm_d.pd_proxy.connector": "nixlv2",
                "llm_d.pd_proxy.prefill_target": "10.8.3.2:8000",
                "llm_d.pd_proxy.prefill.status_code": 200,
                "llm_d.pd_proxy.prefill.duration_ms": float(prefill_ms),
                "llm_d.pd_proxy.prefill_duration_ms": float(prefill_ms),
                "gen_ai.request.max_tokens": 1,
            },
            2 * MS,
            (2 + prefill_ms) * MS,
        ),
        (
            "prefill",
            "llm_request",
            "4",
            {
                **base,
                "gen_ai.request.id": f"chatcmpl-{rid}",
                "gen_ai.usage.prompt_tokens": 2071,
                "gen_ai.usage.completion_tokens": 1,
                "gen_ai.latency.time_in_queue": 0.002,
                "gen_ai.latency.time_to_first_token": prefill_ms / 1000,
                "gen_ai.latency.e2e": prefill_ms / 1000,
                "gen_ai.latency.time_in_model_prefill": 0.03,
            },
            3 * MS,
            (1 + prefill_ms) * MS,
        ),
        (
            "sidecar",
            "decode",
            "4",
            {
                **base,
                "llm_d.pd_proxy.request_id": rid,
                "llm_d.pd_proxy.decode.target": "10.8.3.1:8000",
                "llm_d.pd_proxy.decode.streaming": True,
                "llm_d.pd_proxy.decode.duration_ms": (total / MS) - prefill_ms - 4,
                "llm_d.pd_proxy.decode_duration_ms": (total / MS) - prefill_ms - 4,
                "gen_ai.request.max_tokens": 200,
                "llm_d.pd_proxy.true_ttft_ms": prefill_ms + 1.0,
            },
            (3 + prefill_ms) * MS,
            total - 2 * MS,
        ),
        (
            "decode",
            "llm_request",
            "6",
            {
                **base,
                "gen_ai.request.id": f"chatcmpl-{rid}",
                "gen_ai.usage.prompt_tokens": 2071,
                "gen_ai.usage.completion_tokens": 200,
                "gen_ai.latency.time_in_queue": 0.01,
                "gen_ai.latency.time_to_first_token": 0.02,
                "gen_ai.latency.e2e": total / 1e9 - 0.1,
                "gen_ai.latency.time_in_model_decode": total / 1e9 - 0.2,
            },
            (4 + prefill_ms) * MS,
            total - 3 * MS,
        ),
    ]


def export_calls(total_spans: int, spans_per_call: int = 512, seed: int = 1) -> list[bytes]:
    """Serialised ExportTraceServiceRequests, `spans_per_call` spans each, distinct trace ids."""
    rng = random.Random(seed)
    traces_per_call = spans_per_call // SPANS_PER_TRACE
    calls: list[bytes] = []
    n = 0
    while len(calls) * spans_per_call < total_spans:
        req = ExportTraceServiceRequest()
        scopes = {}
        for proc, (service, pod, node) in PROCESSES.items():
            rs = req.resource_spans.add()
            rs.resource.attributes.extend(
                [
                    _kv("service.name", service),
                    _kv("k8s.pod.name", pod),
                    _kv("k8s.node.name", node),
                    _kv("k8s.namespace.name", "llm-d"),
                    _kv("host.name", node),
                    _kv("telemetry.sdk.language", "python"),
                    _kv("telemetry.sdk.version", "1.30.0"),
                ]
            )
            ss = rs.scope_spans.add()
            ss.scope.name = f"{service}.tracer"
            scopes[proc] = ss
        for _ in range(traces_per_call):
            n += 1
            tid = rng.getrandbits(128).to_bytes(16, "big")
            sids = [rng.getrandbits(64).to_bytes(8, "big") for _ in range(SPANS_PER_TRACE)]
            start = T0 + n * 7 * MS
            for i, (proc, name, parent, attrs, s0, s1) in enumerate(spans_of_request(rng, n)):
                pb = scopes[proc].spans.add()
                pb.trace_id = tid
                pb.span_id = sids[i]
                if parent is not None:
                    pb.parent_span_id = sids[int(parent)]
                pb.name = name
                pb.kind = 2 if parent is None else 1
                pb.start_time_unix_nano = start + s0
                pb.end_time_unix_nano = start + s1
                pb.attributes.extend(_kv(k, v) for k, v in attrs.items())
        calls.append(req.SerializeToString())
    return calls
