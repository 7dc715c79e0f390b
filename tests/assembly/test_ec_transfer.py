"""Encoder-cache transfers (`llm_d.ec_transfer`, vLLM's EC connector over NIXL) are their own
kind: never a request of their own, never a KV verdict, never a `broken_trace`."""

from __future__ import annotations

from typing import Any

from railtrace.assembly import assemble
from railtrace.model import Span
from railtrace.normalize import normalize_span
from railtrace_tracing import semconv as sc

T0 = 1_790_000_000 * 10**9
MS = 1_000_000
EC_ATTRS: dict[str, Any] = {
    sc.KV_OPERATION: "read",
    sc.KV_CONNECTOR: "nixl",
    sc.KV_BYTES: 1 << 20,
    sc.KV_TRANSPORT: "tcp",
    sc.KV_DEVICES: ["tcp/eth0"],
    sc.KV_REMOTE_AGENT: "encode-agent-0",
}


def _span(trace: int, n: int, name: str, attrs: dict[str, Any], parent: int | None, service: str) -> Span:
    return Span(
        trace_id=f"{trace:032x}",
        span_id=f"{(trace << 8) + n:016x}",
        parent_span_id=f"{(trace << 8) + parent:016x}" if parent is not None else None,
        name=name,
        kind=2 if parent is None else 1,
        start_ns=T0 + n * MS,
        end_ns=T0 + (50 - n) * MS,
        service_name=service,
        scope_name="railtrace_tracing.kv_transfer" if name == sc.SPAN_KV_TRANSFER else "vllm",
        attributes=attrs,
        resource={"service.name": service, "k8s.pod.name": "decode-0"},
    )


def _request(trace: int) -> list[Span]:
    """A decode engine's request and the KV pull it made (llm-d's decode-only recipe)."""
    rid = "6f1c2b0e-1111-2222-3333-3a4d5e6f7a8b"
    kv = {sc.KV_REQUEST_ID: rid, sc.KV_OPERATION: "read", sc.KV_BYTES: 4096, sc.KV_TRANSPORT: "shm"}
    return [
        _span(trace, 1, sc.SPAN_VLLM_REQUEST, {sc.GEN_AI_REQUEST_ID: f"chatcmpl-{rid}"}, None, "vllm-decode"),
        _span(trace, 2, sc.SPAN_KV_TRANSFER, kv, 1, "vllm-decode"),
    ]


def _ec(trace: int, parent: str | None = None, **attrs: Any) -> Span:
    return Span(
        trace_id=f"{trace:032x}",
        span_id=f"{(trace << 8) + 99:016x}",
        parent_span_id=parent,
        name=sc.SPAN_EC_TRANSFER,
        kind=1,
        start_ns=T0 + 5 * MS,
        end_ns=T0 + 9 * MS,
        service_name="vllm-prefill",
        scope_name="railtrace_tracing.kv_transfer",
        attributes={**EC_ATTRS, **attrs},
        resource={"service.name": "vllm-prefill", "k8s.pod.name": "prefill-0"},
    )


def test_ec_span_has_its_own_role() -> None:
    span = normalize_span(_ec(7))
    assert span.role == sc.ROLE.EC_TRANSFER and span.canonical_name == sc.SPAN_EC_TRANSFER
    assert span.generation == "railtrace"


def test_lone_ec_span_is_no_request_even_with_a_request_id() -> None:
    assert assemble([_ec(7)]) == []
    assert assemble([_ec(8, **{sc.KV_REQUEST_ID: "abc-enc-0"})]) == []


def test_ec_span_in_a_request_changes_no_kv_fact_or_flag() -> None:
    plain = _request(1)
    [without] = assemble(plain)
    assert without.kv is not None and without.kv.bytes == 4096
    root = plain[0].span_id
    [with_ec] = assemble([*_request(1), _ec(1, parent=root)])
    assert with_ec.kv == without.kv
    assert [f.name for f in with_ec.flags] == [f.name for f in without.flags]
    assert "tcp_fallback" not in {f.name for f in with_ec.flags}
