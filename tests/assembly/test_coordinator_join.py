"""The coordinator's phases (docs/normalisation.md §10; docs/reliability.md §11): an untraced
client's request arrives as a prefill phase and a decode phase, each its own trace with its
own EPP root, sharing only `x-request-id`. They form one request when a KV span the decode
engine sent names the prefill engine as its peer; a phase from another sender stays out."""

from __future__ import annotations

from typing import Any

from railtrace.assembly import assemble
from railtrace.model import RequestFacts, Span

RID = "7a2c3d4e-1111-2222-3333-444455556666"
PUBLIC = f"chatcmpl-{RID}"
PREFILL_IP, DECODE_IP, ATTACKER, EPP_IP = "10.0.1.1", "10.0.1.2", "10.6.6.6", "10.0.9.9"
T0 = 1_790_000_000 * 10**9
MS = 1_000_000


def _span(
    trace: int,
    n: int,
    name: str,
    start: float,
    end: float,
    attrs: dict[str, Any],
    *,
    parent: int | None = None,
    service: str,
    peer: str | None,
    kind: int = 1,
) -> Span:
    resource: dict[str, Any] = {"service.name": service}
    if peer:
        resource["railtrace.otlp.peer"] = peer
    return Span(
        trace_id=f"{trace:032x}",
        span_id=f"{(trace << 8) + n:016x}",
        parent_span_id=f"{(trace << 8) + parent:016x}" if parent is not None else None,
        name=name,
        kind=kind,
        start_ns=T0 + int(start * MS),
        end_ns=T0 + int(end * MS),
        service_name=service,
        attributes=attrs,
        resource=resource,
    )


def _phase(
    trace: int,
    leg: str,
    start: float,
    *,
    engine_peer: str | None,
    epp_peer: str | None = EPP_IP,
    **extra: Any,
) -> list[Span]:
    """One phase as router HEAD and vLLM trace it: the EPP's root, its orchestration and the
    profile it ran with the pick, and the engine's `llm_request` under the EPP's injected
    context (no sidecar)."""
    rid = {"gen_ai.request.id": RID}
    epp = {"service": "llm-d-router/epp", "peer": epp_peer}
    prefill = leg == "prefill"
    length = 50 if prefill else 3000
    engine_attrs: dict[str, Any] = {
        "gen_ai.request.id": PUBLIC,
        "gen_ai.request.max_tokens": 1 if prefill else 512,
        "gen_ai.usage.completion_tokens": 1 if prefill else 200,
        "gen_ai.latency.time_to_first_token": 0.045 if prefill else 0.343,
        "gen_ai.latency.time_in_queue": 0.001 if prefill else 0.322,
        "gen_ai.latency.e2e": 0.047 if prefill else 2.946,
        **extra,
    }
    return [
        _span(trace, 1, "request", start, start + length + 2, {}, kind=2, **epp),  # type: ignore[arg-type]
        _span(trace, 2, "request_orchestration", start + 0.1, start + 0.4, rid, parent=1, kind=2, **epp),  # type: ignore[arg-type]
        _span(
            trace,
            3,
            "run_scheduler_profile",
            start + 0.13,
            start + 0.2,
            {"llm_d.epp.scheduling.profile.name": leg},
            parent=2,
            **epp,  # type: ignore[arg-type]
        ),
        _span(
            trace,
            4,
            "pick_endpoints",
            start + 0.15,
            start + 0.19,
            {
                **rid,
                "llm_d.epp.picker.top_endpoints": [f"llm-d/{leg}-pod-rank-0"],
                "llm_d.epp.picker.top_scores": [1.0],
            },
            parent=3,
            **epp,  # type: ignore[arg-type]
        ),
        _span(
            trace,
            5,
            "llm_request",
            start + 1,
            start + 1 + length - 3,
            engine_attrs,
            parent=1,
            kind=2,
            service=f"vllm-{leg}",
            peer=engine_peer,
        ),
    ]


def _kv(
    trace: int, start: float, *, peer: str | None, remote: str | None, transport: str = "rdma"
) -> list[Span]:
    attrs: dict[str, Any] = {
        "llm_d.kv_transfer.request_id": f"{PUBLIC}-99ae74c8",
        "llm_d.kv_transfer.transport": transport,
        "llm_d.kv_transfer.operation": "read",
        "llm_d.kv_transfer.bytes": 268_435_456,
    }
    if remote:
        attrs["llm_d.kv_transfer.remote.host"] = remote
    return [_span(trace, 1, "llm_d.kv_transfer", start, start + 200, attrs, service="vllm-decode", peer=peer)]


def _request(gap_ms: float = 5.0, peers: bool = True, kv_remote: str | None = PREFILL_IP) -> list[Span]:
    p, d = (PREFILL_IP, DECODE_IP) if peers else (None, None)
    spans = _phase(1, "prefill", 0, engine_peer=p, epp_peer=EPP_IP if peers else None)
    spans += _phase(2, "decode", 52 + gap_ms, engine_peer=d, epp_peer=EPP_IP if peers else None)
    spans += _kv(3, 60 + gap_ms, peer=d, remote=kv_remote)
    return spans


def _by_trace(facts: list[RequestFacts], trace: int) -> RequestFacts:
    (found,) = [f for f in facts if f"{trace:032x}" in f.trace_ids]
    return found


def test_two_phases_linked_by_the_kv_span_are_one_request() -> None:
    facts = assemble(_request())
    assert len(facts) == 1
    (req,) = facts
    assert req.trace_id == f"{1:032x}"  # the prefill phase's root starts first
    assert sorted(req.trace_ids) == [f"{t:032x}" for t in (1, 2, 3)]
    assert req.prefill.span_id == f"{(1 << 8) + 5:016x}" and req.decode.span_id == f"{(2 << 8) + 5:016x}"
    assert {p.profile for p in req.picks} == {"prefill", "decode"}
    assert req.kv is not None and req.kv.transport == "rdma"
    assert not req.coverage.get("rejected") and not req.coverage.get("unverified")
    assert not [f for f in req.flags if f.name == "broken_trace"]
    # End to end and TTFT on the EPP's clock across both phases (one process sent both roots).
    assert req.e2e_s is not None and req.e2e_s > 3.0
    assert "coordinator phases, one process" in req.timing_sources["e2e"]
    assert req.ttft_s is not None and req.ttft_s > 0.343 + 0.05


def test_the_request_is_the_same_whatever_the_gap_between_phases() -> None:
    (req,) = assemble(_request(gap_ms=180_000.0))  # three minutes apart
    assert req.prefill.span_id and req.decode.span_id and req.kv is not None
    assert req.e2e_s is not None and req.e2e_s > 180.0


def test_a_third_decode_phase_from_another_sender_stays_out() -> None:
    spans = _request() + _phase(4, "decode", 60, engine_peer=ATTACKER)
    facts = assemble(spans)
    real = _by_trace(facts, 1)
    assert f"{2:032x}" in real.trace_ids and f"{4:032x}" not in real.trace_ids
    assert any(f"trace {4:032x}" in note and "decode phase" in note for note in real.coverage["rejected"])
    forged = _by_trace(facts, 4)
    assert forged.kv is None and forged.prefill.span_id is None


def test_a_forged_decode_phase_with_its_own_kv_span_leaves_both_out() -> None:
    """Equal standing: neither decode phase joins (the prefill phase's request lists both)."""
    spans = (
        _request()
        + _phase(4, "decode", 60, engine_peer=ATTACKER)
        + _kv(5, 70, peer=ATTACKER, remote=PREFILL_IP)
    )
    facts = assemble(spans)
    prefill = _by_trace(facts, 1)
    assert prefill.decode.span_id is None
    assert any("2 phases of the other leg" in note for note in prefill.coverage["rejected"])
    real = _by_trace(facts, 2)
    assert real.kv is not None and f"{1:032x}" not in real.trace_ids


def test_a_kv_span_naming_another_peer_contradicts_the_pair() -> None:
    facts = assemble(_request(kv_remote=ATTACKER))
    assert len(facts) == 2
    decode = _by_trace(facts, 2)
    assert decode.prefill.span_id is None
    assert any("not joined as the coordinator's" in note for note in decode.coverage["rejected"])


def test_phases_with_identities_and_no_kv_link_stay_two_requests() -> None:
    """Both engines have an address and nothing links them: a forger's prefill phase would
    otherwise add a prefill leg to any request whose id it knows."""
    spans = _phase(1, "prefill", 0, engine_peer=ATTACKER) + _phase(2, "decode", 57, engine_peer=DECODE_IP)
    facts = assemble(spans)
    assert len(facts) == 2
    decode = _by_trace(facts, 2)
    assert decode.prefill.span_id is None
    assert any("no KV span" in note for note in decode.coverage["rejected"])


def test_phases_without_identity_join_unverified() -> None:
    facts = assemble(_request(peers=False, kv_remote=None))
    (req,) = facts
    assert req.prefill.span_id and req.decode.span_id
    assert any("coordinator's prefill phase" in note for note in req.coverage["unverified"])


def test_a_phase_whose_profile_names_the_other_leg_is_no_phase() -> None:
    spans = _request()
    for span in spans:
        if span.trace_id == f"{1:032x}" and span.name == "run_scheduler_profile":
            span.attributes["llm_d.epp.scheduling.profile.name"] = "decode"
    assert len(assemble(spans)) == 2


def test_the_epp_profile_header_names_an_unlabelled_engines_leg() -> None:
    """An engine whose own span does not tell its leg (no role in its service name, no
    max_tokens) takes the phase a recorded `EPP-Profile` header names; unknown
    `llm_d.coordinator.*` attributes change nothing."""
    spans = _request()
    for span in spans:
        if span.name == "llm_request" and span.trace_id == f"{1:032x}":
            span.service_name = "vllm"
            span.resource["service.name"] = "vllm"
            for key in ("gen_ai.request.max_tokens", "gen_ai.usage.completion_tokens"):
                del span.attributes[key]
        if span.name == "run_scheduler_profile" and span.trace_id == f"{1:032x}":
            del span.attributes["llm_d.epp.scheduling.profile.name"]
        if span.name == "request" and span.trace_id == f"{1:032x}":
            span.attributes["http.request.header.epp-profile"] = ["prefill"]
            span.attributes["llm_d.coordinator.phase"] = "prefill"
    (req,) = assemble(spans)
    assert req.prefill.span_id == f"{(1 << 8) + 5:016x}"


def test_a_traced_clients_phases_in_one_trace_are_one_request() -> None:
    """A traced client's `traceparent` reaches both phases (the coordinator forwards it,
    pipeline/context.go): both EPP roots are its span's children in one trace."""
    client = _span(1, 0xF0, "client", -1, 3100, {}, service="loadgen", peer=None, kind=3)
    spans = [client]
    for leg, start, offset in (("prefill", 0.0, 0), ("decode", 57.0, 0x10)):
        for span in _phase(1, leg, start, engine_peer=PREFILL_IP if leg == "prefill" else DECODE_IP):
            n = int(span.span_id, 16) - (1 << 8) + offset
            span.span_id = f"{(1 << 8) + n:016x}"
            if span.parent_span_id is None:
                span.parent_span_id = client.span_id
            else:
                span.parent_span_id = f"{int(span.parent_span_id, 16) + offset:016x}"
            spans.append(span)
    spans += _kv(3, 65, peer=DECODE_IP, remote=PREFILL_IP)
    (req,) = assemble(spans)
    assert req.prefill.span_id and req.decode.span_id and req.kv is not None
    assert req.e2e_s is not None and req.e2e_s > 3.0
