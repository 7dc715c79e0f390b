"""Incidents as the API answers them: scope, counts, seconds, evidence and a runbook's next step."""

from __future__ import annotations

from collections import Counter
from typing import Any

from railtrace.incidents.group import TRACE_IDS_IN_LIST, Incident
from railtrace.model import rfc3339
from railtrace_tracing.semconv import FlagName

RUNBOOKS = "docs/runbooks/LLMDTracingIncidentCostly.md"


def scope_of(inc: Incident) -> dict[str, Any]:
    """The part, by kind, with the pods (and legs) its flagged requests went through."""
    kind, *key = inc.part
    scope: dict[str, Any] = {"kind": kind}
    if kind == "nic":
        scope.update(node=key[0], nic=key[1])
    elif kind in ("pod", "node", "rail"):
        scope[kind] = key[0]
    elif kind == "pool":
        scope.update(role=key[0], pool=key[1])
    elif kind == "pool_pair":
        scope.update(prefill_pool=key[0] or None, decode_pool=key[1] or None)
    elif kind == "request":
        scope["trace_id"] = key[0]
    pods: Counter[str] = Counter()
    nodes: Counter[str] = Counter()
    for r in inc.records:
        for role, leg in r.legs.items():
            if inc.roles and role not in inc.roles:
                continue
            if _leg_in(inc, leg):
                if leg.get("pod"):
                    pods[str(leg["pod"])] += 1
                if leg.get("node"):
                    nodes[str(leg["node"])] += 1
    scope["pods"] = sorted(pods)[:50]
    scope["nodes"] = sorted(nodes)[:50]
    scope["legs"] = sorted(inc.roles) if inc.roles else ["prefill", "decode"]
    return scope


def _leg_in(inc: Incident, leg: dict[str, Any]) -> bool:
    kind, *key = inc.part
    if kind == "nic":
        return (leg.get("node"), leg.get("nic")) == (key[0], key[1])
    if kind in ("pod", "node", "rail"):
        return bool(leg.get(kind) == key[0])
    return True  # a pool's legs are chosen by role (`inc.roles`)


def name_of(scope: dict[str, Any]) -> str:
    kind = scope["kind"]
    if kind == "nic":
        return f"NIC {scope['nic']} on node {scope['node']}"
    if kind == "pool":
        return f"{scope['role']} pool {scope['pool']}"
    if kind == "pool_pair":
        return f"pool pair {scope.get('prefill_pool')} → {scope.get('decode_pool')}"
    if kind == "request":
        return f"request {scope['trace_id']}"
    return f"{kind} {scope[kind]}"


def next_step(cause: str, scope: dict[str, Any]) -> str:
    """The one step a runbook would give first for this cause at this scope."""
    where = name_of(scope)
    pods = ", ".join(scope.get("pods") or []) or "its pods"
    nic = scope.get("nic")
    if cause == FlagName.TCP_FALLBACK:
        dev = (
            f" and that {nic} is up (ibv_devinfo: PORT_ACTIVE)"
            if nic
            else " and that the RDMA devices are up"
        )
        return (
            f"UCX on {pods} ({where}) chose TCP: check UCX_NET_DEVICES and UCX_TLS in the pod{dev}; "
            "docs/runbooks/LLMDKVTransferSilentTCPFallback.md"
        )
    if cause == FlagName.CROSS_RAIL:
        return (
            f"KV bytes of {pods} ({where}) left the GPU's rail: pin UCX_NET_DEVICES to the GPU's own NIC "
            "and drop the second NIC from the claim; docs/runbooks/LLMDKVTransferCrossRailRatioHigh.md"
        )
    if cause == FlagName.GPU_NIC_MISMATCH:
        return (
            f"{where}: the NIC used is not the GPU's; add a pcieRoot (or NUMA) match constraint to the "
            "ResourceClaim(Template) and recreate the pods; docs/runbooks/LLMDKVTransferGPUNICMismatch.md"
        )
    if cause == FlagName.TOPOLOGY_BLIND_PAIRING:
        return (
            f"{where}: the router pairs prefill and decode blind to topology; enable a topology-aware "
            "scorer in the EPP's decode profile; docs/runbooks/LLMDTopologyBlindPairingRateHigh.md"
        )
    if cause == FlagName.KV_TRANSFER_FAILED:
        return (
            f"{where}: KV transfers fail; read the NIXL/UCX log of {pods}; "
            "docs/runbooks/LLMDKVTransferFailures.md"
        )
    if cause == FlagName.SLOW_KV_TRANSFER:
        return (
            f"{where}: KV transfers far below the path's bandwidth; check the link rate and port "
            f"errors of {nic or 'the NICs'}"
        )
    if cause == FlagName.BROKEN_TRACE:
        return (
            f"{where}: a traced hop lost its link to the request; check the exporters and sidecar release of "
            f"{pods}; docs/runbooks/LLMDTracingBrokenTracesRising.md"
        )
    return f"{where}: see {RUNBOOKS}"


def incident_dict(inc: Incident, full: bool = False) -> dict[str, Any]:
    """One incident as `GET /api/v1/incidents` lists it (`full`: every trace id)."""
    scope = scope_of(inc)
    ttft, kv, gpu = inc.seconds()
    first, last = inc.records[0].start_ns, inc.records[-1].start_ns
    span_s = max(3600.0, ((inc.ended_ns or last) - first) / 1e9)
    ids = [r.trace_id for r in inc.records]
    sample = inc.records[0].flags.get(inc.cause, "")[:600]
    evidence = [
        f"{inc.flagged} of {inc.through} requests through {name_of(scope)} in the window carried "
        f"{inc.cause} ({inc.flagged / max(1, inc.through):.0%})"
        if scope["kind"] != "request"
        else f"no shared part explains this {inc.cause}: a single request",
        f"first flag: {sample}" if sample else "",
    ]
    if not inc.open and inc.ended_ns is not None:
        evidence.append(f"ended: the part's requests were healthy again from {rfc3339(inc.ended_ns)}")
    return {
        "id": inc.id,
        "cause": inc.cause,
        "scope": scope,
        "open": inc.open,
        "first_seen": rfc3339(first),
        "last_seen": rfc3339(last),
        "ended": rfc3339(inc.ended_ns) if inc.ended_ns is not None else None,
        "requests": len(ids),
        "trace_ids": ids if full else ids[:TRACE_IDS_IN_LIST],
        "trace_ids_truncated": not full and len(ids) > TRACE_IDS_IN_LIST,
        "requests_url": f"/api/v1/incidents/{inc.id}",
        "seconds_lost": round(ttft, 6),
        "kv_seconds_lost": round(kv, 6),
        "gpu_hours_lost": round(gpu / 3600, 9),
        "per_day": {
            "seconds_lost": round(ttft * 86400 / span_s, 6),
            "gpu_hours_lost": round(gpu / 3600 * 86400 / span_s, 9),
        },
        "evidence": [e for e in evidence if e],
        "next_step": next_step(inc.cause, scope),
    }
