"""Raw facts → the immutable `Topology`: rails, GPU↔NIC pairing, allocations, alignment and gaps.

Runs over the whole merged inventory at once, never per input, so that the result does not
depend on the order inputs arrived in; the readers (`read_k8s`, `read_smi`, `read_doc`) only
record what each input said.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from railtrace.topology import templates as tmpl
from railtrace.topology.facts import Facts
from railtrace.topology.k8s_keys import (
    BLOCK_LABELS,
    DRANET_NUMA_NODE,
    GCE_NETWORK_NAME,
    HOST_LABELS,
    MACHINE_LABELS,
    NVLINK_LABELS,
    POD_CLAIM_ANNOTATION,
    SUBBLOCK_LABELS,
    ZONE_LABELS,
)
from railtrace.topology.model import (
    ALIGNED,
    GPU,
    MISALIGNED,
    NIC,
    NOT_APPLICABLE,
    PAIR_CONFIG,
    PAIR_NAME,
    PAIR_NUMA,
    PAIR_PCIE_ROOT,
    PAIR_TOPO_PIX,
    PAIR_TOPO_PXB,
    UNKNOWN,
    Allocation,
    DiscoveryGap,
    Node,
    Pairing,
    Topology,
    unique,
)
from railtrace.topology.read_k8s import ByKind, Claims, claim_node, claim_pod_names

# Machine types whose GPU NICs cannot carry UCX RDMA (GPUDirect-TCPX/TCPXO): TCP is the expected path.
TCP_ONLY_MACHINES = re.compile(r"^(a3-highgpu|a3-megagpu|a3-edgegpu)", re.IGNORECASE)
RDMA_MACHINES = re.compile(
    r"^(a3-ultragpu|a4-highgpu|a4x-|p4d|p4de|p5|p5e|p5en|p6|standard_nd\w*isr|bm\.gpu\.)", re.IGNORECASE
)
_NIC_NAME_GPU = re.compile(r"^gpu(\d+)(rdma|ipvlan|nic|eth)(\d+)$", re.IGNORECASE)


def derive(facts: Facts, claims: Claims, rest: ByKind, sources: tuple[str, ...]) -> Topology:
    """The model of everything read. `claims` are the ResourceClaims the readers could read; `rest`
    the objects no reader took: ResourceClaimTemplates are checked, anything else is reported."""
    return _Derivation(facts).run(claims, rest, sources)


class _Derivation:
    """One pass over the merged facts; only the rails it finds are written back into them."""

    def __init__(self, facts: Facts) -> None:
        self.f = facts
        self.gpus = facts.gpus
        self.nics = facts.nics
        self.warnings = facts.warnings

    def run(self, claims: Claims, rest: ByKind, sources: tuple[str, ...]) -> Topology:
        f = self.f
        self._rails()
        pairings = self._pairings()
        allocations: list[Allocation] = []
        for obj, src in claims:
            f.safe(
                obj,
                src,
                lambda o, s: allocations.append(a) if (a := self._allocation(o, s, pairings)) else None,
            )
        allocations += self._doc_allocations(pairings)
        temps: list[Any] = []
        unallocated = [(o, s) for o, s in claims if not ((o.get("status") or {}).get("allocation"))]
        for obj, src in rest.pop("ResourceClaimTemplate", []) + unallocated:
            f.safe(
                obj,
                src,
                lambda o, _s: temps.append(
                    tmpl.check_template(
                        o, f.device_classes, list(self.gpus.values()), list(self.nics.values()), pairings
                    )
                ),
            )
        ignored = {kind: len(items) for kind, items in rest.items()}
        nodes = {name: self._finish_node(n) for name, n in f.nodes.items()}
        gaps = self._gaps(nodes, pairings)
        for p in pairings.values():
            if p.method is None:
                self.warnings.append(f"node {p.node}: {p.gpu} could not be paired with a NIC ({p.evidence})")
        if ignored:
            kinds = ", ".join(f"{k}×{v}" for k, v in sorted(ignored.items()))
            self.warnings.append(f"objects not used for topology: {kinds}")
        return Topology(
            nodes=nodes,
            gpus=tuple(
                sorted(
                    self.gpus.values(),
                    key=lambda g: (g.node, g.index if g.index is not None else 1 << 30, g.name),
                )
            ),
            nics=tuple(sorted(self.nics.values(), key=lambda n: (n.node, n.pci_address or "", n.name))),
            pairings=tuple(sorted(pairings.values(), key=lambda p: (p.node, p.gpu))),
            pods=f.pods,
            allocations=tuple(allocations),
            templates=tuple(temps),
            networks=f.networks,
            compute_domains=tuple(f.compute_domains),
            gaps=tuple(gaps),
            warnings=tuple(unique(self.warnings)),
            sources=sources,
        )

    # -- rails and pairing ---------------------------------------------------------------
    def _rails(self) -> None:
        """Rail per NIC: configuration, else the NIC's network attachment, else a GPU-named NIC; a VF
        without one of its own is on its PF's rail (a VF leaves the host through its PF's port)."""
        self._rails_own()
        for key, nic in list(self.nics.items()):
            if nic.rail or nic.function != "VF":
                continue
            pf = next(
                (
                    n
                    for n in self.nics.on(key[0])
                    if n.rail
                    and n is not nic
                    and (
                        (nic.pf_pci_address and n.pci_address == nic.pf_pci_address)
                        or (nic.pf and nic.pf in (n.if_name, n.rdma_device, n.name))
                    )
                ),
                None,
            )
            if pf is not None:
                self.nics[key] = replace(nic, rail=pf.rail, rail_source=f"PF {pf.label} ({pf.rail_source})")

    def _rails_own(self) -> None:
        for key, nic in list(self.nics.items()):
            if nic.rail:
                continue
            if nic.network:
                self.nics[key] = replace(nic, rail=nic.network, rail_source=GCE_NETWORK_NAME)
                continue
            for cand in (nic.if_name, nic.name):
                m = _NIC_NAME_GPU.match(cand or "")
                if m:
                    self.nics[key] = replace(
                        nic, rail=f"rdma-{int(m.group(1))}", rail_source=f"NIC name {cand}"
                    )
                    break

    def _pairings(self) -> dict[tuple[str, str], Pairing]:
        out: dict[tuple[str, str], Pairing] = {}
        for (node, gname), gpu in self.gpus.items():
            nics = [n for n in self.nics.on(node) if n.rdma is not False]
            out[(node, gname)] = self._pair_one(gpu, nics)
        return out

    def _pair_one(self, gpu: GPU, nics: list[NIC]) -> Pairing:
        """The first method that finds a NIC (docs/topology.md, Derivation), else why none did."""
        node = gpu.node
        cfg = self.f.config_pairs.get((node, gpu.name)) or (
            self.f.config_pairs.get((node, str(gpu.index))) if gpu.index is not None else None
        )
        if cfg:
            return Pairing(node, gpu.name, tuple(cfg), PAIR_CONFIG, "railtrace topology names the GPU's NIC")
        if gpu.pcie_root:
            hits = [n.name for n in nics if n.pcie_root and n.pcie_root == gpu.pcie_root]
            if hits:
                return Pairing(node, gpu.name, tuple(hits), PAIR_PCIE_ROOT, f"pcieRoot {gpu.pcie_root}")
        smi = self.f.nodes.get(node, {}).get("smi")
        if smi is not None and gpu.index is not None:
            for code, method in (("PIX", PAIR_TOPO_PIX), ("PXB", PAIR_TOPO_PXB)):
                names = [nic for (i, nic), c in smi.links.items() if i == gpu.index and c == code]
                hits = [n.name for n in nics if n.aliases() & set(names)]
                if hits:
                    return Pairing(
                        node, gpu.name, tuple(hits), method, f"nvidia-smi topo -m GPU{gpu.index} {code}"
                    )
        if gpu.index is not None:
            hits = [
                n.name
                for n in nics
                if any(
                    (m := _NIC_NAME_GPU.match(c or "")) and int(m.group(1)) == gpu.index
                    for c in (n.if_name, n.name)
                )
            ]
            if hits:
                return Pairing(
                    node, gpu.name, tuple(hits), PAIR_NAME, f"NIC named after GPU index {gpu.index}"
                )
        if gpu.numa is not None:
            hits = [n.name for n in nics if n.numa is not None and n.numa == gpu.numa]
            if hits:
                return Pairing(
                    node,
                    gpu.name,
                    tuple(hits),
                    PAIR_NUMA,
                    f"NUMA {gpu.numa} ({gpu.numa_source}); NIC {DRANET_NUMA_NODE}",
                )
        why = []
        if not nics:
            why.append("no RDMA NIC known on the node")
        else:
            if not gpu.pcie_root or not any(n.pcie_root == gpu.pcie_root for n in nics):
                why.append("no NIC shares its pcieRoot" if gpu.pcie_root else "GPU publishes no pcieRoot")
            if gpu.numa is None:
                why.append("GPU NUMA unknown")
            elif not any(n.numa == gpu.numa for n in nics):
                why.append(f"no NIC on NUMA {gpu.numa}")
        return Pairing(node, gpu.name, (), None, "; ".join(why) or "no pairing evidence")

    # -- allocations ---------------------------------------------------------------------
    def _allocation(
        self, obj: dict[str, Any], src: str, pairings: Mapping[tuple[str, str], Pairing]
    ) -> Allocation | None:
        md = obj.get("metadata") or {}
        alloc = (obj.get("status") or {}).get("allocation") or {}
        results = ((alloc.get("devices") or {}).get("results")) or []
        if not results:
            return None
        node = claim_node(obj)
        gpus: list[tuple[str, str]] = []
        nics: list[tuple[str, str]] = []
        res_out = []
        for r in results:
            driver, pool, dev = str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", ""))
            res_out.append({k: str(v) for k, v in r.items() if v is not None})
            hit = self.f.devices.get((driver, pool, dev))
            if hit is None:
                continue
            kind, dnode, dname = hit
            node = node or dnode
            if kind == "gpu":
                gpus.append((dnode, dname))
            elif kind == "nic":
                nics.append((dnode, dname))
        alignment, evidence = self._alignment(gpus, nics, pairings)
        return Allocation(
            claim=str(md.get("name", "")),
            namespace=md.get("namespace"),
            pods=tuple(claim_pod_names(self.f, obj)),
            node=node,
            gpus=unique(g for _, g in gpus),
            nics=unique(n for _, n in nics),
            results=tuple(res_out),
            alignment=alignment,
            evidence=tuple(evidence),
            pod_claim_name=(md.get("annotations") or {}).get(POD_CLAIM_ANNOTATION),
        )

    def _alignment(
        self,
        gpus: list[tuple[str, str]],
        nics: list[tuple[str, str]],
        pairings: Mapping[tuple[str, str], Pairing],
    ) -> tuple[str, list[str]]:
        """Does every allocated GPU hold at least one of its own NICs? Evidence names both devices."""
        evidence: list[str] = []
        statuses: list[str] = []
        if not gpus or not nics:
            return NOT_APPLICABLE, [
                "holds " + ("no GPU" if not gpus else "no NIC") + "; alignment is judged per pod"
            ]
        for gnode, gname in gpus:
            p = pairings.get((gnode, gname))
            gpu = self.gpus.get((gnode, gname))
            if gpu is None or p is None or p.method is None:
                statuses.append(UNKNOWN)
                evidence.append(f"{gname}: no pairing known ({p.evidence if p else 'not in topology'})")
                continue
            got = [self.nics[k] for k in nics if k[0] == gnode and k in self.nics]
            good = [n for n in got if n.name in p.nics]
            desc_g = _describe_gpu(gpu, p.method)
            if good:
                statuses.append(ALIGNED)
                evidence.append(
                    f"{desc_g} with {', '.join(_describe_nic(n, p.method) for n in good)} ({p.method})"
                )
            else:
                statuses.append(MISALIGNED)
                paired = ", ".join(self.nics[(gnode, n)].label for n in p.nics if (gnode, n) in self.nics)
                evidence.append(
                    f"{desc_g} allocated with "
                    f"{', '.join(_describe_nic(n, p.method) for n in got) or 'no NIC on its node'}; "
                    f"its NICs by {p.method}: {paired}"
                )
        if MISALIGNED in statuses:
            return MISALIGNED, evidence
        if statuses and all(s == ALIGNED for s in statuses):
            return ALIGNED, evidence
        return UNKNOWN, evidence

    def _doc_allocations(self, pairings: Mapping[tuple[str, str], Pairing]) -> list[Allocation]:
        out = []
        for pod, gnames, cnames in self.f.doc_allocs:
            node = pod.node or ""
            gpus = [(node, g.name) for g in (self._find_gpu(node, x) for x in gnames) if g]
            nics = [(node, n.name) for n in (self._find_nic(node, x) for x in cnames) if n]
            for x in gnames:
                if not self._find_gpu(node, x):
                    self.warnings.append(f"pod {pod.name}: GPU {x} not on node {node}")
            for x in cnames:
                if not self._find_nic(node, x):
                    self.warnings.append(f"pod {pod.name}: NIC {x} not on node {node}")
            alignment, evidence = self._alignment(gpus, nics, pairings)
            out.append(
                Allocation(
                    claim=f"railtrace:{pod.name}",
                    namespace=pod.namespace,
                    pods=(pod.name,),
                    node=node or None,
                    gpus=unique(g for _, g in gpus),
                    nics=unique(n for _, n in nics),
                    results=(),
                    alignment=alignment,
                    evidence=tuple(evidence),
                )
            )
        return out

    def _find_gpu(self, node: str, ref: str) -> GPU | None:
        g = self.gpus.get((node, ref))
        if g:
            return g
        m = re.search(r"(\d+)$", ref)
        hits = [g for g in self.gpus.on(node) if m and g.index == int(m.group(1))]
        return hits[0] if len(hits) == 1 else None

    def _find_nic(self, node: str, ref: str) -> NIC | None:
        return self.nics.get((node, ref)) or next((c for c in self.nics.on(node) if ref in c.aliases()), None)

    # -- nodes and gaps ------------------------------------------------------------------
    def _finish_node(self, n: dict[str, Any]) -> Node:
        labels: dict[str, str] = n["labels"]

        def pick(cfg: str, label_keys: tuple[str, ...], attr: str) -> tuple[str | None, str | None]:
            if n.get("cfg_" + cfg) is not None:
                return n["cfg_" + cfg], "railtrace topology"
            for k in label_keys:
                if labels.get(k):
                    return labels[k], k
            if n.get("attr_" + attr):
                value: tuple[str, str] = n["attr_" + attr]  # (value, the attribute key that gave it)
                return value
            return None, None

        zone, _ = pick("zone", ZONE_LABELS, "zone")
        block, _ = pick("block", BLOCK_LABELS, "block")
        subblock, _ = pick("subblock", SUBBLOCK_LABELS, "subblock")
        host, _ = pick("host", HOST_LABELS, "host")
        nvl, nvl_src = pick("nvlink_domain", NVLINK_LABELS, "nvlink_domain")
        if nvl is None and n.get("cd_domain"):
            nvl, nvl_src = n["cd_domain"], "ComputeDomain status.nodes[].cliqueID"
        machine, _ = pick("machine_type", MACHINE_LABELS, "machine_type")
        if nvl is None and subblock and machine and machine.lower().startswith("a4x"):
            nvl, nvl_src = subblock, "A4X: one sub-block is one NVL72 domain"
        rdma, reason = self._rdma_path(n["name"], n.get("cfg_rdma"), machine)
        return Node(
            name=n["name"],
            labels=labels,
            addresses=unique(n["addresses"]),
            zone=zone,
            block=block,
            subblock=subblock,
            host=host,
            nvlink_domain=nvl,
            nvlink_source=nvl_src,
            machine_type=machine,
            rdma_path=rdma,
            rdma_reason=reason,
            sources=tuple(n["sources"]),
        )

    def _rdma_path(self, node: str, cfg: bool | None, machine: str | None) -> tuple[bool | None, str]:
        if cfg is not None:
            return cfg, "railtrace topology `rdma`"
        if machine and TCP_ONLY_MACHINES.match(machine):
            return False, f"{machine} uses GPUDirect-TCPX/TCPXO, which UCX cannot use: TCP is expected"
        rdma_nics = [n.label for n in self.nics.on(node) if n.rdma]
        if rdma_nics:
            return True, f"RDMA NICs {', '.join(sorted(rdma_nics)[:4])}{'…' if len(rdma_nics) > 4 else ''}"
        if machine and RDMA_MACHINES.match(machine):
            return True, f"{machine} is an RDMA machine type"
        return None, "no RDMA NIC and no machine type known"

    def _gaps(
        self, nodes: Mapping[str, Node], pairings: Mapping[tuple[str, str], Pairing]
    ) -> list[DiscoveryGap]:
        gaps = []
        for model_node in nodes.values():
            missing = [k for k in ("block", "subblock", "host") if getattr(model_node, k) is None]
            red = self.f.nodes[model_node.name].get("redacted")
            note = f"values redacted: {', '.join(sorted(red))}" if red else ""
            if missing and (self.gpus.on(model_node.name) or self.nics.on(model_node.name)):
                gaps.append(DiscoveryGap(f"node/{model_node.name}", tuple(missing), note))
        for (node, driver), names in sorted(self.f.unknown_devices.items()):
            shown = ", ".join(names[:4]) + ("…" if len(names) > 4 else "")
            gaps.append(
                DiscoveryGap(
                    f"driver/{node}/{driver}",
                    ("driver",),
                    f"{len(names)} device(s) of driver {driver} not read ({shown}): railtrace does not "
                    "know this driver's attributes, so it cannot tell GPU, NIC or neither",
                )
            )
        for (node, name), g in self.gpus.items():
            missing = [k for k, v in (("pcieRoot", g.pcie_root), ("numa", g.numa)) if v is None]
            if g.pcie_root is None and g.numa is None:
                gaps.append(
                    DiscoveryGap(f"gpu/{node}/{name}", tuple(missing), pairings[(node, name)].evidence)
                )
        for (node, _name), n in self.nics.items():
            if n.rdma is False:
                continue
            missing = [
                k for k, v in (("pcieRoot", n.pcie_root), ("numaNode", n.numa), ("rail", n.rail)) if v is None
            ]
            if missing:
                gaps.append(DiscoveryGap(f"nic/{node}/{n.label}", tuple(missing)))
        return gaps


def _describe_gpu(g: GPU, method: str) -> str:
    if method == PAIR_NUMA:
        return f"{g.name} ({g.pci_bus_id or '?'}, NUMA {g.numa})"
    if method == PAIR_PCIE_ROOT:
        return f"{g.name} (pcieRoot {g.pcie_root})"
    return g.name


def _describe_nic(n: NIC, method: str) -> str:
    if method == PAIR_NUMA:
        return f"{n.label} ({n.name}, NUMA {n.numa})"
    if method == PAIR_PCIE_ROOT:
        return f"{n.label} ({n.name}, pcieRoot {n.pcie_root})"
    return n.label
