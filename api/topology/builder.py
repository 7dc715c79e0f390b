"""TopologyBuilder: collects raw inputs and derives the immutable `Topology` from all of them at once.

Inputs are kept by identity (kind, namespace, name) so a live source can add, replace and remove
objects as they change and call `build()` again; derivation (pairing, rails, allocations) always
runs over the whole set, never incrementally, so the result never depends on arrival order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Generic, TypeVar

from railtrace.topology import templates as tmpl
from railtrace.topology.k8s_keys import (
    BLOCK_LABELS,
    DRANET_IF_NAME,
    DRANET_IS_SRIOV_VF,
    DRANET_NIC_KEYS,
    DRANET_NUMA_NODE,
    DRANET_PCI_ADDRESS,
    DRANET_PCI_DEVICE,
    DRANET_RDMA,
    DRANET_RDMA_DEVICE,
    DRANET_SRIOV,
    DRANET_VIRTUAL,
    GCE_NETWORK_NAME,
    GKE_RDMA_DRIVER,
    GPU_DRIVERS,
    HOST_LABELS,
    IB_DRIVER,
    MACHINE_LABELS,
    NIC_DRIVERS,
    NODE_DEVICE_ATTRIBUTES,
    NON_NIC_DRIVERS,
    NVLINK_LABELS,
    PCI_BUS_ID,
    PCIE_ROOT,
    POD_CLAIM_ANNOTATION,
    ROLE_LABELS,
    SRIOV_DRIVER,
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
    Pod,
    Topology,
    unique,
)
from railtrace.topology.nvsmi import TopoMatrix, parse_nccl_devices, parse_topo_matrix

_T = TypeVar("_T")

LINK_TYPES = {"ib": "infiniband", "infiniband": "infiniband", "eth": "ethernet", "ethernet": "ethernet"}
COLLECT_SOURCE = "node (railtrace topology collect)"

# Machine types whose GPU NICs cannot carry UCX RDMA (GPUDirect-TCPX/TCPXO): TCP is the expected path.
TCP_ONLY_MACHINES = re.compile(r"^(a3-highgpu|a3-megagpu|a3-edgegpu)", re.IGNORECASE)
RDMA_MACHINES = re.compile(
    r"^(a3-ultragpu|a4-highgpu|a4x-|p4d|p4de|p5|p5e|p5en|p6|standard_nd\w*isr|bm\.gpu\.)", re.IGNORECASE
)
_NIC_NAME_GPU = re.compile(r"^gpu(\d+)(rdma|ipvlan|nic|eth)(\d+)$", re.IGNORECASE)
_RDMA_NAME = re.compile(r"^(mlx5_\w+|rdmap\w+|efa\w*|bnxt_re\w*|irdma\w*|ib\w+)$")
_REDACTED = {"", "redacted", "REDACTED", "unknown"}


def _attr_value(v: Any) -> Any:
    if isinstance(v, Mapping):
        for key in ("string", "int", "bool", "version"):
            if key in v:
                return v[key]
        return None
    return v


def _device_attrs(device: Mapping[str, Any], driver: str) -> dict[str, Any]:
    """Attributes with qualified names (unqualified ones live in the driver's domain); v1beta1 `basic` too."""
    raw = device.get("attributes")
    if raw is None and isinstance(device.get("basic"), Mapping):
        raw = device["basic"].get("attributes")
    out: dict[str, Any] = {}
    for k, v in (raw or {}).items():
        key = k if "/" in k else f"{driver}/{k}"
        out[key] = _attr_value(v)
    return out


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _numa(v: Any) -> int | None:
    """A NUMA id; the kernel's -1 means "no affinity" and says nothing."""
    n = _int(v)
    return n if n is not None and n >= 0 else None


def _meta(obj: Mapping[str, Any]) -> tuple[str, str | None, str]:
    md = obj.get("metadata") or {}
    return str(obj.get("kind", "")), md.get("namespace"), str(md.get("name") or md.get("generateName") or "")


def _grace_numa(bus_id: str | None) -> int | None:
    """Grace (GB200/GB300): PCI domains 0x00xx sit on socket 0, 0x01x on socket 1 (published slices' note)."""
    if not bus_id or ":" not in bus_id:
        return None
    try:
        domain = int(bus_id.split(":")[0], 16)
    except ValueError:
        return None
    return domain >> 4 if domain < 0x100 else None


class TopologyBuilder:
    """Add inputs in any order, then `build()`. Re-adding an object with the same identity replaces it."""

    def __init__(self) -> None:
        self._objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self._object_source: dict[tuple[str, str | None, str], str] = {}
        self._smi: dict[str, tuple[TopoMatrix, str]] = {}
        self._nccl: list[tuple[dict[str, Any], str]] = []
        self._docs: list[tuple[dict[str, Any], str]] = []
        self._warnings: list[str] = []
        self._sources: list[str] = []
        self._anon = 0

    # -- inputs --------------------------------------------------------------------------
    def add_source(self, source: str) -> None:
        if source not in self._sources:
            self._sources.append(source)

    def warn(self, message: str) -> None:
        self._warnings.append(message)

    def add_k8s_object(self, obj: Mapping[str, Any], source: str = "") -> None:
        """One Kubernetes object, or a `List` of them. Objects without `kind` are reported, not guessed."""
        if not isinstance(obj, Mapping):
            self.warn(f"{source or 'input'}: not a Kubernetes object (got {type(obj).__name__})")
            return
        kind, ns, name = _meta(obj)
        if (kind.endswith("List") or not kind) and isinstance(obj.get("items"), list):
            for item in obj["items"]:
                self.add_k8s_object(item, source)
            return
        if not kind:
            self.warn(f"{source or 'input'}: object without `kind` skipped")
            return
        if not name:
            self._anon += 1
            name = f"<unnamed-{self._anon}>"
        key = (kind, ns, name)
        self._objects[key] = dict(obj)
        self._object_source[key] = source

    def remove_k8s_object(self, obj: Mapping[str, Any]) -> None:
        kind, ns, name = _meta(obj)
        self._objects.pop((kind, ns, name), None)

    def add_nvidia_smi(self, text: str, node: str | None = None, source: str = "") -> None:
        """`nvidia-smi topo -m` of one host; without `node` it is attached to host `source` names."""
        matrix = parse_topo_matrix(text)
        node = node or "unknown-host"
        self._smi[node] = (matrix, source or "nvidia-smi topo -m")

    def add_nccl_devices(self, text: str, source: str = "") -> None:
        for rec in parse_nccl_devices(text):
            self._nccl.append((rec, source or "nccl-tests output"))

    def add_railtrace_doc(self, doc: Mapping[str, Any], source: str = "") -> None:
        if not isinstance(doc, Mapping):
            raise ValueError("railtrace topology document must be a mapping")
        for key in ("nodes", "pods"):
            if key in doc and not isinstance(doc[key], list):
                raise ValueError(f"railtrace topology `{key}` must be a list")
        self._docs.append((dict(doc), source or "railtrace topology"))

    # -- derivation ----------------------------------------------------------------------
    def build(self) -> Topology:
        return _Derivation(self).run()


class _ByNode(dict[tuple[str, str], _T], Generic[_T]):
    """Devices keyed (node, name) with a per-node view kept in step, so lookups stay linear in the fleet."""

    def __init__(self) -> None:
        super().__init__()
        self._by_node: dict[str, dict[str, _T]] = {}

    def __setitem__(self, key: tuple[str, str], value: _T) -> None:
        super().__setitem__(key, value)
        self._by_node.setdefault(key[0], {})[key[1]] = value

    def on(self, node: str) -> list[_T]:
        return list(self._by_node.get(node, {}).values())


class _Derivation:
    """One pass over everything the builder holds."""

    def __init__(self, b: TopologyBuilder) -> None:
        self.b = b
        self.warnings: list[str] = list(b._warnings)
        self.nodes: dict[str, dict[str, Any]] = {}
        self.gpus: _ByNode[GPU] = _ByNode()
        self.nics: _ByNode[NIC] = _ByNode()
        self.devices: dict[
            tuple[str, str, str], tuple[str, str, str]
        ] = {}  # (driver,pool,dev)->(kind,node,name)
        self.pods: dict[str, Pod] = {}
        self.networks: dict[str, str] = {}
        self.compute_domains: list[str] = []
        self.device_classes: dict[str, str] = {}
        self.config_pairs: dict[tuple[str, str], list[str]] = {}
        self.unknown_devices: dict[tuple[str, str], list[str]] = {}  # (node, driver) -> device names
        self.ignored: dict[str, int] = {}
        self.pod_sources: set[str] = set()

    def node(self, name: str, source: str = "") -> dict[str, Any]:
        n = self.nodes.setdefault(name, {"name": name, "labels": {}, "addresses": [], "sources": []})
        if source and source not in n["sources"]:
            n["sources"].append(source)
        return n

    def run(self) -> Topology:
        objs = list(self.b._objects.items())
        by_kind: dict[str, list[tuple[dict[str, Any], str]]] = {}
        for key, obj in objs:
            by_kind.setdefault(key[0], []).append((obj, self.b._object_source.get(key, "")))
        for obj, src in by_kind.pop("Node", []):
            self._safe(obj, src, self._k8s_node)
        for obj, src in by_kind.pop("DeviceClass", []):
            self._safe(obj, src, lambda o, _s: self._device_class(o))
        for obj, src in by_kind.pop("ResourceSlice", []):
            self._safe(obj, src, self._slice)
        for obj, src in by_kind.pop("ComputeDomain", []):
            self._safe(obj, src, self._compute_domain)
        for kind in ("GKENetworkParamSet", "Network"):
            for obj, src in by_kind.pop(kind, []):
                self._safe(obj, src, lambda o, _s: self._network(o))
        for node, (matrix, src) in self.b._smi.items():
            self._smi(node, matrix, src)
        for doc, src in self.b._docs:
            self._safe(doc, src, self._doc)
        pod_objs = by_kind.pop("Pod", [])
        self.pod_sources = {src for _obj, src in pod_objs}
        for obj, src in pod_objs:
            self._safe(obj, src, self._pod)
        claims = [
            (o, s)
            for o, s in by_kind.pop("ResourceClaim", [])
            if self._safe(o, s, self._claim_pods) and self._safe(o, s, self._claim_placeholders)
        ]
        self._nccl()
        self._rails()
        pairings = self._pairings()
        allocations: list[Allocation] = []
        for obj, src in claims:
            self._safe(
                obj,
                src,
                lambda o, s: allocations.append(a) if (a := self._allocation(o, s, pairings)) else None,
            )
        allocations += self._doc_allocations(pairings)
        temps: list[Any] = []
        unallocated = [(o, s) for o, s in claims if not ((o.get("status") or {}).get("allocation"))]
        for obj, src in by_kind.pop("ResourceClaimTemplate", []) + unallocated:
            self._safe(
                obj,
                src,
                lambda o, _s: temps.append(
                    tmpl.check_template(
                        o, self.device_classes, list(self.gpus.values()), list(self.nics.values()), pairings
                    )
                ),
            )
        for kind, items in by_kind.items():
            self.ignored[kind] = len(items)
        nodes = {name: self._finish_node(n) for name, n in self.nodes.items()}
        gaps = self._gaps(nodes, pairings)
        for p in pairings.values():
            if p.method is None:
                self.warnings.append(f"node {p.node}: {p.gpu} could not be paired with a NIC ({p.evidence})")
        if self.ignored:
            kinds = ", ".join(f"{k}×{v}" for k, v in sorted(self.ignored.items()))
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
            pods=self.pods,
            allocations=tuple(allocations),
            templates=tuple(temps),
            networks=self.networks,
            compute_domains=tuple(self.compute_domains),
            gaps=tuple(gaps),
            warnings=tuple(unique(self.warnings)),
            sources=tuple(self.b._sources),
        )

    def _safe(self, obj: Any, src: str, fn: Any) -> bool:
        """Run one object's derivation; a malformed object is reported and costs nothing else."""
        try:
            fn(obj, src)
            return True
        except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
            kind, _ns, name = _meta(obj) if isinstance(obj, Mapping) else ("entry", None, repr(obj)[:40])
            if isinstance(obj, Mapping) and not obj.get("metadata"):
                kind, name = kind or "entry", str(obj.get("name", "<unnamed>"))
            where = f" ({src})" if src else ""
            self.warnings.append(
                f"{kind or 'document'} {name}{where}: malformed, skipped ({type(exc).__name__}: {exc})"
            )
            return False

    # -- Kubernetes objects --------------------------------------------------------------
    def _k8s_node(self, obj: dict[str, Any], src: str) -> None:
        md = obj.get("metadata") or {}
        n = self.node(md.get("name", ""), src)
        n["labels"].update({str(k): str(v) for k, v in (md.get("labels") or {}).items()})
        for addr in (obj.get("status") or {}).get("addresses") or []:
            if addr.get("address"):
                n["addresses"].append(str(addr["address"]))

    def _device_class(self, obj: dict[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        for sel in (obj.get("spec") or {}).get("selectors") or []:
            m = re.search(
                r'device\.driver\s*==\s*["\']([^"\']+)', str((sel.get("cel") or {}).get("expression", ""))
            )
            if m:
                self.device_classes[name] = m.group(1)

    def _slice(self, obj: dict[str, Any], src: str) -> None:
        spec = obj.get("spec") or {}
        driver = str(spec.get("driver", ""))
        pool = str((spec.get("pool") or {}).get("name", ""))
        node_name = spec.get("nodeName")
        if not node_name:
            for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
                if ref.get("kind") == "Node":
                    node_name = ref.get("name")
        if not node_name:
            node_name = pool or None
            if node_name:
                self.warnings.append(
                    f"ResourceSlice {_meta(obj)[2]}: no nodeName; assumed node = pool {pool}"
                )
        if not node_name:
            self.warnings.append(f"ResourceSlice {_meta(obj)[2]}: no node; skipped")
            return
        nd = self.node(node_name, src)
        for dev in spec.get("devices") or []:
            name = str(dev.get("name", ""))
            attrs = _device_attrs(dev, driver)
            self._node_attrs(nd, attrs)
            kind = self._classify(driver, attrs)
            if kind == "gpu":
                g = self._gpu_from_attrs(node_name, name, driver, pool, attrs, src)
                self.gpus[(node_name, name)] = g
                self.devices[(driver, pool, name)] = ("gpu", node_name, name)
            elif kind == "nic":
                nic = self._nic_from_attrs(node_name, name, driver, pool, attrs, src)
                self.nics[(node_name, name)] = nic
                self.devices[(driver, pool, name)] = ("nic", node_name, name)
            else:
                self.devices[(driver, pool, name)] = ("other", node_name, name)
                if driver not in GPU_DRIVERS and driver not in NON_NIC_DRIVERS:
                    self.unknown_devices.setdefault((node_name, driver), []).append(name)

    @staticmethod
    def _classify(driver: str, attrs: Mapping[str, Any]) -> str:
        dtype = attrs.get(f"{driver}/type")
        if driver in GPU_DRIVERS:
            return "gpu" if dtype in (None, "gpu") else "other"  # MIG / vfio / channels are not whole GPUs
        if driver in NIC_DRIVERS or any(k in attrs for k in DRANET_NIC_KEYS):
            return "nic"
        return "other"

    def _node_attrs(self, nd: dict[str, Any], attrs: Mapping[str, Any]) -> None:
        """Node-level facts that drivers publish per device (GCE, OCI, Azure DRANET)."""
        for key, field_name in NODE_DEVICE_ATTRIBUTES.items():
            v = attrs.get(key)
            if v is None:
                continue
            if str(v) in _REDACTED:
                nd.setdefault("redacted", set()).add(key)
                continue
            nd.setdefault("attr_" + field_name, (str(v), key))

    def _gpu_from_attrs(
        self, node: str, name: str, driver: str, pool: str, attrs: Mapping[str, Any], src: str
    ) -> GPU:
        idx = _int(attrs.get(f"{driver}/index"))
        if idx is None:
            m = re.search(r"(\d+)$", name)
            idx = int(m.group(1)) if m else None
        bus = attrs.get(PCI_BUS_ID)
        numa = _int(attrs.get(f"{driver}/numa"))
        numa_source = f"{driver}/numa" if numa is not None else None
        product = attrs.get(f"{driver}/productName")
        if numa is None and product and re.search(r"\bG[BH]\d{3}\b", str(product)):
            numa = _grace_numa(bus)
            if numa is not None:
                numa_source = f"Grace PCI domain of {bus}"
        decided = {
            f: f"ResourceSlice {driver}"
            for f, v in (("pci_bus_id", bus), ("pcie_root", attrs.get(PCIE_ROOT)))
            if v is not None
        }
        if numa is not None:
            decided["numa"] = (
                f"ResourceSlice {driver}" if numa_source == f"{driver}/numa" else str(numa_source)
            )
        return GPU(
            node=node,
            name=name,
            index=idx,
            decided_by=decided,
            uuid=attrs.get(f"{driver}/uuid"),
            pci_bus_id=bus,
            pcie_root=attrs.get(PCIE_ROOT),
            numa=numa,
            numa_source=numa_source,
            product=product,
            driver=driver,
            pool=pool,
            sources=(src,) if src else (),
        )

    def _nic_from_attrs(
        self, node: str, name: str, driver: str, pool: str, attrs: Mapping[str, Any], src: str
    ) -> NIC:
        if driver == SRIOV_DRIVER:
            return _sriov_nic(node, name, pool, attrs, src)
        if driver == IB_DRIVER:
            return _ib_nic(node, name, pool, attrs, src)
        rdma = attrs.get(DRANET_RDMA)
        rdma = rdma if isinstance(rdma, bool) else (True if driver == GKE_RDMA_DRIVER else None)
        numa = _int(attrs.get(DRANET_NUMA_NODE))
        vf = attrs.get(DRANET_IS_SRIOV_VF)
        nic = NIC(
            node=node,
            name=name,
            rdma=rdma,
            rdma_device=attrs.get(DRANET_RDMA_DEVICE),
            if_name=attrs.get(DRANET_IF_NAME),
            pci_address=attrs.get(DRANET_PCI_ADDRESS),
            pcie_root=attrs.get(PCIE_ROOT),
            numa=numa,
            numa_source=DRANET_NUMA_NODE if numa is not None else None,
            network=attrs.get(GCE_NETWORK_NAME),
            virtual=attrs.get(DRANET_VIRTUAL) if isinstance(attrs.get(DRANET_VIRTUAL), bool) else None,
            product=attrs.get(DRANET_PCI_DEVICE),
            driver=driver,
            pool=pool,
            sources=(src,) if src else (),
            function=("VF" if vf else "PF" if attrs.get(DRANET_SRIOV) else None)
            if isinstance(vf, bool)
            else None,
        )
        return _with_decided(nic, f"ResourceSlice {driver}")

    def _compute_domain(self, obj: dict[str, Any], src: str) -> None:
        name = _meta(obj)[2]
        self.compute_domains.append(name)
        for entry in (obj.get("status") or {}).get("nodes") or []:
            node_name, clique = entry.get("name"), entry.get("cliqueID")
            if node_name and clique:
                self.node(node_name, src).setdefault("cd_domain", f"{clique}")

    def _network(self, obj: dict[str, Any]) -> None:
        kind, _ns, name = _meta(obj)
        spec = obj.get("spec") or {}
        if kind == "GKENetworkParamSet":
            self.networks[name] = str(spec.get("deviceMode", ""))
        else:
            self.networks.setdefault(name, str(spec.get("type", "")))

    def _smi(self, node: str, matrix: TopoMatrix, src: str) -> None:
        nd = self.node(node, src)
        nd.setdefault("smi", matrix)
        by_index = {g.index: g for g in self.gpus.on(node) if g.index is not None}
        for idx, info in matrix.gpus.items():
            g = by_index.get(idx) or GPU(node=node, name=f"gpu-{idx}", index=idx)
            if g.numa is None and info.get("numa") is not None:
                g = replace(g, numa=info["numa"], numa_source="nvidia-smi topo -m NUMA Affinity")
            self.gpus[(node, g.name)] = replace(g, sources=unique((*g.sources, src)))
        gpu_numa = {idx: info.get("numa") for idx, info in matrix.gpus.items()}
        for nic_name in matrix.nics:
            existing = next((n for n in self.nics.on(node) if nic_name in n.aliases()), None)
            nic = existing or NIC(
                node=node,
                name=nic_name,
                rdma_device=nic_name if _RDMA_NAME.match(nic_name) else None,
                rdma=True if _RDMA_NAME.match(nic_name) else None,
            )
            if nic.numa is None:
                near = {
                    gpu_numa.get(i)
                    for (i, n), code in matrix.links.items()
                    if n == nic_name and code in ("PIX", "PXB", "PHB", "NODE")
                } - {None}
                if len(near) == 1:
                    nic = replace(nic, numa=near.pop(), numa_source="nvidia-smi topo -m (NODE/PIX to a GPU)")
            self.nics[(node, nic.name)] = replace(nic, sources=unique((*nic.sources, src)))

    def _doc(self, doc: dict[str, Any], src: str) -> None:
        """railtrace topology YAML; one bad node or pod entry is reported and costs nothing else.

        A document written by `railtrace topology collect` (`collected:` set) is the node's own
        account of its hardware: its values win over the slices' and are recorded as decided by it.
        """
        self._doc_decider = COLLECT_SOURCE if doc.get("collected") else "railtrace topology"
        for nd_doc in doc.get("nodes") or []:
            self._safe(nd_doc, src, self._doc_node)
        for p in doc.get("pods") or []:
            self._safe(p, src, self._doc_pod)

    def _doc_node(self, nd_doc: dict[str, Any], src: str) -> None:
        name = str(nd_doc.get("name", ""))
        if not name:
            self.warnings.append(f"{src}: node without name skipped")
            return
        nd = self.node(name, src)
        nd["labels"].update({str(k): str(v) for k, v in (nd_doc.get("labels") or {}).items()})
        nd["addresses"].extend(str(a) for a in nd_doc.get("addresses") or [])
        for key, field_name in (
            ("zone", "zone"),
            ("block", "block"),
            ("subblock", "subblock"),
            ("host", "host"),
            ("nvlinkDomain", "nvlink_domain"),
            ("machineType", "machine_type"),
        ):
            if nd_doc.get(key) is not None:
                nd["cfg_" + field_name] = str(nd_doc[key])
        if "rdma" in nd_doc:
            nd["cfg_rdma"] = bool(nd_doc["rdma"])
        decider = getattr(self, "_doc_decider", "railtrace topology")
        if nd_doc.get("topoMatrix"):
            self._smi(name, parse_topo_matrix(str(nd_doc["topoMatrix"])), f"{src} topoMatrix")
        for g in nd_doc.get("gpus") or []:
            gname = str(g.get("name") if g.get("name") is not None else f"gpu-{g.get('index')}")
            # The bus id says which GPU this is; a name is only a name (the collector numbers GPUs
            # in PCI order, a driver may not).
            bus = g.get("pciBusID")
            old = next((x for x in self.gpus.on(name) if bus and x.pci_bus_id == bus), None)
            if old is None:
                old = self.gpus.get((name, gname))
                if old is not None and bus and old.pci_bus_id and old.pci_bus_id != bus:
                    self.warnings.append(
                        f"{src}: node {name}: {gname} at {bus} is not the known {gname} at "
                        f"{old.pci_bus_id}; skipped"
                    )
                    continue
            old = old or GPU(node=name, name=gname)
            gname = old.name
            decided = dict(old.decided_by)
            for key, fname in (("pciBusID", "pci_bus_id"), ("pcieRoot", "pcie_root"), ("numa", "numa")):
                if g.get(key) is not None:
                    decided[fname] = decider
            self.gpus[(name, gname)] = replace(
                old,
                # The collector's index is PCI order; a driver's own numbering is kept over it.
                index=_int(g.get("index"))
                if g.get("index") is not None and not (decider == COLLECT_SOURCE and old.index is not None)
                else (old.index if old.index is not None else _int(re.sub(r"\D", "", gname))),
                uuid=g.get("uuid", old.uuid),
                pci_bus_id=g.get("pciBusID", old.pci_bus_id),
                pcie_root=g.get("pcieRoot", old.pcie_root),
                numa=_int(g["numa"]) if g.get("numa") is not None else old.numa,
                numa_source="railtrace topology" if g.get("numa") is not None else old.numa_source,
                product=g.get("product", old.product),
                sources=unique((*old.sources, src)),
                decided_by=decided,
            )
        for c in nd_doc.get("nics") or []:
            cname = str(c.get("name", ""))
            if not cname:
                self.warnings.append(f"{src}: node {name}: NIC without name skipped")
                return
            refs = {cname} | {str(c[k]) for k in ("pciAddress", "rdmaDevice", "ifName") if c.get(k)}
            old = (
                self.nics.get((name, cname))
                or next((n for n in self.nics.on(name) if cname in n.aliases()), None)
                or next((n for n in self.nics.on(name) if refs & n.aliases()), None)
                or NIC(node=name, name=cname)
            )
            decided = dict(old.decided_by)
            for key, fname in (
                ("rdma", "rdma"),
                ("rdmaDevice", "rdma_device"),
                ("ifName", "if_name"),
                ("pciAddress", "pci_address"),
                ("pcieRoot", "pcie_root"),
                ("numa", "numa"),
                ("linkType", "link_type"),
                ("function", "function"),
                ("pf", "pf"),
                ("pfPciAddress", "pf_pci_address"),
                ("rate", "rate"),
                ("rail", "rail"),
            ):
                if c.get(key) is not None:
                    decided[fname] = decider
            self.nics[(name, old.name)] = replace(
                old,
                rdma=bool(c["rdma"]) if "rdma" in c else (old.rdma if old.rdma is not None else True),
                rdma_device=c.get(
                    "rdmaDevice", old.rdma_device or (cname if _RDMA_NAME.match(cname) else None)
                ),
                if_name=c.get("ifName", old.if_name),
                pci_address=c.get("pciAddress", old.pci_address),
                pcie_root=c.get("pcieRoot", old.pcie_root),
                numa=_int(c["numa"]) if c.get("numa") is not None else old.numa,
                numa_source="railtrace topology" if c.get("numa") is not None else old.numa_source,
                rail=str(c["rail"]) if c.get("rail") is not None else old.rail,
                rail_source="railtrace topology" if c.get("rail") is not None else old.rail_source,
                network=c.get("network", old.network),
                sources=unique((*old.sources, src)),
                link_type=LINK_TYPES.get(str(c["linkType"]).lower()) if c.get("linkType") else old.link_type,
                function=str(c["function"]).upper() if c.get("function") else old.function,
                pf=c.get("pf", old.pf),
                pf_pci_address=c.get("pfPciAddress", old.pf_pci_address),
                rate=c.get("rate", old.rate),
                decided_by=decided,
            )
            if c.get("gpu") is not None:
                gref = str(c["gpu"])
                self.config_pairs.setdefault((name, gref), []).append(old.name)

    def _doc_pod(self, p: dict[str, Any], src: str) -> None:
        pname = str(p.get("name", ""))
        if not pname:
            self.warnings.append(f"{src}: pod without name skipped")
            return
        ns = p.get("namespace")
        ips = [str(p["ip"])] if p.get("ip") else []
        ips += [str(x) for x in p.get("ips") or []]
        ports = tuple(int(x) for x in (p.get("ports") or ([p["port"]] if p.get("port") else [])))
        pod = Pod(
            name=pname,
            namespace=ns,
            node=p.get("node"),
            ips=unique(ips),
            ports=ports,
            role=p.get("role"),
            engine_id=p.get("engineId"),
            sources=(src,),
            claims=tuple(str(x) for x in p.get("claims") or []),
        )
        self.pods[f"{ns}/{pname}" if ns else pname] = pod
        if p.get("gpus") or p.get("nics"):
            # A hand-described allocation: recorded like a claim named after the pod.
            self._doc_allocs = getattr(self, "_doc_allocs", [])
            self._doc_allocs.append(
                (pod, [str(x) for x in p.get("gpus") or []], [str(x) for x in p.get("nics") or []])
            )

    def _pod(self, obj: dict[str, Any], src: str) -> None:
        md = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        ips = [status.get("podIP")] + [x.get("ip") for x in status.get("podIPs") or []]
        ports = [
            int(p["containerPort"])
            for c in spec.get("containers") or []
            for p in c.get("ports") or []
            if p.get("containerPort") is not None
        ]
        claims = [
            x.get("resourceClaimName")
            for x in status.get("resourceClaimStatuses") or []
            if x.get("resourceClaimName")
        ]
        labels = {str(k): str(v) for k, v in (md.get("labels") or {}).items()}
        role = next((labels[k] for k in ROLE_LABELS if k in labels), None)
        ns = md.get("namespace")
        key = f"{ns}/{md.get('name')}" if ns else str(md.get("name"))
        old = self.pods.get(key)
        self.pods[key] = Pod(
            name=str(md.get("name")),
            namespace=ns,
            node=spec.get("nodeName") or (old.node if old else None),
            ips=unique([*(ips if ips else []), *(old.ips if old else ())]),  # type: ignore[list-item]
            host_ip=status.get("hostIP"),
            host_network=bool(spec.get("hostNetwork")),
            ports=tuple(ports) or (old.ports if old else ()),
            claims=unique([*claims, *(old.claims if old else ())]),
            role=role or (old.role if old else None),
            engine_id=old.engine_id if old else None,
            labels=labels,
            sources=unique([src, *(old.sources if old else ())]),
        )

    @staticmethod
    def _claim_node(obj: Mapping[str, Any]) -> str | None:
        alloc = (obj.get("status") or {}).get("allocation") or {}
        for term in (alloc.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
            for f in term.get("matchFields") or []:
                if f.get("key") == "metadata.name" and f.get("values"):
                    return str(f["values"][0])
        # Node-local drivers name their pool after the node; one pool for every result means one node.
        pools = {
            str(r.get("pool")) for r in ((alloc.get("devices") or {}).get("results") or []) if r.get("pool")
        }
        return pools.pop() if len(pools) == 1 else None

    def _claim_pod_names(self, obj: Mapping[str, Any]) -> list[str]:
        md = obj.get("metadata") or {}
        names = [
            r.get("name")
            for r in (obj.get("status") or {}).get("reservedFor") or []
            if r.get("resource") in (None, "pods")
        ]
        names += [r.get("name") for r in md.get("ownerReferences") or [] if r.get("kind") == "Pod"]
        claim = md.get("name")
        for pod in self.pods.values():
            if claim in pod.claims and pod.namespace == md.get("namespace"):
                names.append(pod.name)
        return [n for n in unique(str(x) for x in names if x)]

    def _claim_pods(self, obj: dict[str, Any], src: str) -> None:
        """Pods only known from a claim (reservedFor / owner) still get a node: the allocation's.

        A source that lists Pods (the live cluster, a full dump) is authoritative about them: a
        claim there naming a pod that is not listed names a pod that is gone, so none is made up.
        """
        md = obj.get("metadata") or {}
        ns = md.get("namespace")
        node = self._claim_node(obj)
        for name in self._claim_pod_names(obj):
            key = f"{ns}/{name}" if ns else name
            old = self.pods.get(key)
            if old is None and src in self.pod_sources:
                continue
            if old is None:
                self.pods[key] = Pod(
                    name=name, namespace=ns, node=node, claims=(md.get("name", ""),), sources=(src,)
                )
            else:
                self.pods[key] = replace(
                    old, node=old.node or node, claims=unique((*old.claims, md.get("name", "")))
                )

    def _nccl(self) -> None:
        """GPU inventory from nccl-tests output. Its host is the pod's hostname, i.e. usually a pod name."""
        for rec, src in self.b._nccl:
            host = str(rec["host"])
            pods = [p for p in self.pods.values() if p.name == host and p.node]
            if pods:
                node = pods[0].node or host
            else:
                node = host
                self.warnings.append(
                    f"{src}: host {host} is not a known pod or node; assumed to be a node name"
                )
            self.node(node, src)
            idx = int(rec["index"])
            bus = str(rec["bus"])
            bus = bus if bus.count(":") == 2 and "." in bus else bus + ".0" if bus.count(":") == 2 else bus
            existing = next((g for g in self.gpus.on(node) if g.index == idx), None)
            g = existing or GPU(node=node, name=f"gpu-{idx}", index=idx)
            self.gpus[(node, g.name)] = replace(
                g,
                pci_bus_id=g.pci_bus_id or bus,
                product=g.product or rec.get("product") or None,
                sources=unique((*g.sources, src)),
            )

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
        node = gpu.node
        cfg = self.config_pairs.get((node, gpu.name)) or (
            self.config_pairs.get((node, str(gpu.index))) if gpu.index is not None else None
        )
        if cfg:
            return Pairing(node, gpu.name, tuple(cfg), PAIR_CONFIG, "railtrace topology names the GPU's NIC")
        if gpu.pcie_root:
            hits = [n.name for n in nics if n.pcie_root and n.pcie_root == gpu.pcie_root]
            if hits:
                return Pairing(node, gpu.name, tuple(hits), PAIR_PCIE_ROOT, f"pcieRoot {gpu.pcie_root}")
        smi = self.nodes.get(node, {}).get("smi")
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

    def _allocation(
        self, obj: dict[str, Any], src: str, pairings: Mapping[tuple[str, str], Pairing]
    ) -> Allocation | None:
        md = obj.get("metadata") or {}
        alloc = (obj.get("status") or {}).get("allocation") or {}
        results = ((alloc.get("devices") or {}).get("results")) or []
        if not results:
            return None
        node = self._claim_node(obj)
        gpus: list[tuple[str, str]] = []
        nics: list[tuple[str, str]] = []
        res_out = []
        for r in results:
            driver, pool, dev = str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", ""))
            res_out.append({k: str(v) for k, v in r.items() if v is not None})
            hit = self.devices.get((driver, pool, dev))
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
            pods=tuple(self._claim_pod_names(obj)),
            node=node,
            gpus=unique(g for _, g in gpus),
            nics=unique(n for _, n in nics),
            results=tuple(res_out),
            alignment=alignment,
            evidence=tuple(evidence),
            pod_claim_name=(md.get("annotations") or {}).get(POD_CLAIM_ANNOTATION),
        )

    @staticmethod
    def _rdma_requests(obj: Mapping[str, Any]) -> set[str]:
        """Requests whose selector demands dranet `rdma` or SR-IOV `rdmaCapable` == true: RDMA NICs."""
        out = set()
        for r in ((obj.get("spec") or {}).get("devices") or {}).get("requests") or []:
            alt = r.get("exactly") or r
            text = " ".join(
                str((x.get("cel") or {}).get("expression", "")) for x in alt.get("selectors") or []
            )
            if re.search(r"rdma(Capable)?\"?\]?\s*==\s*true", text):
                out.add(str(r.get("name")))
        return out

    def _claim_placeholders(self, obj: dict[str, Any], src: str) -> None:
        """NICs a claim holds whose ResourceSlice is not loaded: still tell which NICs a pod holds."""
        md = obj.get("metadata") or {}
        results = (
            (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
        ) or []
        node = self._claim_node(obj)
        rdma_reqs = self._rdma_requests(obj)
        for r in results:
            driver, pool, dev = str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", ""))
            if (driver, pool, dev) in self.devices:
                continue
            self.warnings.append(
                f"ResourceClaim {md.get('name')}: device {driver}/{pool}/{dev} is in no ResourceSlice"
            )
            nnode = node or pool
            if driver not in NIC_DRIVERS or not nnode:
                continue
            nic = self.nics.get((nnode, dev)) or NIC(
                node=nnode,
                name=dev,
                driver=driver,
                pool=pool,
                rdma=True if driver == GKE_RDMA_DRIVER or str(r.get("request")) in rdma_reqs else None,
                sources=(f"{src} (allocation only)",),
            )
            self.nics[(nnode, dev)] = nic
            self.devices[(driver, pool, dev)] = ("nic", nnode, dev)
            self.node(nnode, src)

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
        for pod, gnames, cnames in getattr(self, "_doc_allocs", []):
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

    def _finish_node(self, n: dict[str, Any]) -> Node:
        labels: dict[str, str] = n["labels"]

        def pick(cfg: str, label_keys: tuple[str, ...], attr: str) -> tuple[str | None, str | None]:
            if n.get("cfg_" + cfg) is not None:
                return n["cfg_" + cfg], "railtrace topology"
            for k in label_keys:
                if labels.get(k):
                    return labels[k], k
            if n.get("attr_" + attr):
                return n["attr_" + attr]
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
        for node in nodes.values():
            missing = [k for k in ("block", "subblock", "host") if getattr(node, k) is None]
            red = self.nodes[node.name].get("redacted")
            note = f"values redacted: {', '.join(sorted(red))}" if red else ""
            if missing and (self.gpus_on(node.name) or self.nics_on(node.name)):
                gaps.append(DiscoveryGap(f"node/{node.name}", tuple(missing), note))
        for (node, driver), names in sorted(self.unknown_devices.items()):
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

    def gpus_on(self, node: str) -> list[GPU]:
        return [g for g in self.gpus.on(node)]

    def nics_on(self, node: str) -> list[NIC]:
        return [c for c in self.nics.on(node)]


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


_DECIDED_FIELDS = (
    "rdma",
    "rdma_device",
    "if_name",
    "pci_address",
    "pcie_root",
    "numa",
    "link_type",
    "function",
    "pf",
    "pf_pci_address",
    "rate",
)


def _with_decided(nic: NIC, source: str, fields: tuple[str, ...] = _DECIDED_FIELDS) -> NIC:
    """Record `source` as the decider of every listed field the NIC has a value for (and no decider yet)."""
    decided = dict(nic.decided_by)
    for f in fields:
        if getattr(nic, f) is not None and f not in decided:
            decided[f] = source
    return replace(nic, decided_by=decided)


def _sriov_nic(node: str, name: str, pool: str, attrs: Mapping[str, Any], src: str) -> NIC:
    """A VF of the SR-IOV DRA driver: RDMA capability, link type and its PF are published; the RDMA
    device name (mlx5_N) is not, so UCX lanes meet it through the PCI address (node collector)."""
    d = SRIOV_DRIVER
    rdma = attrs.get(f"{d}/rdmaCapable")
    link = LINK_TYPES.get(str(attrs.get(f"{d}/linkType") or "").lower())
    numa = _numa(attrs.get(DRANET_NUMA_NODE))
    nic = NIC(
        node=node,
        name=name,
        rdma=rdma if isinstance(rdma, bool) else None,
        if_name=attrs.get(f"{d}/interfaceName"),
        pci_address=attrs.get(f"{d}/pciAddress") or attrs.get(PCI_BUS_ID),
        pcie_root=attrs.get(PCIE_ROOT) or None,
        numa=numa,
        numa_source=DRANET_NUMA_NODE if numa is not None else None,
        driver=d,
        pool=pool,
        sources=(src,) if src else (),
        link_type=link,
        function="VF",
        pf=attrs.get(f"{d}/PFName"),
        pf_pci_address=attrs.get(f"{d}/pfPciAddress"),
    )
    return _with_decided(nic, f"ResourceSlice {d}")


def _ib_nic(node: str, name: str, pool: str, attrs: Mapping[str, Any], src: str) -> NIC:
    """One port of the InfiniBand DRA driver: every device is an IB verbs device, so RDMA."""
    d = IB_DRIVER
    numa = _numa(attrs.get(f"{d}/numaNode"))
    kind = str(attrs.get(f"{d}/type") or "").upper()
    nic = NIC(
        node=node,
        name=name,
        rdma=True,
        pci_address=attrs.get(f"{d}/pciAddress") or attrs.get(PCI_BUS_ID),
        pcie_root=attrs.get(PCIE_ROOT) or None,
        numa=numa,
        numa_source=f"{d}/numaNode" if numa is not None else None,
        driver=d,
        pool=pool,
        sources=(src,) if src else (),
        link_type="infiniband",
        function=kind if kind in ("PF", "VF") else None,
        pf=attrs.get(f"{d}/parentDevice"),
        rate=attrs.get(f"{d}/linkSpeed"),
    )
    return _with_decided(nic, f"ResourceSlice {d}")
