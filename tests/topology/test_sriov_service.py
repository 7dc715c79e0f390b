"""A KV transfer over an SR-IOV VF judged by the running service: the topology is the SR-IOV DRA
driver's slices plus Pods and claims (files, as `kubectl get -o yaml` gives them), the spans come
through the official OpenTelemetry SDK and OTLP/HTTP exporter, the verdict is read from the REST API."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from railtrace.server.runner import Service
from railtrace.settings import Settings
from railtrace_tracing import semconv as sc

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "topology" / "sriov"


def _provider(memory: InMemorySpanExporter, service: str, pod: str, node: str) -> trace.Tracer:
    resource = Resource.create(
        {"service.name": service, sc.RES_POD: pod, sc.RES_NODE: node, "k8s.namespace.name": "llm-d"}
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider.get_tracer("railtrace.test")


def _emit(memory: InMemorySpanExporter, devices: list[str], rid: str, transport: str = "rdma") -> str:
    sidecar = _provider(memory, "routing-sidecar", "decode-0", "sriov-node-b")
    prefill = _provider(memory, "vllm-prefill", "prefill-0", "sriov-node-a")
    decode = _provider(memory, "vllm-decode", "decode-0", "sriov-node-b")
    t0 = time.time_ns() - 5 * 10**9
    ms = 1_000_000
    root = sidecar.start_span(
        "forward_request",
        attributes={sc.PD_REQUEST_ID: rid, "llm_d.pd_proxy.connector": "nixlv2"},
        start_time=t0,
    )
    ctx = trace.set_span_in_context(root)
    p = sidecar.start_span(
        "prefill", ctx, attributes={sc.PD_PREFILL_TARGET: "10.1.0.1:8000"}, start_time=t0 + ms
    )
    pr = prefill.start_span(
        "llm_request",
        trace.set_span_in_context(p),
        attributes={"gen_ai.request.id": f"chatcmpl-{rid}", "gen_ai.usage.prompt_tokens": 2048},
        start_time=t0 + 2 * ms,
    )
    pr.end(t0 + 50 * ms)
    p.end(t0 + 51 * ms)
    d = sidecar.start_span(
        "decode", ctx, attributes={sc.PD_DECODE_TARGET: "10.1.0.2:8000"}, start_time=t0 + 52 * ms
    )
    dr = decode.start_span(
        "llm_request",
        trace.set_span_in_context(d),
        attributes={"gen_ai.request.id": f"chatcmpl-{rid}", "gen_ai.latency.time_to_first_token": 0.09},
        start_time=t0 + 53 * ms,
    )
    kv = decode.start_span(
        sc.SPAN_KV_TRANSFER,
        trace.set_span_in_context(dr),
        attributes={
            sc.KV_OPERATION: "read",
            sc.KV_CONNECTOR: "nixl",
            sc.KV_BACKEND: "UCX",
            sc.KV_BYTES: 48_000_000,
            sc.KV_TRANSPORT: transport,
            sc.KV_DEVICES: devices,
            sc.KV_LOCAL_GPU: "0",
            sc.KV_REMOTE_HOST: "10.1.0.1",
        },
        start_time=t0 + 54 * ms,
    )
    kv.end(t0 + 61 * ms)
    dr.end(t0 + 300 * ms)
    d.end(t0 + 301 * ms)
    root.end(t0 + 302 * ms)
    return format(root.get_span_context().trace_id, "032x")


def _summary(base: str, trace_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = httpx.get(f"{base}/api/v1/requests/{trace_id}", timeout=5)
        if r.status_code == 200 and r.json().get("kv_transfer"):
            return r.json()
        time.sleep(0.2)
    raise AssertionError(f"no summary with a KV transfer for {trace_id}: {r.status_code} {r.text[:300]}")


def test_service_judges_a_transfer_over_a_vf(tmp_path: Path) -> None:
    settings = Settings(
        db=f"sqlite:///{tmp_path / 'railtrace.db'}",
        topology=[str(FIX / "slices.yaml"), str(FIX / "pods-and-claims.yaml"), str(FIX / "rails.yaml")],
        host="127.0.0.1",
        port=0,
        grpc_port=0,
        quiet_period_s=0.3,
    )
    with Service(settings) as svc:
        memory = InMemorySpanExporter()
        healthy = _emit(memory, ["rc_mlx5/mlx5_5:1"], "5e1f0000-1111-2222-3333-444455556666")
        fallback = _emit(memory, ["tcp/eth0"], "5e1f0001-1111-2222-3333-444455556666", transport="tcp")
        exporter = OTLPSpanExporter(endpoint=svc.http_url + "/v1/traces")
        assert exporter.export(memory.get_finished_spans()) == SpanExportResult.SUCCESS
        exporter.shutdown()
        s = _summary(svc.http_url, healthy)
        tcp = _summary(svc.http_url, fallback)
        topo = httpx.get(f"{svc.http_url}/api/v1/topology", timeout=5).json()
    assert s["kv_transfer"]["path_class"] == "rdma_same_rail", s
    assert s["flags"] == []
    assert s["decode"]["nic"] == "0000-1a-00-1" and s["decode"]["rail"] == "rail-0"
    assert "VF 0000:1a:00.1 of PF ibp26s0" in s["kv_transfer"]["evidence"]
    assert [f["name"] for f in tcp["flags"]] == ["tcp_fallback"]
    assert "RDMA NICs 0000-1a-00-1" in tcp["flags"][0]["evidence"]
    node = next(n for n in topo["nodes"] if n["name"] == "sriov-node-b")
    assert node["rdma_path"] is True
    assert {p["method"] for p in node["pairings"]} == {"pcieRoot"}
