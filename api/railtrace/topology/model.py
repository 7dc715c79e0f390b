"""The topology model: one immutable picture of the fleet that verdicts and identity resolution read.

Everything here is derived by `TopologyBuilder.build()`; nothing is mutated afterwards, so a
`Topology` can be shared between threads and swapped atomically by `TopologyHolder`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from railtrace_tracing.semconv import TopologyLevel

# Pairing methods, most trustworthy first (recorded per GPU so that a verdict can say how it knew).
PAIR_CONFIG = "config"  # railtrace YAML says so
PAIR_PCIE_ROOT = "pcieRoot"  # resource.kubernetes.io/pcieRoot equal on GPU and NIC
PAIR_TOPO_PIX = "topo:PIX"  # nvidia-smi topo -m
PAIR_TOPO_PXB = "topo:PXB"
PAIR_NAME = "name"  # NIC named after its GPU: gpu3rdma0, gpu3ipvlan1
PAIR_NUMA = "numa"  # same NUMA node (Grace, VF NICs): coarse, may list several NICs

ALIGNED = "aligned"
MISALIGNED = "misaligned"
UNKNOWN = "unknown"
NOT_APPLICABLE = "n/a"


@dataclass(frozen=True, slots=True)
class GPU:
    node: str
    name: str  # DRA device name (gpu-0) or gpu-<index> from nvidia-smi / nccl output
    index: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    pcie_root: str | None = None
    numa: int | None = None
    numa_source: str | None = None
    product: str | None = None
    driver: str | None = None
    pool: str | None = None
    nvlink_domain: str | None = None  # gpuMemoryFabricId / clique when published per device
    sources: tuple[str, ...] = ()
    decided_by: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)  # field -> source


@dataclass(frozen=True, slots=True)
class NIC:
    node: str
    name: str  # DRA device name (pci-0000-10-1b-0, gpu0rdma0) or the RDMA device name
    rdma: bool | None = None
    rdma_device: str | None = None  # mlx5_3, rdmap16s27: what UCX names in `rc_mlx5/mlx5_3:1`
    if_name: str | None = None
    pci_address: str | None = None
    pcie_root: str | None = None
    numa: int | None = None
    numa_source: str | None = None
    rail: str | None = None
    rail_source: str | None = None
    network: str | None = None
    virtual: bool | None = None
    product: str | None = None
    driver: str | None = None
    pool: str | None = None
    sources: tuple[str, ...] = ()
    link_type: str | None = None  # infiniband | ethernet (the port's link layer)
    function: str | None = None  # PF | VF when the NIC is an SR-IOV function
    pf: str | None = None  # the VF's physical function: interface or RDMA device name
    pf_pci_address: str | None = None
    rate: str | None = None  # port rate as the kernel reports it: "400 Gb/sec (4X NDR)"
    decided_by: Mapping[str, str] = field(default_factory=dict, hash=False, compare=False)  # field -> source

    @property
    def label(self) -> str:
        """The name an operator and UCX know the NIC by."""
        return self.rdma_device or self.if_name or self.name

    def aliases(self) -> set[str]:
        return {a for a in (self.name, self.rdma_device, self.if_name, self.pci_address) if a}

    def describe(self) -> str:
        """Label plus what an operator needs to find it: `mlx5_5 (VF 0000:3b:00.2 of PF ibp59s0)`."""
        if self.function == "VF":
            pf = self.pf or self.pf_pci_address
            return f"{self.label} (VF {self.pci_address or self.name}{f' of PF {pf}' if pf else ''})"
        if self.function == "PF":
            return f"{self.label} (PF {self.pci_address or self.name})"
        return self.label


@dataclass(frozen=True, slots=True)
class Pairing:
    """The NICs that belong to one GPU, and how that was established."""

    node: str
    gpu: str
    nics: tuple[str, ...]
    method: str | None  # one of PAIR_*; None when nothing could pair it
    evidence: str


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    addresses: tuple[str, ...] = ()
    zone: str | None = None
    block: str | None = None
    subblock: str | None = None
    host: str | None = None
    nvlink_domain: str | None = None
    nvlink_source: str | None = None
    machine_type: str | None = None
    rdma_path: bool | None = None  # can KV bytes go over RDMA between this node and others?
    rdma_reason: str = ""
    sources: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    namespace: str | None = None
    node: str | None = None
    ips: tuple[str, ...] = ()
    host_ip: str | None = None
    host_network: bool = False
    ports: tuple[int, ...] = ()
    claims: tuple[str, ...] = ()  # ResourceClaim names (same namespace)
    role: str | None = None  # prefill | decode when labelled
    engine_id: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    sources: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Allocation:
    """One ResourceClaim's allocated devices, joined to the slices, and whether GPU and NIC agree."""

    claim: str
    namespace: str | None
    pods: tuple[str, ...]
    node: str | None
    gpus: tuple[str, ...]
    nics: tuple[str, ...]
    results: tuple[dict[str, str], ...]
    alignment: str  # ALIGNED | MISALIGNED | UNKNOWN | NOT_APPLICABLE
    evidence: tuple[str, ...] = ()
    pod_claim_name: str | None = None  # the pod's name for the claim (resource.kubernetes.io/pod-claim-name)


@dataclass(frozen=True, slots=True)
class TemplateCheck:
    """Offline judgement of a ResourceClaimTemplate (or claim spec): does it keep GPU and NIC together?"""

    kind: str
    name: str
    namespace: str | None
    requests: tuple[dict[str, Any], ...]
    constraints: tuple[dict[str, Any], ...]
    alignment: str
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DiscoveryGap:
    """An attribute that pairing or routing needs and the object does not publish."""

    object: str  # "node/<name>", "gpu/<node>/<dev>", "nic/<node>/<dev>"
    missing: tuple[str, ...]
    note: str = ""


_LEVEL_KEYS = (
    (TopologyLevel.NVLINK_DOMAIN, "nvlink_domain"),
    (TopologyLevel.SUBBLOCK, "subblock"),
    (TopologyLevel.BLOCK, "block"),
    (TopologyLevel.ZONE, "zone"),
)


@dataclass(frozen=True)
class Topology:
    nodes: Mapping[str, Node] = field(default_factory=dict)
    gpus: tuple[GPU, ...] = ()
    nics: tuple[NIC, ...] = ()
    pairings: tuple[Pairing, ...] = ()
    pods: Mapping[str, Pod] = field(default_factory=dict)  # key "<namespace>/<name>" or "<name>"
    allocations: tuple[Allocation, ...] = ()
    templates: tuple[TemplateCheck, ...] = ()
    networks: Mapping[str, str] = field(default_factory=dict)  # network name -> device mode
    compute_domains: tuple[str, ...] = ()
    gaps: tuple[DiscoveryGap, ...] = ()
    warnings: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Lookup indexes; built once, never mutated (object.__setattr__ because the class is frozen).
        gpus: dict[tuple[str, str], GPU] = {(g.node, g.name): g for g in self.gpus}
        nics: dict[tuple[str, str], NIC] = {(n.node, n.name): n for n in self.nics}
        pairs = {(p.node, p.gpu): p for p in self.pairings}
        by_ip: dict[str, list[Pod]] = {}
        by_name: dict[str, list[Pod]] = {}
        for pod in self.pods.values():
            for ip in pod.ips:
                by_ip.setdefault(ip, []).append(pod)
            by_name.setdefault(pod.name, []).append(pod)
        node_by_addr: dict[str, str] = {}
        for node in self.nodes.values():
            for addr in (*node.addresses, node.host):
                if addr:
                    node_by_addr.setdefault(addr, node.name)
        gpus_by_node: dict[str, list[GPU]] = {}
        for g in self.gpus:
            gpus_by_node.setdefault(g.node, []).append(g)
        nics_by_node: dict[str, list[NIC]] = {}
        for n in self.nics:
            nics_by_node.setdefault(n.node, []).append(n)
        by_engine: dict[str, list[Pod]] = {}
        for pod in self.pods.values():
            if pod.engine_id:
                by_engine.setdefault(pod.engine_id, []).append(pod)
        alloc_by_pod: dict[str, list[Allocation]] = {}
        for alloc in self.allocations:
            for pod_name in alloc.pods:
                alloc_by_pod.setdefault(pod_name, []).append(alloc)
        for name, value in (
            ("_gpus", gpus),
            ("_nics", nics),
            ("_pairs", pairs),
            ("_pods_by_ip", by_ip),
            ("_pods_by_name", by_name),
            ("_node_by_addr", node_by_addr),
            ("_alloc_by_pod", alloc_by_pod),
            ("_gpus_by_node", gpus_by_node),
            ("_nics_by_node", nics_by_node),
            ("_pods_by_engine", by_engine),
            ("_resolved", {}),  # identity.resolve_endpoint's answers: this topology never changes
        ):
            object.__setattr__(self, name, value)

    # -- lookups --------------------------------------------------------------------------
    def node(self, name: str | None) -> Node | None:
        if not name:
            return None
        return self.nodes.get(name) or self.nodes.get(self._node_by_addr.get(name, ""))  # type: ignore[attr-defined]

    def gpu(self, node: str | None, name: str | None) -> GPU | None:
        if not node or not name:
            return None
        return self._gpus.get((node, name))  # type: ignore[attr-defined]

    def nic(self, node: str | None, name: str | None) -> NIC | None:
        if not node or not name:
            return None
        return self._nics.get((node, name))  # type: ignore[attr-defined]

    def gpus_on(self, node: str) -> list[GPU]:
        return list(self._gpus_by_node.get(node, []))  # type: ignore[attr-defined]

    def nics_on(self, node: str) -> list[NIC]:
        return list(self._nics_by_node.get(node, []))  # type: ignore[attr-defined]

    def pods_with_engine(self, engine_id: str) -> list[Pod]:
        return list(self._pods_by_engine.get(engine_id, []))  # type: ignore[attr-defined]

    def pairing(self, node: str | None, gpu: str | None) -> Pairing | None:
        if not node or not gpu:
            return None
        return self._pairs.get((node, gpu))  # type: ignore[attr-defined]

    def find_gpu(self, node: str | None, ref: str | None) -> GPU | None:
        """A GPU the way spans name it: `gpu-3`, `GPU3`, `3`, `cuda:3`, `cuda/dev[3]`, a UUID, a bus id."""
        if not node or ref is None:
            return None
        ref = str(ref).strip()
        on_node = self.gpus_on(node)
        for g in on_node:
            if ref in (g.name, g.uuid, g.pci_bus_id):
                return g
        idx = _index_of(ref)
        if idx is not None:
            hits = [g for g in on_node if g.index == idx]
            if len(hits) == 1:
                return hits[0]
        return None

    def find_nic(self, node: str | None, ref: str | None) -> NIC | None:
        """A NIC by device name, RDMA device (`mlx5_3`), interface or PCI address; UCX `:port` is dropped."""
        if not node or not ref:
            return None
        ref = ref.split("/")[-1] if "/" in ref and not ref.startswith("pci") else ref
        ref = ref.split(":")[0] if ":" in ref and not _looks_pci(ref) else ref
        for n in self.nics_on(node):
            if ref in n.aliases():
                return n
        return None

    def pods_named(self, name: str) -> list[Pod]:
        if "/" in name:
            pod = self.pods.get(name)
            if pod:
                return [pod]
            # `namespace/pod` (EPP endpoint ids) for a pod described without a namespace.
            ns, _, short = name.partition("/")
            return [p for p in self._pods_by_name.get(short, []) if p.namespace in (None, ns)]  # type: ignore[attr-defined]
        return list(self._pods_by_name.get(name, []))  # type: ignore[attr-defined]

    def pods_at(self, ip: str) -> list[Pod]:
        return list(self._pods_by_ip.get(ip, []))  # type: ignore[attr-defined]

    def allocations_of(self, pod: Pod) -> list[Allocation]:
        keys = {pod.name, f"{pod.namespace}/{pod.name}" if pod.namespace else pod.name}
        out: list[Allocation] = []
        for key in keys:
            for a in self._alloc_by_pod.get(key, []):  # type: ignore[attr-defined]
                if a not in out:
                    out.append(a)
        return out

    def paired_nics(self, node: str | None, gpu: str | None) -> tuple[list[NIC], Pairing | None]:
        p = self.pairing(node, gpu)
        if not p or not p.nics:
            return [], p
        return [n for n in (self.nic(node, name) for name in p.nics) if n], p

    def level_between(self, a: str | None, b: str | None) -> tuple[TopologyLevel, str]:
        """Nearest shared level of two nodes (semconv.TopologyLevel) and why.

        A level both nodes lack says nothing; a level only one has means "not shared"
        (labels are published for every member). Unknown nodes give UNKNOWN.
        """
        na, nb = self.node(a), self.node(b)
        if not na or not nb:
            return TopologyLevel.UNKNOWN, f"node {a if not na else b!r} not in the topology"
        if na.name == nb.name or (na.host and na.host == nb.host):
            return TopologyLevel.SAME_HOST, f"{na.name} and {nb.name} are the same host"
        decided = False
        for level, attr in _LEVEL_KEYS:
            va, vb = getattr(na, attr), getattr(nb, attr)
            if va is None and vb is None:
                continue
            decided = True
            if va is not None and va == vb:
                return level, f"{na.name} and {nb.name} share {attr} {va}"
        if decided and na.zone is not None and nb.zone is not None:
            return TopologyLevel.FAR, f"{na.name} zone {na.zone} != {nb.name} zone {nb.zone}"
        return TopologyLevel.UNKNOWN, f"no shared topology label known for {na.name} and {nb.name}"

    # -- output ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The documented JSON shape (docs/topology.md)."""
        nodes_out = []
        for node in sorted(self.nodes.values(), key=lambda n: n.name):
            d = asdict(node)
            d["labels"] = dict(node.labels)
            d["addresses"] = list(node.addresses)
            d["sources"] = list(node.sources)
            d["gpus"] = [_clean(asdict(g)) for g in self.gpus_on(node.name)]
            d["nics"] = [_clean(asdict(n)) for n in self.nics_on(node.name)]
            d["pairings"] = [
                _clean(asdict(p))
                for p in (self.pairing(node.name, g.name) for g in self.gpus_on(node.name))
                if p
            ]
            for g in d["gpus"]:
                g.pop("node", None)
            for n in d["nics"]:
                n.pop("node", None)
            for p in d["pairings"]:
                p.pop("node", None)
            nodes_out.append(d)
        rails: dict[str, list[str]] = {}
        for n in self.nics:
            if n.rail:
                rails.setdefault(n.rail, []).append(f"{n.node}/{n.label}")
        domains: dict[str, list[str]] = {}
        for node in self.nodes.values():
            if node.nvlink_domain:
                domains.setdefault(node.nvlink_domain, []).append(node.name)
        blocks: dict[str, dict[str, list[str]]] = {}
        for node in self.nodes.values():
            if node.block or node.subblock:
                blocks.setdefault(node.block or "?", {}).setdefault(node.subblock or "?", []).append(
                    node.name
                )
        return {
            "nodes": nodes_out,
            "rails": {k: sorted(v) for k, v in sorted(rails.items())},
            "nvlink_domains": {k: sorted(v) for k, v in sorted(domains.items())},
            "blocks": blocks,
            "networks": dict(self.networks),
            "compute_domains": list(self.compute_domains),
            "pods": [
                _clean(asdict(p))
                for p in sorted(self.pods.values(), key=lambda p: (p.namespace or "", p.name))
            ],
            "allocations": [_clean(asdict(a)) for a in self.allocations],
            "templates": [_clean(asdict(t)) for t in self.templates],
            "discovery_gaps": [_clean(asdict(g)) for g in self.gaps],
            "warnings": list(self.warnings),
            "sources": list(self.sources),
        }


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    """JSON-friendly: tuples to lists, mappings to dicts."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, tuple):
            v = [dict(x) if isinstance(x, Mapping) else x for x in v]
        elif isinstance(v, Mapping):
            v = dict(v)
        out[k] = v
    return out


def _looks_pci(ref: str) -> bool:
    import re

    return bool(re.fullmatch(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]", ref))


def _index_of(ref: str) -> int | None:
    import re

    m = re.fullmatch(r"(?:gpu[-_]?|cuda:?|cuda/dev\[|cuda/gpu|dev\[)?(\d+)\]?", ref, re.IGNORECASE)
    return int(m.group(1)) if m else None


def unique(items: Iterable[str]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for i in items:
        if i:
            seen.setdefault(i, None)
    return tuple(seen)
