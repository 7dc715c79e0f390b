"""The join rules (`railtrace.assembly.joins`): which traces sharing a request id join a
request, and which KV-transfer spans count, judged by who sent them."""

from __future__ import annotations

from typing import Any

import pytest

from railtrace.assembly import assemble
from railtrace.assembly.joins import Identity, agree, identity
from railtrace.model import Span

RID = "6f1c2b0e-1111-2222-3333-3a4d5e6f7a8b"
SIDECAR_ID = "0b8e9d5c-b1a2-11f0-8000-000000000001"
ENGINE_ID = f"chatcmpl-{RID}-99ae74c8"
DECODE_IP, PREFILL_IP, ATTACKER = "10.0.1.2", "10.0.1.1", "10.6.6.6"
T0 = 1_790_000_000 * 10**9
MS = 1_000_000


def _span(
    trace: int,
    n: int,
    name: str,
    start: int,
    end: int,
    attrs: dict[str, Any],
    *,
    parent: int | None = None,
    service: str = "",
    peer: str | None = None,
    pod: str | None = None,
) -> Span:
    resource: dict[str, Any] = {"service.name": service}
    if peer:
        resource["railtrace.otlp.peer"] = peer
    if pod:
        resource["k8s.pod.name"] = pod
    return Span(
        trace_id=f"{trace:032x}",
        span_id=f"{(trace << 8) + n:016x}",
        parent_span_id=f"{(trace << 8) + parent:016x}" if parent is not None else None,
        name=name,
        kind=2 if parent is None else 1,
        start_ns=T0 + start * MS,
        end_ns=T0 + end * MS,
        service_name=service,
        attributes=attrs,
        resource=resource,
    )


def _request(trace: int = 1, peers: bool = True) -> list[Span]:
    """A current llm-d P/D request in one trace, each process with its sender address."""
    d = DECODE_IP if peers else None
    p = PREFILL_IP if peers else None
    return [
        _span(trace, 1, "gateway.request", 0, 3000, {"gen_ai.request.id": RID}, service="llm-d-router/epp"),
        _span(
            trace,
            2,
            "forward_request",
            2,
            2999,
            {"llm_d.pd_proxy.request_id": SIDECAR_ID},
            parent=1,
            service="routing-proxy",
            peer=d,
        ),
        _span(
            trace,
            3,
            "prefill",
            2,
            52,
            {"llm_d.pd_proxy.request_id": SIDECAR_ID, "llm_d.pd_proxy.prefill_target": f"{PREFILL_IP}:8000"},
            parent=2,
            service="routing-proxy",
            peer=d,
        ),
        _span(
            trace,
            4,
            "llm_request",
            3,
            50,
            {"gen_ai.request.id": f"chatcmpl-{RID}", "gen_ai.request.max_tokens": 1},
            parent=3,
            service="vllm-prefill",
            peer=p,
        ),
        _span(
            trace,
            5,
            "decode",
            52,
            2999,
            {"llm_d.pd_proxy.request_id": SIDECAR_ID},
            parent=3,
            service="routing-proxy",
            peer=d,
        ),
        _span(
            trace,
            6,
            "llm_request",
            53,
            2998,
            {
                "gen_ai.request.id": f"chatcmpl-{RID}",
                "gen_ai.latency.time_to_first_token": 0.343,
                "gen_ai.usage.completion_tokens": 200,
            },
            parent=5,
            service="vllm-decode",
            peer=d,
        ),
    ]


def _kv(trace: int, transport: str, peer: str | None, op: str = "read", start: int = 60) -> Span:
    return _span(
        trace,
        1,
        "llm_d.kv_transfer",
        start,
        start + 200,
        {
            "llm_d.kv_transfer.request_id": ENGINE_ID,
            "llm_d.kv_transfer.transport": transport,
            "llm_d.kv_transfer.operation": op,
        },
        service="vllm-decode",
        peer=peer,
    )


def _one(spans: list[Span]) -> Any:
    facts = [f for f in assemble(spans) if f.trace_id == f"{1:032x}"]
    assert len(facts) == 1, facts
    return facts[0]


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        (Identity("p1", frozenset()), Identity("p1", frozenset({"10.0.0.1"})), True),
        (
            Identity("p1", frozenset({"10.0.0.1"})),
            Identity("p2", frozenset({"10.0.0.1"})),
            False,
        ),  # names decide
        (Identity(None, frozenset({"10.0.0.1"})), Identity(None, frozenset({"10.0.0.1", "10.0.0.9"})), True),
        (Identity(None, frozenset({"10.0.0.1"})), Identity(None, frozenset({"10.0.0.2"})), False),
        (Identity("p1", frozenset()), Identity(None, frozenset({"10.0.0.2"})), None),
        (Identity(None, frozenset()), Identity(None, frozenset()), None),
    ],
)
def test_agree(a: Identity, b: Identity, want: bool | None) -> None:
    assert agree(a, b) is want


def test_identity_reads_the_pod_name_pod_ip_and_sender() -> None:
    span = _kv(9, "rdma", "10.0.0.5")
    span.resource["k8s.pod.ip"] = "10.0.0.6"
    span.resource["k8s.pod.name"] = "decode-0"
    assert identity(span) == Identity("decode-0", frozenset({"10.0.0.5", "10.0.0.6"}))


def test_kv_span_from_the_decode_engine_counts() -> None:
    facts = _one([*_request(), _kv(2, "rdma", DECODE_IP)])
    assert facts.kv is not None and facts.kv.transport == "rdma"
    assert (
        len(facts.trace_ids) == 2 and "rejected" not in facts.coverage and "unverified" not in facts.coverage
    )


def test_kv_span_from_another_sender_is_rejected_and_reported() -> None:
    facts = _one([*_request(), _kv(2, "rdma", DECODE_IP), _kv(3, "tcp", ATTACKER)])
    assert facts.kv is not None and facts.kv.transport == "rdma"
    assert f"{3:032x}" not in facts.trace_ids
    assert any(ATTACKER in note and f"{3:032x}" in note for note in facts.coverage["rejected"])


def test_forged_kv_span_alone_adds_no_kv_facts() -> None:
    facts = _one([*_request(), _kv(3, "tcp", ATTACKER)])
    assert facts.kv is None and facts.trace_ids == [f"{1:032x}"]


def test_forged_kv_span_inside_the_request_trace_is_not_counted() -> None:
    forged = _kv(1, "tcp", ATTACKER)
    forged.span_id = "00000000000001ff"
    facts = _one([*_request(), _kv(2, "rdma", DECODE_IP), forged])
    assert facts.kv is not None and facts.kv.transport == "rdma"
    assert any("not the engine" in note for note in facts.coverage["rejected"])


def test_push_mode_kv_span_comes_from_the_prefill_engine() -> None:
    facts = _one([*_request(), _kv(2, "rdma", PREFILL_IP, op="write")])
    assert facts.kv is not None and "rejected" not in facts.coverage
    facts = _one([*_request(), _kv(2, "tcp", DECODE_IP, op="write")])
    assert facts.kv is None


def test_unknown_identity_joins_unverified_and_never_overrides_a_verified_one() -> None:
    facts = _one([*_request(peers=False), _kv(2, "tcp", None)])
    assert facts.kv is not None and facts.kv.transport == "tcp"  # nothing to check against: counted
    assert any(f"{2:032x}" in note for note in facts.coverage["unverified"])
    facts = _one([*_request(), _kv(2, "rdma", DECODE_IP), _kv(3, "tcp", None)])
    assert facts.kv is not None and facts.kv.transport == "rdma"
    assert any("unverified beside a verified one" in note for note in facts.coverage["rejected"])


def test_forged_earlier_gateway_never_becomes_the_primary_trace() -> None:
    forged = _span(
        3,
        1,
        "gateway.request",
        -1000,
        5000,
        {"gen_ai.request.id": RID},
        service="llm-d-router/epp",
        peer=ATTACKER,
    )
    facts = _one([*_request(), forged])
    assert facts.trace_id == f"{1:032x}" and facts.trace_ids == [f"{1:032x}"]
    assert any(f"{3:032x}" in note for note in facts.coverage["rejected"])


def test_two_whole_requests_with_one_id_stay_two() -> None:
    forged = _request(trace=3)
    for span in forged:
        span.resource["railtrace.otlp.peer"] = ATTACKER
    facts = assemble([*_request(), *forged])
    assert sorted(f.trace_ids for f in facts) == [[f"{1:032x}"], [f"{3:032x}"]]


def test_junk_spans_that_only_carry_the_id_join_nothing() -> None:
    junk = [_span(10 + i, 1, "junk", 0, 1, {"gen_ai.request.id": RID}, peer=ATTACKER) for i in range(40)]
    facts = _one([*_request(), _kv(2, "rdma", DECODE_IP), *junk])
    assert sorted(facts.trace_ids) == [f"{1:032x}", f"{2:032x}"] and facts.kv.transport == "rdma"


def _orphaned(peers: bool = True, decode_peer: str = DECODE_IP) -> list[Span]:
    """llm-d <= v0.9: the sidecar did not inject, each engine span is a root of its own."""
    spans = _request(peers=peers)
    for i, trace in ((3, 4), (5, 6)):
        engine = spans[i]
        spans[i] = _span(
            trace,
            1,
            "llm_request",
            (engine.start_ns - T0) // MS,
            (engine.end_ns - T0) // MS,
            engine.attributes,
            service=engine.service_name,
            peer=engine.resource.get("railtrace.otlp.peer"),
        )
    if peers:
        spans[5].resource["railtrace.otlp.peer"] = decode_peer
    return spans


def test_orphan_engine_traces_join_when_their_sender_is_the_pods() -> None:
    facts = _one(_orphaned())
    assert len(facts.trace_ids) == 3 and facts.decode.span_id and facts.prefill.span_id
    assert "rejected" not in facts.coverage and "unverified" not in facts.coverage


def test_orphan_decode_engine_from_another_sender_is_rejected() -> None:
    facts = _one(_orphaned(decode_peer=ATTACKER))
    assert f"{6:032x}" not in facts.trace_ids
    assert any(f"{6:032x}" in note for note in facts.coverage["rejected"])


def test_orphan_engines_without_identity_join_unverified() -> None:
    facts = _one(_orphaned(peers=False))
    assert len(facts.trace_ids) == 3 and len(facts.coverage["unverified"]) == 2


def test_second_decode_engine_is_a_contradicting_candidate() -> None:
    spans = _orphaned()
    extra = _span(
        7, 1, "llm_request", 60, 2990, dict(spans[5].attributes), service="vllm-decode", peer=DECODE_IP
    )
    facts = _one([*spans, extra])
    assert f"{7:032x}" not in facts.trace_ids
    assert any(f"{7:032x}" in note for note in facts.coverage["rejected"])


def test_v0_8_epp_root_joins_when_its_prefill_address_is_the_sidecars() -> None:
    spans = _request()
    epp = [
        _span(
            9, 1, "gateway.request", -5, 3001, {"gen_ai.request.id": RID}, service="llm-d-inference-scheduler"
        ),
        _span(
            9,
            2,
            "prepare_disaggregation",
            0,
            1,
            {"gen_ai.request.id": RID, "llm_d.epp.pd.prefill_pod_address": PREFILL_IP},
            parent=1,
            service="llm-d-inference-scheduler",
        ),
    ]
    sidecar = [s for s in spans if s.canonical_name != "gateway.request" and s.name != "gateway.request"]
    sidecar[0].parent_span_id = None  # <= v0.8: the sidecar started its own trace
    sidecar[0].attributes["x"] = 1
    for s in sidecar:
        s.attributes.setdefault("http.request.header.x-request-id", [RID])
    facts = assemble([*epp, *sidecar])
    assert len(facts) == 1 and facts[0].trace_id == f"{9:032x}"
    forged = [
        _span(8, 1, "gateway.request", -50, 4000, {"gen_ai.request.id": RID}, service="x", peer=ATTACKER),
        _span(
            8,
            2,
            "prepare_disaggregation",
            0,
            1,
            {"gen_ai.request.id": RID, "llm_d.epp.pd.prefill_pod_address": ATTACKER},
            parent=1,
        ),
    ]
    facts = [f for f in assemble([*epp, *sidecar, *forged]) if f.coverage.get("traces", 0) > 1]
    assert len(facts) == 1 and facts[0].trace_id == f"{9:032x}"
    assert any(f"{8:032x}" in note for note in facts[0].coverage["rejected"])


def test_decode_only_forged_earlier_engine_does_not_displace_the_request() -> None:
    """llm-d's decode-only recipe: the decode engine's root and its KV span, nothing else."""
    engine = _request()[5]
    engine.parent_span_id = None
    forged = _span(
        3, 1, "llm_request", 0, 4000, dict(engine.attributes), service="vllm-decode", peer=ATTACKER
    )
    facts = assemble([engine, _kv(2, "rdma", DECODE_IP), forged])
    mine = [f for f in facts if engine.trace_id in f.trace_ids]
    assert len(mine) == 1 and mine[0].trace_id == engine.trace_id
    assert mine[0].kv is not None and mine[0].kv.transport == "rdma" and f"{3:032x}" not in mine[0].trace_ids


def test_a_key_held_by_too_many_traces_stitches_the_first_to_arrive() -> None:
    """The assembler's stitching (before assembly's rules): junk sent later cannot undo it."""
    from railtrace.scheduling.grouping import MAX_KEY_FANOUT, excess_notes, group_traces

    legit = ["a1", "a2", "a3"]
    junk = [f"z{i:02d}" for i in range(MAX_KEY_FANOUT + 1)]
    pairs = [("k", t, n) for n, t in enumerate([*legit, *junk])]  # in order of first arrival
    keys = {"a1": {"k"}}
    (group,) = group_traces({"a1": 0}, keys, pairs)
    assert set(legit) <= group and len(group) == MAX_KEY_FANOUT
    notes = excess_notes(keys, pairs)
    assert "4 later traces" in notes["a1"] and "z32" not in notes


# -- Claimed identities: who vouches for k8s.* (`railtrace.otlp.claims`, set at ingest) -------


def _claiming(span: Span, claims: str, pod: str | None = None, pod_ip: str | None = None) -> Span:
    span.resource["railtrace.otlp.claims"] = claims
    if pod:
        span.resource["k8s.pod.name"] = pod
    if pod_ip:
        span.resource["k8s.pod.ip"] = pod_ip
    return span


def test_identity_believes_a_trusted_collectors_claims_and_not_its_own_address() -> None:
    span = _claiming(_kv(9, "rdma", "10.8.0.4"), "collector", "decode-0", DECODE_IP)
    assert identity(span) == Identity("decode-0", frozenset({DECODE_IP}))
    # No pod found by the collector: no identity (its own address is every pod's sender).
    assert not identity(_claiming(_kv(9, "rdma", "10.8.0.4"), "collector"))


def test_identity_believes_only_the_address_of_any_other_sender() -> None:
    forged = identity(_claiming(_kv(9, "tcp", ATTACKER), "sender", "decode-0", DECODE_IP))
    assert (forged.pod, forged.ips) == (None, frozenset({ATTACKER}))
    assert (
        "claims pod decode-0" in forged.describe() and f"claims k8s.pod.ip {DECODE_IP}" in forged.describe()
    )
    honest = identity(_claiming(_kv(9, "rdma", DECODE_IP), "sender", "decode-0", DECODE_IP))
    assert honest.ips == frozenset({DECODE_IP}) and "k8s.pod.ip" not in honest.describe()


def _collector_request() -> list[Span]:
    """The request as a trusted collector forwards it: k8s.* on every pod's spans, the
    collector's address as the sender."""
    spans = _request()
    for span in spans:
        ip = span.resource.get("railtrace.otlp.peer")
        if ip:
            pod = "decode-0" if ip == DECODE_IP else "prefill-0"
            _claiming(span, "collector", pod, ip)
            span.resource["railtrace.otlp.peer"] = "10.8.0.4"
    return spans


@pytest.mark.parametrize(
    ("pod", "pod_ip", "peer", "claims"),
    [
        ("decode-0", None, ATTACKER, "sender"),  # the decode pod's name from another address
        (None, DECODE_IP, ATTACKER, "sender"),  # its address, claimed
        (None, None, "10.8.0.4", "collector"),  # through the collector, which found no pod
    ],
)
def test_forged_kv_span_claiming_the_decode_pod_does_not_count(
    pod: str | None, pod_ip: str | None, peer: str, claims: str
) -> None:
    real = _claiming(_kv(2, "rdma", "10.8.0.4"), "collector", "decode-0", DECODE_IP)
    forged = _claiming(_kv(3, "tcp", peer), claims, pod, pod_ip)
    facts = _one([*_collector_request(), real, forged])
    assert facts.kv is not None and facts.kv.transport == "rdma"
    assert f"{3:032x}" not in facts.trace_ids
    assert any(f"{3:032x}" in note for note in facts.coverage["rejected"])


def test_a_verified_kv_hop_stays_with_its_request_beside_a_forged_one() -> None:
    """A forger's whole request with the victim's ids and no identity of its own: the KV span,
    verified for the victim only, joins the victim (it fitted both and was dropped before)."""
    forged = [
        _span(3, 1, "gateway.request", 0, 3000, {"gen_ai.request.id": RID}, service="x"),
        _span(
            3,
            2,
            "llm_request",
            1,
            2900,
            {"gen_ai.request.id": f"chatcmpl-{RID}", "gen_ai.usage.completion_tokens": 200},
            parent=1,
            service="vllm-decode",
        ),
    ]
    facts = assemble([*_request(), _kv(2, "tcp", DECODE_IP), *forged])
    victim = next(f for f in facts if f.trace_id == f"{1:032x}")
    other = next(f for f in facts if f.trace_id == f"{3:032x}")
    assert victim.kv is not None and victim.kv.transport == "tcp" and f"{2:032x}" in victim.trace_ids
    assert other.kv is None
    assert any("verified for another request" in note for note in other.coverage["rejected"])
