"""The topology-contract audit: discovered, preserved, verified, consumed, per pod.

A pure function of the topology model and recent request summaries, so the same code runs in
CI on planned manifests (no summaries: verified and consumed stay `unknown`), in the CLI
against a database, and behind `GET /api/v1/contract` and `/metrics` in the service.
No obligation is ever `ok` for lack of evidence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, is_dataclass
from datetime import UTC, datetime
from typing import Any

from railtrace.contract.report import (
    BROKEN,
    OK,
    UNKNOWN,
    ContractReport,
    Evidence,
    ObligationResult,
    Subject,
    rollup,
    worst,
)
from railtrace.topology.k8s_keys import (
    DRANET_NUMA_NODE,
    EKS_BLOCK_LABEL,
    EKS_ULTRASERVER_LABEL,
    GCE_BLOCK_LABEL,
    GCE_HOST_LABEL,
    GCE_NETWORK_NAME,
    GCE_SUBBLOCK_LABEL,
    HOSTNAME_LABEL,
    NVIDIA_CLIQUE_LABEL,
    PCIE_ROOT,
    ROLE_LABEL,
)
from railtrace.topology.model import (
    ALIGNED,
    GPU,
    MISALIGNED,
    NIC,
    NOT_APPLICABLE,
    PAIR_NAME,
    PAIR_NUMA,
    Pod,
    Topology,
)
from railtrace_tracing.semconv import ENGINE_ROLES, FlagName, Obligation, Transport

UNASSIGNED = "unassigned"
REQUEST_LINK = "/api/v1/requests/{trace_id}"

# Names an operator searches for when an attribute is missing (reference §2-3).
GPU_NUMA_SOURCES = "GPU NUMA (nvidia-smi topo -m or railtrace topology)"
RAIL_ATTRS = f"rail or network ({GCE_NETWORK_NAME}, railtrace topology rail)"
BLOCK_LABEL = f"{GCE_BLOCK_LABEL} (EKS: {EKS_BLOCK_LABEL})"
SUBBLOCK_LABEL = f"{GCE_SUBBLOCK_LABEL} (or an NVLink domain: {NVIDIA_CLIQUE_LABEL}, {EKS_ULTRASERVER_LABEL})"
HOST_LABEL = GCE_HOST_LABEL


@dataclass(frozen=True, slots=True)
class ContractConfig:
    """What counts as recent, and how much topology-blind pairing a pod's traffic may tolerate."""

    window_s: float | None = 900.0  # summaries older than this (before `now`) are not evidence; None: all
    blind_pairing_threshold: float = 0.05  # broken when the blind share of judged pairings exceeds this
    min_transfers: int = 1  # RDMA transfers needed before "verified" can be ok
    min_pairings: int = 1  # judged pairings needed before "consumed" can be ok
    require_rail: bool = True  # an RDMA NIC without rail or network breaks "discovered"
    max_links: int = 10  # offending requests linked per obligation (the count is always complete)


# ---------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------


def audit(
    topology: Topology,
    summaries: Iterable[Any] | None = None,
    config: ContractConfig | None = None,
    now: datetime | None = None,
) -> ContractReport:
    """Judge the four obligations for every prefill/decode pod and claim template, and roll them up.

    `summaries` are `RequestSummary` objects or their dict form; `None` means offline (topology
    files only), where verified and consumed are `unknown` by definition.
    """
    config = config or ContractConfig()
    now = now or datetime.now(UTC)
    offline = summaries is None
    reqs = [] if offline else _recent(summaries or (), config, now)
    warnings: list[str] = list(getattr(topology, "warnings", ()) or ())

    node_checks = {name: _discovered_node(topology, name, config) for name in sorted(topology.nodes)}
    subjects: list[Subject] = []
    by_pod: dict[str, list[dict[str, Any]]] = {}
    for r in reqs:
        for name in {_leg(r, "prefill").get("pod"), _leg(r, "decode").get("pod")} - {None, ""}:
            by_pod.setdefault(str(name), []).append(r)
    for info in _pod_subjects(topology, reqs):
        pod_reqs = by_pod.get(info.name, [])
        obligations = {
            Obligation.DISCOVERED.value: _discovered_pod(topology, info, node_checks, config),
            Obligation.PRESERVED.value: _preserved_pod(topology, info),
            Obligation.VERIFIED.value: _offline(Obligation.VERIFIED)
            if offline
            else _verified(topology, info, pod_reqs, config),
            Obligation.CONSUMED.value: _offline(Obligation.CONSUMED)
            if offline
            else _consumed(info, pod_reqs, config),
        }
        subjects.append(
            Subject("pod", info.name, info.namespace, info.node, info.pool, info.role, obligations)
        )
    for tmpl in getattr(topology, "templates", ()) or ():
        subject = _template_subject(tmpl, node_checks)
        if subject is not None:
            subjects.append(subject)

    def statuses(s: Subject) -> dict[str, str]:
        return {k: v.status for k, v in s.obligations.items()}

    node_names = sorted(set(node_checks) | {s.node for s in subjects if s.kind == "pod" and s.node})
    nodes = []
    for name in node_names:
        members = [statuses(s) for s in subjects if s.kind == "pod" and s.node == name]
        if name in node_checks:
            members.append({Obligation.DISCOVERED.value: node_checks[name].status})
        roll = rollup(name, members)
        roll.members = sum(1 for s in subjects if s.kind == "pod" and s.node == name)
        nodes.append(roll)
    pools = []
    for pool in sorted({s.pool for s in subjects}):
        pools.append(rollup(pool, [statuses(s) for s in subjects if s.pool == pool]))
    fleet_members = [statuses(s) for s in subjects] + [
        {Obligation.DISCOVERED.value: c.status} for c in node_checks.values()
    ]
    fleet = rollup("fleet", fleet_members)
    fleet.members = len(subjects)
    return ContractReport(
        mode="offline" if offline else "online",
        generated_at=now.isoformat().replace("+00:00", "Z"),
        config=asdict(config),
        subjects=subjects,
        nodes=nodes,
        pools=pools,
        fleet=fleet,
        node_findings=node_checks,
        inputs={
            "sources": list(getattr(topology, "sources", ()) or ()),
            "nodes": len(topology.nodes),
            "requests_in_window": len(reqs),
        },
        warnings=warnings,
    )


# ---------------------------------------------------------------------------------------
# Subjects
# ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class _PodInfo:
    name: str
    namespace: str | None
    node: str | None
    role: str | None
    pool: str
    pod: Pod | None  # None when only request summaries name it


def _pod_subjects(topology: Topology, reqs: list[dict[str, Any]]) -> list[_PodInfo]:
    """Prefill and decode pods: labelled or GPU-holding pods of the topology, plus pods named by traffic."""
    out: dict[str, _PodInfo] = {}
    for pod in topology.pods.values():
        role = _role_of(pod)
        has_devices = any(a.gpus or a.nics for a in topology.allocations_of(pod))
        if role is None and not has_devices:
            continue  # gateway, EPP, collector: not part of the GPU contract
        out[pod.name] = _PodInfo(pod.name, pod.namespace, pod.node, role, role or "", pod)
    seen_roles: dict[str, set[str]] = {}
    for r in reqs:
        for leg_name in ENGINE_ROLES:
            leg = _leg(r, leg_name)
            name = leg.get("pod")
            if not name:
                continue
            seen_roles.setdefault(name, set()).add(leg_name)
            if name not in out:
                pods = topology.pods_named(name)
                pod = pods[0] if pods else None
                node = (pod.node if pod else None) or leg.get("node")
                out[name] = _PodInfo(name, pod.namespace if pod else None, node, None, "", pod)
            elif not out[name].node and leg.get("node"):
                out[name].node = leg.get("node")
    for info in out.values():
        if info.role is None:
            roles = seen_roles.get(info.name, set())
            info.role = next(iter(roles)) if len(roles) == 1 else _role_from_name(info.name)
        info.pool = info.role or UNASSIGNED
    return sorted(out.values(), key=lambda i: (i.pool, i.namespace or "", i.name))


def _pod_ref(info: _PodInfo) -> str:
    return f"pod/{info.namespace}/{info.name}" if info.namespace else f"pod/{info.name}"


def _role_of(pod: Pod) -> str | None:
    role = pod.role or (pod.labels or {}).get(ROLE_LABEL)
    return role if role in ENGINE_ROLES else None


def _role_from_name(name: str) -> str | None:
    low = name.lower()
    hits = [r for r in ENGINE_ROLES if r in low]
    return hits[0] if len(hits) == 1 else None


# ---------------------------------------------------------------------------------------
# Discovered
# ---------------------------------------------------------------------------------------


def _discovered_node(topology: Topology, name: str, config: ContractConfig) -> ObligationResult:
    """Does every GPU and RDMA NIC of the node publish a pairing key and a rail, and the node its position?"""
    node = topology.node(name)
    gpus = topology.gpus_on(name)
    nics = [n for n in topology.nics_on(name) if n.rdma is not False]
    evidence: list[Evidence] = []
    unknown_parts: list[Evidence] = []
    name_paired = {
        nic for p in topology.pairings if p.node == name and p.method == PAIR_NAME for nic in p.nics
    }
    if not gpus and not nics:
        unknown_parts.append(
            Evidence(
                f"node/{name}",
                "no GPU or RDMA NIC of this node is among the inputs (ResourceSlices, topo matrix)",
            )
        )
    for g in gpus:
        if not g.pcie_root and g.numa is None:
            evidence.append(
                Evidence(
                    f"gpu/{name}/{g.name}",
                    "GPU publishes neither a PCIe root nor a NUMA node, so no NIC can be paired with it",
                    [PCIE_ROOT, GPU_NUMA_SOURCES],
                )
            )
    for n in nics:
        missing: list[str] = []
        if not n.pcie_root and n.numa is None and n.name not in name_paired:
            missing += [PCIE_ROOT, DRANET_NUMA_NODE]
        if config.require_rail and not (n.rail or n.network):
            missing.append(RAIL_ATTRS)
        if missing:
            evidence.append(
                Evidence(
                    f"nic/{name}/{n.name}", f"RDMA NIC {n.label} lacks what pairing and routing need", missing
                )
            )
    if node is not None:
        labels = dict(node.labels or {})
        missing_labels = []
        if not node.block:
            missing_labels.append(BLOCK_LABEL)
        if not (node.subblock or node.nvlink_domain):  # an NVLink clique is subblock-sized
            missing_labels.append(SUBBLOCK_LABEL)
        if not (node.host or labels.get(HOSTNAME_LABEL)):
            missing_labels.append(HOST_LABEL)
        if missing_labels:
            item = Evidence(
                f"node/{name}",
                "node does not publish its block/subblock/host, so the router cannot rank pairings",
                missing_labels,
            )
            if labels:  # a Node object was loaded: what it lacks, it does not publish
                evidence.append(item)
            else:
                item.message = (
                    "the Node object is not among the inputs; its topology labels cannot be checked"
                )
                unknown_parts.append(item)
    if evidence:
        missing_count = sum(len(e.missing) for e in evidence)
        return ObligationResult(
            Obligation.DISCOVERED.value,
            BROKEN,
            f"{len(evidence)} object(s) miss {missing_count} attribute(s) pairing or routing need",
            evidence + unknown_parts,
            {"gpus": len(gpus), "rdma_nics": len(nics)},
        )
    if unknown_parts:
        return ObligationResult(
            Obligation.DISCOVERED.value,
            UNKNOWN,
            unknown_parts[0].message,
            unknown_parts,
            {"gpus": len(gpus), "rdma_nics": len(nics)},
        )
    return ObligationResult(
        Obligation.DISCOVERED.value,
        OK,
        f"{len(gpus)} GPU(s) and {len(nics)} RDMA NIC(s) publish pairing keys and rails; node labels present",
        [],
        {"gpus": len(gpus), "rdma_nics": len(nics)},
    )


def _discovered_pod(
    topology: Topology, info: _PodInfo, node_checks: Mapping[str, ObligationResult], config: ContractConfig
) -> ObligationResult:
    if not info.node:
        return ObligationResult(
            Obligation.DISCOVERED.value,
            UNKNOWN,
            "the pod's node is not known",
            [Evidence(_pod_ref(info), "no node")],
        )
    check = node_checks.get(info.node) or _discovered_node(topology, info.node, config)
    return ObligationResult(
        check.obligation,
        check.status,
        f"node {info.node}: {check.summary}",
        list(check.evidence),
        dict(check.counts),
    )


# ---------------------------------------------------------------------------------------
# Preserved
# ---------------------------------------------------------------------------------------


def _describe_gpu(g: GPU | None, name: str) -> str:
    if g is None:
        return f"GPU {name} (not in any ResourceSlice)"
    parts = [
        p
        for p in (
            f"pciBusID {g.pci_bus_id}" if g.pci_bus_id else "",
            f"pcieRoot {g.pcie_root}" if g.pcie_root else "",
            f"NUMA {g.numa}" if g.numa is not None else "",
        )
        if p
    ]
    return f"GPU {g.name}" + (f" ({', '.join(parts)})" if parts else "")


def _describe_nic(n: NIC | None, name: str) -> str:
    if n is None:
        return f"NIC {name} (not in any ResourceSlice)"
    parts = [
        p
        for p in (
            n.name if n.label != n.name else "",
            f"pcieRoot {n.pcie_root}" if n.pcie_root else "",
            f"NUMA {n.numa}" if n.numa is not None else "",
        )
        if p
    ]
    return f"NIC {n.label}" + (f" ({', '.join(parts)})" if parts else "")


def _acceptable_nics(topology: Topology, node: str, gpu: GPU) -> tuple[set[str], str | None, str]:
    """NICs that count as the GPU's own, the pairing method, and the pairing's evidence.

    With NUMA pairing (Grace GPUs, VF NICs without pcieRoot) any RDMA NIC on the GPU's NUMA
    node is the GPU's own: that is the documented fallback, coarser than a PCIe root.
    """
    paired, pairing = topology.paired_nics(node, gpu.name)
    if pairing is None or not pairing.method:
        return set(), None, pairing.evidence if pairing else "no pairing known"
    names = {n.name for n in paired}
    if pairing.method == PAIR_NUMA:
        numas = {n.numa for n in paired if n.numa is not None}
        if gpu.numa is not None:
            numas.add(gpu.numa)
        names |= {n.name for n in topology.nics_on(node) if n.numa is not None and n.numa in numas and n.rdma}
    return names, pairing.method, pairing.evidence


def _preserved_pod(topology: Topology, info: _PodInfo) -> ObligationResult:
    obl = Obligation.PRESERVED.value
    if info.pod is None:
        return ObligationResult(
            obl,
            UNKNOWN,
            "the pod is not among the topology inputs (no Pod/ResourceClaim)",
            [Evidence(_pod_ref(info), "seen only in request summaries")],
        )
    allocs = [a for a in topology.allocations_of(info.pod) if a.alignment != NOT_APPLICABLE or a.gpus]
    if not allocs:
        return ObligationResult(
            obl,
            UNKNOWN,
            "no allocated ResourceClaim for this pod among the inputs",
            [Evidence(_pod_ref(info), "no allocation to judge")],
        )
    ok_ev: list[Evidence] = []
    broken_ev: list[Evidence] = []
    unknown_ev: list[Evidence] = []
    for alloc in allocs:
        claim = f"claim/{alloc.namespace}/{alloc.claim}" if alloc.namespace else f"claim/{alloc.claim}"
        node = alloc.node or info.node
        mine_broken = False
        if alloc.gpus and not alloc.nics:
            unknown_ev.append(
                Evidence(claim, "the claim allocates GPU(s) but no RDMA NIC; NIC allocation is not visible")
            )
        elif node:
            nics = {name: topology.nic(node, name) for name in alloc.nics}
            for gname in alloc.gpus:
                gpu = topology.gpu(node, gname)
                if gpu is None:
                    unknown_ev.append(Evidence(claim, f"{_describe_gpu(None, gname)}; cannot judge"))
                    continue
                own, method, why = _acceptable_nics(topology, node, gpu)
                if method is None:
                    unknown_ev.append(
                        Evidence(claim, f"{_describe_gpu(gpu, gname)} has no known NIC ({why})")
                    )
                    continue
                got = [n for n in alloc.nics if n in own]
                if got:
                    ok_ev.append(
                        Evidence(
                            claim,
                            f"{_describe_gpu(gpu, gname)} got its own "
                            f"{_describe_nic(nics[got[0]], got[0])} by {method}",
                        )
                    )
                    continue
                mine_broken = True
                own_desc = (
                    ", ".join(_describe_nic(topology.nic(node, n), n) for n in sorted(own)) or "none known"
                )
                allocated = ", ".join(_describe_nic(nics[n], n) for n in alloc.nics)
                broken_ev.append(
                    Evidence(
                        claim,
                        f"unaligned: {_describe_gpu(gpu, gname)} was allocated {allocated}; "
                        f"its own NIC by {method}: {own_desc}",
                    )
                )
        else:
            unknown_ev.append(Evidence(claim, "the claim's node is not known"))
        # The topology builder's own judgement of the claim counts too (it may know more).
        if alloc.alignment == MISALIGNED and not mine_broken:
            broken_ev.append(Evidence(claim, "; ".join(alloc.evidence) or "allocation misaligned"))
        elif alloc.alignment == ALIGNED and not mine_broken and not ok_ev and alloc.evidence:
            ok_ev.append(Evidence(claim, "; ".join(alloc.evidence)))
    if broken_ev:
        return ObligationResult(obl, BROKEN, broken_ev[0].message, broken_ev + unknown_ev)
    if unknown_ev and not ok_ev:
        return ObligationResult(obl, UNKNOWN, unknown_ev[0].message, unknown_ev)
    if unknown_ev:
        return ObligationResult(obl, UNKNOWN, unknown_ev[0].message, unknown_ev + ok_ev)
    return ObligationResult(obl, OK, "every allocated GPU has its own NIC", ok_ev)


# ---------------------------------------------------------------------------------------
# Templates (offline)
# ---------------------------------------------------------------------------------------


def _template_subject(tmpl: Any, node_checks: Mapping[str, ObligationResult]) -> Subject | None:
    """A ResourceClaimTemplate as a planned pod: preserved is what its constraints would guarantee."""
    if tmpl.alignment == NOT_APPLICABLE:
        return None
    status = {ALIGNED: OK, MISALIGNED: BROKEN}.get(tmpl.alignment, UNKNOWN)
    obj = (
        f"{tmpl.kind.lower()}/{tmpl.namespace}/{tmpl.name}"
        if tmpl.namespace
        else f"{tmpl.kind.lower()}/{tmpl.name}"
    )
    evidence = [Evidence(obj, e) for e in tmpl.evidence] or [Evidence(obj, f"alignment {tmpl.alignment}")]
    preserved = ObligationResult(Obligation.PRESERVED.value, status, evidence[0].message, evidence)
    if node_checks:
        st = worst(c.status for c in node_checks.values())
        bad = sorted(n for n, c in node_checks.items() if c.status != OK)
        discovered = ObligationResult(
            Obligation.DISCOVERED.value,
            st,
            f"over the {len(node_checks)} node(s) it could land on"
            + (f"; not ok on {', '.join(bad[:5])}" if bad else ""),
            [
                Evidence(f"node/{n}", f"discovered {node_checks[n].status}: {node_checks[n].summary}")
                for n in bad
            ],
        )
    else:
        discovered = ObligationResult(
            Obligation.DISCOVERED.value,
            UNKNOWN,
            "no node's devices are among the inputs",
            [Evidence(obj, "load the ResourceSlices (and Nodes) the template would draw from")],
        )
    role = _role_from_name(tmpl.name)
    return Subject(
        "template",
        tmpl.name,
        tmpl.namespace,
        None,
        role or "templates",
        role,
        {
            Obligation.DISCOVERED.value: discovered,
            Obligation.PRESERVED.value: preserved,
            Obligation.VERIFIED.value: ObligationResult(
                Obligation.VERIFIED.value, UNKNOWN, "a template runs no traffic", []
            ),
            Obligation.CONSUMED.value: ObligationResult(
                Obligation.CONSUMED.value, UNKNOWN, "a template is never paired by the router", []
            ),
        },
    )


# ---------------------------------------------------------------------------------------
# Verified and consumed (online)
# ---------------------------------------------------------------------------------------


def _offline(obligation: Obligation) -> ObligationResult:
    return ObligationResult(
        obligation.value, UNKNOWN, "offline audit (topology inputs only): no traffic to judge", []
    )


def _link(r: Mapping[str, Any]) -> str:
    return REQUEST_LINK.format(trace_id=r.get("trace_id"))


def _flags(r: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in r.get("flags") or ():
        if isinstance(f, Mapping):
            out.setdefault(str(f.get("name")), str(f.get("evidence") or ""))
        else:
            out.setdefault(str(getattr(f, "name", f)), str(getattr(f, "evidence", "") or ""))
    return out


def _nic_ok_for_leg(
    topology: Topology, leg: Mapping[str, Any], lanes: list[str], runs_transfer: bool
) -> bool | None:
    """Whether the NICs this leg used are its GPU's own per the topology; None when it cannot be told.

    The summary's `devices` are the lanes of the side that ran the transfer; with vLLM's
    default pull (NIXL READ) that is the decode side, so they are judged on the decode leg
    only; the prefill leg is judged on its own `nic`.
    """
    node, gpu_ref = leg.get("node"), leg.get("gpu")
    if not (node and gpu_ref):
        return None
    gpu = topology.find_gpu(node, gpu_ref)
    if gpu is None:
        return None
    refs = [leg.get("nic")] + (lanes if runs_transfer else [])
    nics = [n for n in (topology.find_nic(node, ref) for ref in refs if ref) if n is not None]
    if not nics:
        return None
    own, method, _ = _acceptable_nics(topology, gpu.node, gpu)
    if method is None:
        return None
    return all(n.name in own for n in nics)


def _verified(
    topology: Topology, info: _PodInfo, reqs: list[dict[str, Any]], config: ContractConfig
) -> ObligationResult:
    obl = Obligation.VERIFIED.value
    counts = {
        "transfers": 0,
        "rdma": 0,
        "rdma_with_nic": 0,
        "tcp": 0,
        "wrong_nic": 0,
        "local": 0,
        "unknown": 0,
    }
    offenders: list[Evidence] = []
    for r in reqs:
        kv = r.get("kv_transfer")
        if not kv:
            continue
        counts["transfers"] += 1
        flags = _flags(r)
        transport = str(kv.get("transport") or Transport.UNKNOWN.value)
        path_class = str(kv.get("path_class") or "unknown")
        legs = [(name, _leg(r, name)) for name in ENGINE_ROLES if _leg(r, name).get("pod") == info.name]
        if transport == Transport.TCP.value or path_class == "tcp" or FlagName.TCP_FALLBACK.value in flags:
            counts["tcp"] += 1
            why = flags.get(FlagName.TCP_FALLBACK.value) or kv.get("evidence") or "transport tcp"
            offenders.append(
                Evidence(f"request/{r.get('trace_id')}", f"KV transfer over TCP: {why}", link=_link(r))
            )
            continue
        nic_flags = [f for f in (FlagName.GPU_NIC_MISMATCH.value, FlagName.CROSS_RAIL.value) if f in flags]
        if nic_flags:
            lanes = [str(d) for d in kv.get("devices") or ()]
            verdicts = [_nic_ok_for_leg(topology, leg, lanes, name == "decode") for name, leg in legs]
            if not any(v is True for v in verdicts) or any(v is False for v in verdicts):
                counts["wrong_nic"] += 1
                offenders.append(
                    Evidence(
                        f"request/{r.get('trace_id')}",
                        f"KV transfer not over this pod's own NIC ({', '.join(nic_flags)}): "
                        + "; ".join(flags[f] for f in nic_flags if flags[f]),
                        link=_link(r),
                    )
                )
                continue
        if transport == Transport.RDMA.value:
            counts["rdma"] += 1
            if kv.get("devices") or any(leg.get("nic") for _, leg in legs):
                counts["rdma_with_nic"] += 1
        elif transport in (Transport.NVLINK.value, Transport.SHM.value):
            counts["local"] += 1  # never left the host: says nothing about the NIC
        else:
            counts["unknown"] += 1
    if offenders:
        n = len(offenders)
        return ObligationResult(
            obl,
            BROKEN,
            f"{n} of {counts['transfers']} recent KV transfer(s) left RDMA or the pod's own NIC",
            offenders[: config.max_links],
            counts,
        )
    if counts["rdma"] >= config.min_transfers and counts["rdma_with_nic"] > 0:
        return ObligationResult(
            obl, OK, f"{counts['rdma']} recent KV transfer(s) ran on RDMA over the pod's own NIC", [], counts
        )
    if counts["rdma"]:
        why = (
            "RDMA seen, but the NIC used was never reported"
            if not counts["rdma_with_nic"]
            else (f"only {counts['rdma']} RDMA transfer(s); {config.min_transfers} needed")
        )
    elif counts["transfers"]:
        why = "recent KV transfers carry no transport evidence (or stayed on the host)"
    else:
        why = "no recent KV transfer involves this pod"
    return ObligationResult(obl, UNKNOWN, why, [], counts)


def _consumed(info: _PodInfo, reqs: list[dict[str, Any]], config: ContractConfig) -> ObligationResult:
    """Share of this pod's recent pairings the router made blind to a closer comparable candidate."""
    obl = Obligation.CONSUMED.value
    judged = 0
    blind: list[Evidence] = []
    levels: dict[str, int] = {}
    for r in reqs:
        flags = _flags(r)
        level = r.get("pairing_level")
        is_blind = FlagName.TOPOLOGY_BLIND_PAIRING.value in flags
        if not is_blind and level in (None, "", "unknown"):
            continue
        judged += 1
        levels[str(level or "unknown")] = levels.get(str(level or "unknown"), 0) + 1
        if is_blind:
            blind.append(
                Evidence(
                    f"request/{r.get('trace_id')}",
                    f"topology-blind pairing: {flags[FlagName.TOPOLOGY_BLIND_PAIRING.value]}",
                    link=_link(r),
                )
            )
    counts: dict[str, int | float] = {
        "pairings": judged,
        "blind": len(blind),
        **{f"level_{k}": v for k, v in levels.items()},
    }
    if judged < max(1, config.min_pairings):
        return ObligationResult(
            obl, UNKNOWN, "no recent pairing with topology evidence for this pod", [], counts
        )
    share = len(blind) / judged
    counts["blind_share"] = round(share, 4)
    text = (
        f"{len(blind)} of {judged} recent pairing(s) topology-blind "
        f"({share:.0%}; threshold {config.blind_pairing_threshold:.0%})"
    )
    if share > config.blind_pairing_threshold:
        return ObligationResult(obl, BROKEN, text, blind[: config.max_links], counts)
    return ObligationResult(obl, OK, text, blind[: config.max_links], counts)


# ---------------------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------------------


def summary_dict(summary: Any) -> dict[str, Any]:
    """A request summary as its documented dict form, whatever it came as."""
    if isinstance(summary, Mapping):
        return dict(summary)
    if hasattr(summary, "to_dict"):
        return summary.to_dict()
    if is_dataclass(summary):
        return asdict(summary)  # type: ignore[arg-type]
    raise TypeError(f"not a request summary: {type(summary).__name__}")


def _leg(r: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    leg = r.get(name)
    return leg if isinstance(leg, Mapping) else {}


_RFC3339 = re.compile(r"Z$")


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not value:
        return None
    try:
        t = datetime.fromisoformat(_RFC3339.sub("+00:00", str(value)))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _recent(summaries: Iterable[Any], config: ContractConfig, now: datetime) -> list[dict[str, Any]]:
    out = []
    for s in summaries:
        d = summary_dict(s)
        if d.get("kv_transfer") is not None and not isinstance(d["kv_transfer"], Mapping):
            d["kv_transfer"] = summary_dict(d["kv_transfer"])
        if config.window_s is not None:
            t = _parse_time(d.get("start"))
            if t is None or (now - t).total_seconds() > config.window_s:
                continue
        out.append(d)
    return out
