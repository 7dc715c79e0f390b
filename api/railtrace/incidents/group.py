"""Flagged requests grouped into incidents by the smallest shared part that explains them.

An operator fixes a NIC, a pod's UCX settings, a node, a pool's claims or the router's pairing,
not requests. For each flag (the incident's `cause`), every part a flagged request went through
(its legs' NICs, pods, nodes and rails, and its prefill/decode pool pair) is a candidate; a part
*explains* the cause when at least `MIN_REQUESTS` of its requests carry the flag and they are at
least `share` of all its requests in the window (healthy requests through a part argue against
it). Explaining parts are taken smallest kind first (NIC, pod, node, pool pair, rail), a part
whose flagged requests the parts already taken cover adding nothing; then a larger part that is
broken as a whole (`WHOLE_SHARE` of its requests flagged) and holds two or more of the parts
taken replaces them. A flagged request no part explains is an incident of its own, never a
guessed group. A part's incident ends when `HEALTHY_RUN` of its requests in a row are healthy;
a later flag opens a new one. docs/incidents.md says why each rule is what it is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from railtrace_tracing.semconv import FlagName

MIN_REQUESTS = 2
# The share of a part's requests that must carry the flag for the part to explain it. Pairing
# is a router decision taken per request among candidates: a blind pool pair is flagged only
# where a nearer candidate happened to score alike, so a small share already stands out
# (healthy pools have none).
SHARE: Mapping[str, float] = {FlagName.TOPOLOGY_BLIND_PAIRING.value: 0.05}
DEFAULT_SHARE = 0.5
WHOLE_SHARE = 0.9
COVERED = 0.9
HEALTHY_RUN = 3
# Part kinds, smallest first (the order ties are broken in); the kinds each cause can be explained by.
KINDS = ("nic", "pod", "node", "pool", "pool_pair", "rail")
# One pool (a role's workload) is a candidate only for a broken trace: an exporter or a release
# belongs to one pool's processes, while a KV path has both ends.
PATH_KINDS = ("nic", "pod", "node", "pool_pair", "rail")
KINDS_FOR: Mapping[str, tuple[str, ...]] = {
    FlagName.TOPOLOGY_BLIND_PAIRING.value: ("pool_pair",),
    FlagName.BROKEN_TRACE.value: ("pod", "node", "pool", "pool_pair"),
}
# One cause per request for its seconds, so that sums over causes count a second once.
PRIMARY = (
    FlagName.KV_TRANSFER_FAILED.value,
    FlagName.TCP_FALLBACK.value,
    FlagName.GPU_NIC_MISMATCH.value,
    FlagName.CROSS_RAIL.value,
    FlagName.SLOW_KV_TRANSFER.value,
    FlagName.TOPOLOGY_BLIND_PAIRING.value,
    FlagName.BROKEN_TRACE.value,
)
TRACE_IDS_IN_LIST = 20

Part = tuple[str, ...]  # (kind, *key)


@dataclass(slots=True)
class Record:
    """What grouping needs of one stored request summary."""

    trace_id: str
    start_ns: int
    flags: dict[str, str]  # name -> evidence
    legs: dict[str, dict[str, str | None]]  # prefill/decode -> pod, node, nic, rail
    pools: tuple[str | None, str | None]
    side: str | None = None
    ttft_s_lost: float = 0.0
    kv_s_lost: float = 0.0
    gpu_s_lost: float = 0.0
    recipe: str | None = None

    @property
    def primary(self) -> str | None:
        return next((c for c in PRIMARY if c in self.flags), next(iter(sorted(self.flags)), None))

    def parts(self, kinds: Iterable[str]) -> list[tuple[Part, str | None]]:
        """The parts this request went through, each with the leg it belongs to."""
        out: list[tuple[Part, str | None]] = []
        for kind in kinds:
            if kind == "pool":
                for role, pool in zip(("prefill", "decode"), self.pools, strict=True):
                    if pool:
                        out.append((("pool", role, pool), role))
                continue
            if kind == "pool_pair":
                if self.pools[0] or self.pools[1]:
                    out.append((("pool_pair", self.pools[0] or "", self.pools[1] or ""), None))
                continue
            for role in ("prefill", "decode"):
                leg = self.legs.get(role) or {}
                node, pod, nic, rail = leg.get("node"), leg.get("pod"), leg.get("nic"), leg.get("rail")
                part: Part | None = None
                if kind == "nic" and node and nic:
                    part = ("nic", node, nic)
                elif kind == "pod" and pod:
                    part = ("pod", pod)
                elif kind == "node" and node:
                    part = ("node", node)
                elif kind == "rail" and rail:
                    part = ("rail", rail)
                if part is not None and all(p != part for p, _ in out):
                    out.append((part, role))
        return out


def record_of(summary: Mapping[str, Any], pool_of: Any = None) -> Record:
    """A stored summary (its JSON as a dict) as grouping reads it; `pool_of(pod)` names a pod's
    pool (`incidents.pools.pool_name`)."""
    legs = {
        role: {k: (summary.get(role) or {}).get(k) for k in ("pod", "node", "nic", "rail")}
        for role in ("prefill", "decode")
    }
    kv = summary.get("kv_transfer") or {}
    if kv.get("source"):  # the P2P source the cache travelled from stands in for prefill
        legs["prefill"] = {k: kv["source"].get(k) for k in ("pod", "node", "nic", "rail")}
    cost = summary.get("cost") or {}
    pools = tuple((pool_of or _default_pool)(legs[r]["pod"]) for r in ("prefill", "decode"))
    return Record(
        trace_id=str(summary.get("trace_id")),
        start_ns=int(summary.get("_start_ns") or 0),
        flags={str(f.get("name")): str(f.get("evidence") or "") for f in summary.get("flags") or []},
        legs=legs,
        pools=(pools[0], pools[1]),
        # NIXL pulls on decode: the side of a transfer whose cost names none.
        side=cost.get("side") or "decode",
        ttft_s_lost=float(cost.get("ttft_s_lost") or 0.0),
        kv_s_lost=float(cost.get("kv_s_lost") or 0.0),
        gpu_s_lost=float(cost.get("gpu_s_lost") or 0.0),
        recipe=(summary.get("coverage") or {}).get("recipe"),
    )


def _default_pool(pod: str | None) -> str | None:
    """A pod's workload from its name: a Deployment's `<name>-<template hash>-<5>`, a
    StatefulSet's `<name>-<ordinal>`, or the name less its last `-` part."""
    if not pod:
        return None
    parts = pod.split("-")
    if len(parts) >= 3 and len(parts[-1]) == 5 and 8 <= len(parts[-2]) <= 10:
        return "-".join(parts[:-2])
    return "-".join(parts[:-1]) if len(parts) > 1 else pod


@dataclass(slots=True)
class Incident:
    cause: str
    part: Part
    records: list[Record]  # flagged with the cause, in start order
    through: int  # requests through the part in the window
    flagged: int  # of which flagged with the cause
    open: bool = True
    ended_ns: int | None = None
    roles: set[str] = field(default_factory=set)

    @property
    def id(self) -> str:
        seed = "|".join([self.cause, *self.part, self.records[0].trace_id])
        return hashlib.blake2b(seed.encode(), digest_size=8).hexdigest()

    def seconds(self) -> tuple[float, float, float]:
        """TTFT and KV seconds, GPU-seconds, of the requests whose primary cause this is."""
        own = [r for r in self.records if r.primary == self.cause]
        return (
            sum(r.ttft_s_lost for r in own),
            sum(r.kv_s_lost for r in own),
            sum(r.gpu_s_lost for r in own),
        )


def group(records: Sequence[Record], causes: Iterable[str] | None = None) -> list[Incident]:
    """The incidents of these records (in any order), every cause or those given."""
    ordered = sorted(records, key=lambda r: (r.start_ns, r.trace_id))
    wanted = set(causes) if causes is not None else {c for r in ordered for c in r.flags}
    out: list[Incident] = []
    for cause in sorted(wanted):
        out += _group_cause(ordered, cause)
    return out


def _group_cause(ordered: Sequence[Record], cause: str) -> list[Incident]:
    kinds = KINDS_FOR.get(cause, PATH_KINDS)
    share = SHARE.get(cause, DEFAULT_SHARE)
    through: dict[Part, list[Record]] = {}
    roles: dict[Part, set[str]] = {}
    for r in ordered:
        for part, role in r.parts(kinds):
            through.setdefault(part, []).append(r)
            if role:
                roles.setdefault(part, set()).add(role)
    stats: dict[Part, tuple[int, int, set[str]]] = {}
    for part, rs in through.items():
        ids = {r.trace_id for r in rs if cause in r.flags}
        if len(ids) >= MIN_REQUESTS and len(ids) >= share * len(rs):
            stats[part] = (len(rs), len(ids), ids)

    def rank(part: Part) -> tuple[Any, ...]:
        n, k, _ids = stats[part]
        evidence = " ".join(r.flags[cause] for r in through[part] if cause in r.flags)[:4000]
        named = any(v and v in evidence for v in part[1:])
        side = any(r.side in roles.get(part, ()) for r in through[part][:1]) or part[:2] == ("pool", "decode")
        return (KINDS.index(part[0]), not side, -k / n, not named, -k, part)

    taken: list[Part] = []
    covered: set[str] = set()
    for part in sorted((p for p in stats if p[0] in KINDS[:3]), key=rank):
        ids = stats[part][2]
        if len(ids & covered) >= COVERED * len(ids):
            continue
        taken.append(part)
        covered |= ids
    # A part broken as a whole replaces the smaller parts it holds; one that holds none is
    # taken only where no smaller part explained its requests.
    for part in sorted((p for p in stats if p[0] not in KINDS[:3]), key=lambda p: (stats[p][0], rank(p))):
        n, k, ids = stats[part]
        inside = [t for t in taken if stats[t][2] <= ids and KINDS.index(t[0]) < KINDS.index(part[0])]
        if k >= WHOLE_SHARE * n and len(inside) >= 2:
            taken = [t for t in taken if t not in inside] + [part]
            covered |= ids
        elif len(ids & covered) < COVERED * len(ids) and not inside:
            taken.append(part)
            covered |= ids
    incidents: list[Incident] = []
    for part in taken:
        incidents += _episodes(cause, part, through[part], roles.get(part, set()), stats[part])
    # Flagged requests no part explains: one incident each.
    for r in ordered:
        if cause in r.flags and r.trace_id not in covered:
            incidents.append(
                Incident(cause, ("request", r.trace_id), [r], 1, 1, open=False, ended_ns=r.start_ns)
            )
    return incidents


def _episodes(
    cause: str, part: Part, rs: Sequence[Record], roles: set[str], stat: tuple[int, int, set[str]]
) -> list[Incident]:
    """The part's flagged requests split where `HEALTHY_RUN` healthy ones in a row end an incident."""
    out: list[Incident] = []
    current: list[Record] = []
    healthy: list[Record] = []
    for r in rs:
        if cause in r.flags:
            current.append(r)
            healthy = []
        elif current:
            healthy.append(r)
            if len(healthy) >= HEALTHY_RUN:
                out.append(
                    Incident(cause, part, current, stat[0], stat[1], False, healthy[0].start_ns, set(roles))
                )
                current, healthy = [], []
    if current:
        out.append(Incident(cause, part, current, stat[0], stat[1], True, None, set(roles)))
    return out
