"""judge(): one request's facts plus the topology → path class, flags with evidence, pairing level.

Rules (docs/topology.md#verdicts): every flag names the span and attribute that proved it and, for
NIC questions, whether the proof is the devices UCX used or the allocation. Missing evidence
gives `unknown` / no flag — never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from railtrace.model import (
    KV_SOURCE,
    Candidate,
    Endpoint,
    Flag,
    KVFacts,
    KVSummary,
    RequestFacts,
    RequestSummary,
    RouterPick,
    leg_dict,
    rfc3339,
)
from railtrace.normalize.table import endpoint_pod
from railtrace.topology.identity import (
    claim_rejection,
    resolve_address,
    resolve_endpoint,
    resolve_engine,
    split_address,
)
from railtrace.topology.model import MISALIGNED, NIC, Topology
from railtrace.verdicts.config import VerdictConfig
from railtrace.verdicts.cost import request_cost
from railtrace_tracing import semconv as sc
from railtrace_tracing.semconv import IDENTITY, PATH_CLASS, TRANSPORT, FlagName, TopologyLevel
from railtrace_tracing.ucx import classify

_LEVEL_RANK = {lvl: i for i, lvl in enumerate(sc.TOPOLOGY_LEVEL_ORDER)}


@dataclass
class Lane:
    """One `transport/device` entry of `llm_d.kv_transfer.devices`, with its share of the bytes."""

    raw: str
    transport: str  # a Transport value, or "" for staging lanes
    device: str
    share: float
    nic: NIC | None = None


@dataclass
class _Ctx:
    facts: RequestFacts
    topology: Topology
    cfg: VerdictConfig
    kv: KVFacts | None
    local_role: str | None = None
    local_reason: str = ""
    prefill: Endpoint = field(default_factory=Endpoint)
    decode: Endpoint = field(default_factory=Endpoint)
    # The P2P source the KV cache was pulled from, when the transfer is judged against it.
    source: Endpoint | None = None
    lanes: list[Lane] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    # Level of a comparable decode candidate nearer the prefill node than the one chosen.
    closer: TopologyLevel | None = None

    @property
    def local(self) -> Endpoint:
        return self.decode if self.local_role == "decode" else self.prefill

    @property
    def remote(self) -> Endpoint:
        if self.source is not None:
            return self.source
        return self.prefill if self.local_role == "decode" else self.decode

    def kv_ref(self, attr: str) -> str:
        sid = self.kv.span_id if self.kv and self.kv.span_id else "?"
        return f"span {sid} {sc.SPAN_KV_TRANSFER} {attr}"

    def flag(self, name: FlagName, evidence: str, span_id: str | None) -> None:
        value = name.value
        if not any(f.name == value for f in self.flags):
            self.flags.append(Flag(value, evidence, span_id))


def lane_transport(lane: str) -> str:
    """The lane's transport class as the summary spells it (UCX's one classification,
    `railtrace_tracing.ucx.classify`); "" for a local staging copy, which carries no KV bytes."""
    transport = classify(lane)
    return transport.value if transport is not None else ""


def parse_lanes(devices: list[str], split: list[float]) -> list[Lane]:
    lanes = []
    shares = (
        split
        if len(split) == len(devices) and devices
        else [1.0 / len(devices)] * len(devices)
        if devices
        else []
    )
    for raw, share in zip(devices, shares, strict=False):
        parts = str(raw).split("/")
        dev = parts[1].split(":")[0] if len(parts) > 1 else ""
        lanes.append(Lane(str(raw), lane_transport(str(raw)), dev, float(share)))
    return lanes


def _local_side(ctx: _Ctx) -> None:
    """Which leg ran the transfer: the KV span's own pod/node/host, else its peer, else NIXL's convention."""
    kv, f = ctx.kv, ctx.facts
    if kv is None:
        return
    for attr in ("pod", "node", "host"):
        val = getattr(kv, attr)
        if not val:
            continue
        hits = [
            role for role, ep in (("prefill", f.prefill), ("decode", f.decode)) if getattr(ep, attr) == val
        ]
        if len(hits) == 1:
            ctx.local_role, ctx.local_reason = hits[0], f"KV span resource {attr}={val}"
            return
    if kv.remote_host:
        pod, _node, _ = resolve_address(ctx.topology, kv.remote_host)
        if pod:
            for role, ep in (("prefill", f.prefill), ("decode", f.decode)):
                if ep.pod == pod.name:
                    ctx.local_role = "decode" if role == "prefill" else "prefill"
                    ctx.local_reason = f"remote.host {kv.remote_host} is the {role} pod"
                    return
    if kv.operation in ("read", "write"):
        ctx.local_role = "decode" if kv.operation == "read" else "prefill"
        how = "pulls on decode" if kv.operation == "read" else "pushes from prefill"
        ctx.local_reason = f"operation={kv.operation}: NIXL {how}"


def _same_pod(ctx: _Ctx, a: str | None, b: str) -> bool:
    """Two addresses (pod IP, pod name, DNS name) of one pod of the topology."""
    pod_a, pod_b = resolve_address(ctx.topology, a)[0], resolve_address(ctx.topology, b)[0]
    return pod_a is not None and pod_a is pod_b


def _p2p_source(ctx: _Ctx) -> None:
    """Judge the transfer against the P2P KV source the sidecar named, not the prefill pod.

    With `x-kv-cache-source-host-port` and no prefill target the sidecar has its decode
    engine pull the cached prefix from that pod (llm-d-router pkg/sidecar/proxy/dispatch.go,
    `decodeWithP2PSource` in connector_p2p.go): the transfer runs on decode, its peer is the
    source. With a prefill target as well, the prefill pod pulls from the source and decode
    from prefill (`addP2PPullToPrefill`), so decode's transfer stays judged against prefill
    unless the KV span's own `remote.host` is the source's."""
    kv, f = ctx.kv, ctx.facts
    named_source = f.coverage.get(KV_SOURCE)
    if kv is None or not isinstance(named_source, dict) or not named_source.get("address"):
        return
    src = Endpoint(address=str(named_source["address"]), span_id=named_source.get("span_id"))
    assert src.address is not None
    named = f"{sc.PD_KV_CACHE_SOURCE}={src.address} on span {src.span_id or '?'}"
    src_host = split_address(src.address)[0]
    remote = split_address(kv.remote_host)[0] if kv.remote_host else None
    no_prefill = not (f.prefill.pod or f.prefill.address or f.prefill.span_id)
    if remote is not None and remote != src_host and not _same_pod(ctx, kv.remote_host, src.address):
        ctx.notes.append(f"{named}: the KV span's peer {kv.remote_host} is not that source")
        return
    if remote is None and not no_prefill:
        ctx.notes.append(
            f"{named}: the prefill pod pulls its cached prefix from there; decode pulls from prefill"
        )
        return
    why = f"{ctx.kv_ref(sc.KV_REMOTE_HOST)}={kv.remote_host}" if remote else "no prefill leg"
    ctx.source = Endpoint(address=src.address, span_id=src.span_id)
    ctx.local_role, ctx.local_reason = "decode", f"pulled from the P2P KV source: {named} ({why})"


def _resolve_legs(ctx: _Ctx) -> None:
    kv, f = ctx.kv, ctx.facts
    prefill, decode = f.prefill.copy(), f.decode.copy()
    if kv is not None and ctx.local_role:
        loc = decode if ctx.local_role == "decode" else prefill
        loc.pod, loc.node, loc.host = loc.pod or kv.pod, loc.node or kv.node, loc.host or kv.host
        rem = ctx.source if ctx.source is not None else prefill if ctx.local_role == "decode" else decode
        if not rem.pod and not rem.address:
            peer = resolve_engine(ctx.topology, kv.remote_engine_id)
            if peer:
                rem.pod, rem.identity = peer.name, IDENTITY.KV_PEER
            elif kv.remote_host:
                rem.address, rem.identity = kv.remote_host, IDENTITY.KV_PEER
    gpu_p = kv.local_gpu if kv and ctx.local_role == "prefill" else None
    gpu_d = kv.local_gpu if kv and ctx.local_role == "decode" else None
    ctx.prefill, notes_p = resolve_endpoint(ctx.topology, prefill, gpu_p)
    ctx.decode, notes_d = resolve_endpoint(ctx.topology, decode, gpu_d)
    ctx.notes += [f"prefill: {n}" for n in notes_p] + [f"decode: {n}" for n in notes_d]
    if ctx.source is not None:
        ctx.source, notes_s = resolve_endpoint(ctx.topology, ctx.source)
        ctx.notes += [f"KV source: {n}" for n in notes_s]


def _with_claims(facts: RequestFacts, ctx: _Ctx) -> dict[str, Any]:
    """The request's coverage, with each engine's `k8s.pod.name` claim that was not believed:
    `rejected` where the leg was placed elsewhere, `unverified` where it landed on the claimed
    pod by other evidence."""
    coverage = dict(facts.coverage)
    for leg, claimed, placed in (
        ("prefill", facts.prefill, ctx.prefill),
        ("decode", facts.decode, ctx.decode),
    ):
        pod = claimed.claimed_pod
        if not pod or (placed.pod == pod and placed.identity == IDENTITY.K8S_RESOURCE):
            continue
        kind = "unverified" if placed.pod == pod else "rejected"
        note = f"{leg} engine span {claimed.span_id}: {claim_rejection(pod, claimed.peer)}"
        notes = list(coverage.get(kind) or [])
        if note not in notes:
            coverage[kind] = [*notes, note]
    return coverage


def _transport(ctx: _Ctx) -> str:
    kv = ctx.kv
    if kv is None:
        return TRANSPORT.UNKNOWN
    if kv.transport and kv.transport != TRANSPORT.UNKNOWN:
        return kv.transport
    data = [ln for ln in ctx.lanes if ln.transport]
    kinds = {ln.transport for ln in data}
    if len(kinds) == 1 and TRANSPORT.UNKNOWN not in kinds:
        return kinds.pop()
    return TRANSPORT.UNKNOWN


def _used_nics(ctx: _Ctx) -> None:
    """The NIC behind each RDMA lane: by RDMA device name (dranet, node collector, topo matrix), else,
    when every RDMA lane names one device, the only RDMA NIC allocated to the local pod if that NIC's
    own device name is unknown: a pod sees the RDMA devices of its allocated NICs only (SR-IOV VFs,
    whose slices carry no mlx5_N name)."""
    node = ctx.local.node
    rdma = [ln for ln in ctx.lanes if ln.transport == TRANSPORT.RDMA]
    for ln in rdma:
        ln.nic = ctx.topology.find_nic(node, ln.device)
    missing = [ln for ln in rdma if ln.nic is None]
    if not missing or len({ln.device for ln in rdma}) != 1 or not ctx.local.pod:
        return
    held: list[NIC] = []
    for pod in ctx.topology.pods_named(ctx.local.pod)[:1]:
        for alloc in ctx.topology.allocations_of(pod):
            for name in alloc.nics:
                nic = ctx.topology.nic(alloc.node or node, name)
                if nic is not None and nic.rdma is not False and nic not in held:
                    held.append(nic)
    # A held NIC whose RDMA device name is known and differs is not the lane's device: not mapped.
    if len(held) == 1 and held[0].rdma_device is None:
        for ln in missing:
            ln.nic = held[0]
        ctx.notes.append(
            f"lane device {missing[0].device} is {held[0].describe()}: the only RDMA NIC allocated "
            f"to pod {ctx.local.pod}"
        )


def _gpu_rail(ctx: _Ctx, ep: Endpoint) -> tuple[set[str], list[str]]:
    """Rails of the NICs paired with the endpoint's GPU (several when pairing is by NUMA)."""
    if not ep.gpu or not ep.node:
        return set(), []
    nics, _p = ctx.topology.paired_nics(ep.node, ep.gpu)
    return {n.rail for n in nics if n.rail}, [n.name for n in nics]


def _path_and_nic_flags(ctx: _Ctx, transport: str) -> str:
    """Path class, cross_rail and gpu_nic_mismatch. Devices UCX used beat the allocation."""
    kv, topo = ctx.kv, ctx.topology
    sid = kv.span_id if kv else None
    rdma_lanes = [ln for ln in ctx.lanes if ln.transport == TRANSPORT.RDMA]
    loc, rem = ctx.local, ctx.remote

    # gpu_nic_mismatch, local side from devices.
    devices_judged = False
    if rdma_lanes and loc.gpu and loc.node:
        paired, p = topo.paired_nics(loc.node, loc.gpu)
        unresolved = [ln.raw for ln in rdma_lanes if ln.nic is None]
        if p and p.method and not unresolved:
            devices_judged = True
            dominant = max(rdma_lanes, key=lambda ln: ln.share)
            if dominant.nic not in paired:
                ctx.flag(
                    FlagName.GPU_NIC_MISMATCH,
                    f"{ctx.kv_ref(sc.KV_DEVICES)}={dominant.raw} (devices UCX used): "
                    f"{dominant.nic.describe()} "  # type: ignore[union-attr]
                    f"is not paired with {loc.gpu} on {loc.node}; its NICs by {p.method}: "
                    + ", ".join(n.describe() for n in paired),
                    sid,
                )
        elif unresolved:
            ctx.notes.append(f"devices {', '.join(unresolved)} not found on node {loc.node}")
    # gpu_nic_mismatch from the allocation: the local side when no devices decided, the peer always.
    for ep, role in ((loc, "local"), (rem, "remote")):
        if role == "local" and devices_judged:
            continue
        if not ep.pod:
            continue
        for pod in topo.pods_named(ep.pod)[:1]:
            for alloc in topo.allocations_of(pod):
                if alloc.alignment == MISALIGNED:
                    span = ep.span_id or sid
                    ctx.flag(
                        FlagName.GPU_NIC_MISMATCH,
                        f"allocation (ResourceClaim {alloc.claim}) of {role} pod {pod.name} "
                        f"(span {span or '?'}): " + "; ".join(alloc.evidence),
                        span,
                    )

    if transport == TRANSPORT.NVLINK:
        return PATH_CLASS.NVLINK
    if transport == TRANSPORT.SHM:
        return PATH_CLASS.SHM
    if transport == TRANSPORT.TCP:
        return PATH_CLASS.TCP
    if transport != TRANSPORT.RDMA:
        return PATH_CLASS.UNKNOWN

    # Rails.
    expected_rails, _ = _gpu_rail(ctx, loc)
    remote_rail = rem.rail
    cross_evidence: list[str] = []
    used_rails: set[str] = set()
    source = ""
    if rdma_lanes and all(ln.nic is not None and ln.nic.rail for ln in rdma_lanes):
        source = "devices UCX used"
        for ln in rdma_lanes:
            rail = ln.nic.rail  # type: ignore[union-attr]
            if ln.share < ctx.cfg.cross_rail_min_share:
                continue
            used_rails.add(rail)  # type: ignore[arg-type]
            if expected_rails and rail not in expected_rails:
                # An SR-IOV function is named with its PF; other NICs are named by the lane already.
                via = f" via {ln.nic.describe()}" if ln.nic and ln.nic.function else ""
                cross_evidence.append(
                    f"{ctx.kv_ref(sc.KV_DEVICES)} lane {ln.raw} ({ln.share:.0%} of bytes) "
                    f"is on rail {rail}{via}; "
                    f"{loc.gpu} is on rail {', '.join(sorted(expected_rails))}"
                )
            elif remote_rail and rail != remote_rail:
                cross_evidence.append(
                    f"{ctx.kv_ref(sc.KV_DEVICES)} lane {ln.raw} is on rail {rail}; "
                    f"peer {rem.pod or rem.node} uses rail {remote_rail} (allocation)"
                )
    elif loc.rail:
        source = "allocation"
        used_rails = {loc.rail}
        if remote_rail and loc.rail != remote_rail:
            cross_evidence.append(
                f"allocation: {loc.pod or loc.node} NIC {loc.nic} is on rail {loc.rail}; "
                f"{rem.pod or rem.node} NIC {rem.nic} is on rail {remote_rail} "
                f"(no {sc.KV_DEVICES} on span {sid})"
            )
    if cross_evidence:
        ctx.flag(FlagName.CROSS_RAIL, "; ".join(cross_evidence), sid)
        return PATH_CLASS.RDMA_CROSS_RAIL
    if used_rails and remote_rail and used_rails == {remote_rail}:
        ctx.notes.append(f"rail {remote_rail} on both ends ({source})")
        return PATH_CLASS.RDMA_SAME_RAIL
    ctx.notes.append("RDMA, but the rails of both ends are not known")
    return PATH_CLASS.UNKNOWN


def _tcp_fallback(ctx: _Ctx, transport: str) -> None:
    """TCP where both ends have RDMA; a TCP lane in a split counts too (`28% on tcp/eth0`)."""
    tcp_lanes = [ln for ln in ctx.lanes if ln.transport == TRANSPORT.TCP]
    if ctx.kv is None or (transport != TRANSPORT.TCP and not tcp_lanes):
        return
    ends = (ctx.source, ctx.decode) if ctx.source is not None else (ctx.prefill, ctx.decode)
    nodes = [(ctx.topology.node(ep.node), ep) for ep in ends]
    if transport == TRANSPORT.TCP:
        lanes = ", ".join(ln.raw for ln in ctx.lanes) or "no devices"
    else:
        lanes = ", ".join(f"{ln.raw} carried {ln.share:.0%} of bytes" for ln in tcp_lanes)
    src = sc.KV_TRANSPORT if ctx.kv.transport == TRANSPORT.TCP else sc.KV_DEVICES
    if any(n is None for n, _ in nodes):
        ctx.notes.append("TCP, but a node is not in the topology: RDMA availability unknown")
        return
    paths = [(n.rdma_path, f"{n.name}: {n.rdma_reason}") for n, _ in nodes]  # type: ignore[union-attr]
    if any(rp is False for rp, _ in paths):
        ctx.notes.append("TCP expected: " + "; ".join(r for rp, r in paths if rp is False))
        return
    if all(rp is True for rp, _ in paths):
        ctx.flag(
            FlagName.TCP_FALLBACK,
            f"{ctx.kv_ref(src)} says tcp ({lanes}) although both ends have RDMA: "
            + "; ".join(r for _, r in paths),
            ctx.kv.span_id,
        )
    else:
        ctx.notes.append("TCP, but RDMA availability of a node is unknown")


def _decode_pick(ctx: _Ctx) -> RouterPick | None:
    picks = ctx.facts.picks
    by_profile = [p for p in picks if p.profile == "decode"]
    if by_profile:
        return max(by_profile, key=lambda p: len(p.candidates))
    d = ctx.facts.decode
    for p in picks:
        if p.chosen and p.chosen in (d.address, d.pod) and p.profile != "prefill":
            return p
    return None


def _candidate_node(ctx: _Ctx, c: Candidate) -> str | None:
    """A candidate's node: its pod (the router shim's, else the pod llm-d's endpoint id
    `<namespace>/<pod>-rank-<i>` names, as `_dispatched` reads it), else its address."""
    name = c.pod or endpoint_pod(c.endpoint)
    if name:
        pods = ctx.topology.pods_named(name)
        if len(pods) == 1 and pods[0].node:
            return pods[0].node
    pod, node, _ = resolve_address(ctx.topology, c.endpoint)
    return node.name if node else (pod.node if pod else None)


def _key_level(a: str | None, b: str | None) -> TopologyLevel:
    """Level from router-shim topology keys `zone/block/subblock/host` (empty parts unknown)."""
    if not a or not b:
        return TopologyLevel.UNKNOWN
    pa, pb = (a.split("/") + [""] * 4)[:4], (b.split("/") + [""] * 4)[:4]
    for i, lvl in (
        (3, TopologyLevel.SAME_HOST),
        (2, TopologyLevel.SUBBLOCK),
        (1, TopologyLevel.BLOCK),
        (0, TopologyLevel.ZONE),
    ):
        if pa[i] and pa[i] == pb[i]:
            return lvl
    return TopologyLevel.FAR if pa[0] and pb[0] else TopologyLevel.UNKNOWN


def _dispatched(pick: RouterPick, leg: Endpoint) -> Candidate | None:
    """The candidate a leg was dispatched to: the router shim's recorded choice, else the one
    naming the leg's resolved pod or address. llm-d's `top_endpoints` order is no choice
    (written before the pick; the max-score picker shuffles ties), so it is never read as one."""
    if pick.chosen:
        return next((c for c in pick.candidates if c.endpoint == pick.chosen), None)
    for c in pick.candidates:
        pod = c.pod or endpoint_pod(c.endpoint)
        if (leg.pod and pod == leg.pod) or (leg.address and c.endpoint == leg.address):
            return c
    return None


def _blind_pairing(ctx: _Ctx) -> None:
    pick = _decode_pick(ctx)
    pnode = ctx.prefill.node
    if pick is None or not pick.candidates:
        ctx.notes.append("no decode pick with candidates: pairing not judged")
        return
    chosen = _dispatched(pick, ctx.decode)
    if chosen is None or chosen.score is None:
        ctx.notes.append(f"span {pick.span_id}: dispatched endpoint not a scored candidate: not judged")
        return
    prefill_key = None
    for p in ctx.facts.picks:
        if p.profile == "prefill" and (dispatched := _dispatched(p, ctx.prefill)) is not None:
            prefill_key = dispatched.topology

    def level(c: Candidate) -> TopologyLevel:
        lvl = TopologyLevel.UNKNOWN
        if pnode:
            lvl, _ = ctx.topology.level_between(pnode, _candidate_node(ctx, c))
        if lvl == TopologyLevel.UNKNOWN:
            lvl = _key_level(prefill_key, c.topology)
        return lvl

    chosen_level = level(chosen)
    if chosen_level == TopologyLevel.UNKNOWN:
        ctx.notes.append(f"span {pick.span_id}: topology of the chosen decode endpoint unknown")
        return
    tol = ctx.cfg.tolerance_for(chosen.score)
    better = []
    for c in pick.candidates:
        if c is chosen or c.endpoint == chosen.endpoint or c.score is None or c.score < chosen.score - tol:
            continue
        lvl = level(c)
        if lvl != TopologyLevel.UNKNOWN and _LEVEL_RANK[lvl] < _LEVEL_RANK[chosen_level]:
            better.append((c, lvl))
    if better:
        c, lvl = min(better, key=lambda x: _LEVEL_RANK[x[1]])
        ctx.closer = lvl
        ctx.flag(
            FlagName.TOPOLOGY_BLIND_PAIRING,
            f"span {pick.span_id} ({pick.source}) "
            f"{sc.ROUTER_CANDIDATE_ENDPOINTS}/{sc.ROUTER_CANDIDATE_SCORES}: chose {chosen.endpoint} "
            f"(score {chosen.score:g}, {chosen_level.value} from prefill node {pnode}) over "
            f"{c.endpoint} (score {c.score:g}, {lvl.value}); tolerance {tol:g}",
            pick.span_id,
        )


def _slow(ctx: _Ctx, path_class: str, transport: str) -> None:
    kv, cfg = ctx.kv, ctx.cfg
    if kv is None or kv.error_type or not kv.bytes or not kv.duration_s or kv.duration_s <= 0:
        return
    if kv.bytes < cfg.slow_min_bytes:
        return
    expected = cfg.expected_bandwidth.get(path_class)
    basis = path_class
    if expected is None and path_class == PATH_CLASS.UNKNOWN and transport == TRANSPORT.RDMA:
        rdma = (PATH_CLASS.RDMA_SAME_RAIL, PATH_CLASS.RDMA_CROSS_RAIL)
        known = [v for v in (cfg.expected_bandwidth.get(p) for p in rdma) if v]
        if known:
            expected, basis = min(known), "rdma (rail unknown)"
    if not expected:
        return
    bw = kv.bytes / kv.duration_s
    if bw < cfg.slow_fraction * expected:
        ctx.flag(
            FlagName.SLOW_KV_TRANSFER,
            f"{ctx.kv_ref(sc.KV_BYTES)}={kv.bytes} in {kv.duration_s * 1e3:.1f} ms = {bw / 1e9:.3g} GB/s, "
            f"below {cfg.slow_fraction:.0%} of {expected / 1e9:.3g} GB/s expected for {basis}",
            kv.span_id,
        )


def judge(facts: RequestFacts, topology: Topology, config: VerdictConfig | None = None) -> RequestSummary:
    """The request summary: legs resolved on the topology, path class, flags with evidence."""
    cfg = config or VerdictConfig()
    ctx = _Ctx(facts=facts, topology=topology, cfg=cfg, kv=facts.kv)
    ctx.flags = list(facts.flags)
    kv = facts.kv
    if kv is not None:
        ctx.lanes = parse_lanes(list(kv.devices or []), list(kv.split or []))
    _p2p_source(ctx)
    if ctx.source is None:
        _local_side(ctx)
    if ctx.local_reason:
        ctx.notes.append(f"transfer ran on {ctx.local_role} ({ctx.local_reason})")
    _resolve_legs(ctx)
    _used_nics(ctx)
    transport = _transport(ctx)
    path_class = PATH_CLASS.UNKNOWN
    if kv is not None:
        if kv.error_type:
            ctx.flag(FlagName.KV_TRANSFER_FAILED, f"{ctx.kv_ref(sc.ERROR_TYPE)}={kv.error_type}", kv.span_id)
        if ctx.local_role is None:
            ctx.notes.append("which leg ran the transfer is unknown")
        path_class = _path_and_nic_flags(ctx, transport)
        _tcp_fallback(ctx, transport)
        _slow(ctx, path_class, transport)
    else:
        ctx.notes.append("no KV-transfer span")
    _blind_pairing(ctx)
    pairing_level = None
    peer = ctx.source if ctx.source is not None else ctx.prefill  # the ends the KV cache travelled
    if peer.node and ctx.decode.node:
        pairing_level = topology.level_between(peer.node, ctx.decode.node)[0].value
    kv_summary = None
    if kv is not None:
        evidence = "; ".join([x for x in [kv.evidence] if x] + ctx.notes)
        kv_summary = KVSummary(
            transport=transport,
            path_class=path_class,
            bytes=kv.bytes,
            duration_s=kv.duration_s,
            devices=list(kv.devices or []),
            evidence=evidence or None,
            source=leg_dict(ctx.source) if ctx.source is not None else None,
        )
    cost = None
    if kv is not None:
        cost = request_cost(
            topology,
            cfg,
            kv,
            path_class,
            transport,
            ctx.flags,
            ctx.local,
            ctx.remote,
            ctx.local_role,
            facts.ttft_s,
            facts.breakdown_s.get("kv_transfer"),
            ctx.closer,
        )
    identity = {"prefill": ctx.prefill.identity, "decode": ctx.decode.identity}
    if ctx.source is not None:
        identity["kv_source"] = ctx.source.identity
    return RequestSummary(
        trace_id=facts.trace_id,
        request_id=facts.request_id,
        model=facts.model,
        start=rfc3339(facts.start_ns),
        ttft_s=facts.ttft_s,
        e2e_s=facts.e2e_s,
        breakdown_s=dict(facts.breakdown_s),
        prefill=leg_dict(ctx.prefill),
        decode=leg_dict(ctx.decode),
        kv_transfer=kv_summary,
        flags=ctx.flags,
        trace_ids=list(facts.trace_ids),
        span_count=facts.span_count,
        complete=facts.complete,
        pairing_level=pairing_level,
        identity=identity,
        resolved=all(ep.node and ep.gpu and ep.nic for ep in (ctx.prefill, ctx.decode)),
        coverage=_with_claims(facts, ctx),
        cost=cost,
    )
