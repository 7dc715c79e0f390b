"""Kubernetes objects → raw facts: Nodes, DeviceClasses, ResourceSlices, ComputeDomains, networks,
Pods and ResourceClaims.

Reading is in two phases because railtrace YAML sits between them: the inventory (what hardware
a node has) is read before the documents that refine it, the workloads (pods and their claims)
after the documents' pods, which they merge with.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from railtrace.topology.facts import LINK_TYPES, Facts, as_int, meta
from railtrace.topology.k8s_keys import (
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
    IB_DRIVER,
    NIC_DRIVERS,
    NODE_DEVICE_ATTRIBUTES,
    NON_NIC_DRIVERS,
    PCI_BUS_ID,
    PCIE_ROOT,
    ROLE_LABELS,
    SRIOV_DRIVER,
)
from railtrace.topology.model import GPU, NIC, Pod, unique

# Objects grouped by kind, each with the source it came from: what the builder hands the readers.
ByKind = dict[str, list[tuple[dict[str, Any], str]]]
Claims = list[tuple[dict[str, Any], str]]

_REDACTED = {"", "redacted", "REDACTED", "unknown"}


def read_inventory(facts: Facts, by_kind: ByKind) -> None:
    """The hardware the cluster publishes; takes the kinds it reads out of `by_kind`."""
    for obj, src in by_kind.pop("Node", []):
        facts.safe(obj, src, lambda o, s: _k8s_node(facts, o, s))
    for obj, src in by_kind.pop("DeviceClass", []):
        facts.safe(obj, src, lambda o, _s: _device_class(facts, o))
    for obj, src in by_kind.pop("ResourceSlice", []):
        facts.safe(obj, src, lambda o, s: _slice(facts, o, s))
    for obj, src in by_kind.pop("ComputeDomain", []):
        facts.safe(obj, src, lambda o, s: _compute_domain(facts, o, s))
    for kind in ("GKENetworkParamSet", "Network"):
        for obj, src in by_kind.pop(kind, []):
            facts.safe(obj, src, lambda o, _s: _network(facts, o))


def read_workloads(facts: Facts, by_kind: ByKind) -> Claims:
    """Pods and ResourceClaims; returns the claims that could be read, for the allocations."""
    pod_objs = by_kind.pop("Pod", [])
    facts.pod_sources = {src for _obj, src in pod_objs}
    for obj, src in pod_objs:
        facts.safe(obj, src, lambda o, s: _pod(facts, o, s))
    return [
        (o, s)
        for o, s in by_kind.pop("ResourceClaim", [])
        if facts.safe(o, s, lambda o, s: _claim_pods(facts, o, s))
        and facts.safe(o, s, lambda o, s: _claim_placeholders(facts, o, s))
    ]


# -- ResourceSlice attributes ----------------------------------------------------------------
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


def _numa(v: Any) -> int | None:
    """A NUMA id; the kernel's -1 means "no affinity" and says nothing."""
    n = as_int(v)
    return n if n is not None and n >= 0 else None


def _grace_numa(bus_id: str | None) -> int | None:
    """Grace (GB200/GB300): PCI domains 0x00xx sit on socket 0, 0x01x on socket 1 (published slices' note)."""
    if not bus_id or ":" not in bus_id:
        return None
    try:
        domain = int(bus_id.split(":")[0], 16)
    except ValueError:
        return None
    return domain >> 4 if domain < 0x100 else None


# -- inventory -------------------------------------------------------------------------------
def _k8s_node(facts: Facts, obj: dict[str, Any], src: str) -> None:
    md = obj.get("metadata") or {}
    n = facts.node(md.get("name", ""), src)
    n["labels"].update({str(k): str(v) for k, v in (md.get("labels") or {}).items()})
    for addr in (obj.get("status") or {}).get("addresses") or []:
        if addr.get("address"):
            n["addresses"].append(str(addr["address"]))


def _device_class(facts: Facts, obj: dict[str, Any]) -> None:
    name = (obj.get("metadata") or {}).get("name", "")
    for sel in (obj.get("spec") or {}).get("selectors") or []:
        m = re.search(
            r'device\.driver\s*==\s*["\']([^"\']+)', str((sel.get("cel") or {}).get("expression", ""))
        )
        if m:
            facts.device_classes[name] = m.group(1)


def _slice(facts: Facts, obj: dict[str, Any], src: str) -> None:
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
            facts.warnings.append(f"ResourceSlice {meta(obj)[2]}: no nodeName; assumed node = pool {pool}")
    if not node_name:
        facts.warnings.append(f"ResourceSlice {meta(obj)[2]}: no node; skipped")
        return
    nd = facts.node(node_name, src)
    for dev in spec.get("devices") or []:
        name = str(dev.get("name", ""))
        attrs = _device_attrs(dev, driver)
        _node_attrs(nd, attrs)
        kind = _classify(driver, attrs)
        if kind == "gpu":
            facts.gpus[(node_name, name)] = _gpu_from_attrs(node_name, name, driver, pool, attrs, src)
            facts.devices[(driver, pool, name)] = ("gpu", node_name, name)
        elif kind == "nic":
            facts.nics[(node_name, name)] = _nic_from_attrs(node_name, name, driver, pool, attrs, src)
            facts.devices[(driver, pool, name)] = ("nic", node_name, name)
        else:
            facts.devices[(driver, pool, name)] = ("other", node_name, name)
            if driver not in GPU_DRIVERS and driver not in NON_NIC_DRIVERS:
                facts.unknown_devices.setdefault((node_name, driver), []).append(name)


def _classify(driver: str, attrs: Mapping[str, Any]) -> str:
    dtype = attrs.get(f"{driver}/type")
    if driver in GPU_DRIVERS:
        return "gpu" if dtype in (None, "gpu") else "other"  # MIG / vfio / channels are not whole GPUs
    if driver in NIC_DRIVERS or any(k in attrs for k in DRANET_NIC_KEYS):
        return "nic"
    return "other"


def _node_attrs(nd: dict[str, Any], attrs: Mapping[str, Any]) -> None:
    """Node-level facts that drivers publish per device (GCE, OCI, Azure DRANET)."""
    for key, field_name in NODE_DEVICE_ATTRIBUTES.items():
        v = attrs.get(key)
        if v is None:
            continue
        if str(v) in _REDACTED:
            nd.setdefault("redacted", set()).add(key)
            continue
        nd.setdefault("attr_" + field_name, (str(v), key))


def _gpu_from_attrs(node: str, name: str, driver: str, pool: str, attrs: Mapping[str, Any], src: str) -> GPU:
    idx = as_int(attrs.get(f"{driver}/index"))
    if idx is None:
        m = re.search(r"(\d+)$", name)
        idx = int(m.group(1)) if m else None
    bus = attrs.get(PCI_BUS_ID)
    numa = as_int(attrs.get(f"{driver}/numa"))
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
        decided["numa"] = f"ResourceSlice {driver}" if numa_source == f"{driver}/numa" else str(numa_source)
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


def _nic_from_attrs(node: str, name: str, driver: str, pool: str, attrs: Mapping[str, Any], src: str) -> NIC:
    if driver == SRIOV_DRIVER:
        return _sriov_nic(node, name, pool, attrs, src)
    if driver == IB_DRIVER:
        return _ib_nic(node, name, pool, attrs, src)
    rdma = attrs.get(DRANET_RDMA)
    rdma = rdma if isinstance(rdma, bool) else (True if driver == GKE_RDMA_DRIVER else None)
    numa = as_int(attrs.get(DRANET_NUMA_NODE))
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


def _compute_domain(facts: Facts, obj: dict[str, Any], src: str) -> None:
    facts.compute_domains.append(meta(obj)[2])
    for entry in (obj.get("status") or {}).get("nodes") or []:
        node_name, clique = entry.get("name"), entry.get("cliqueID")
        if node_name and clique:
            facts.node(node_name, src).setdefault("cd_domain", f"{clique}")


def _network(facts: Facts, obj: dict[str, Any]) -> None:
    kind, _ns, name = meta(obj)
    spec = obj.get("spec") or {}
    if kind == "GKENetworkParamSet":
        facts.networks[name] = str(spec.get("deviceMode", ""))
    else:
        facts.networks.setdefault(name, str(spec.get("type", "")))


# -- workloads -------------------------------------------------------------------------------
def _pod(facts: Facts, obj: dict[str, Any], src: str) -> None:
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
    old = facts.pods.get(key)
    facts.pods[key] = Pod(
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


def claim_node(obj: Mapping[str, Any]) -> str | None:
    """The node a claim's allocation is on: its node selector, else the one pool all results share."""
    alloc = (obj.get("status") or {}).get("allocation") or {}
    for term in (alloc.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for f in term.get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("values"):
                return str(f["values"][0])
    # Node-local drivers name their pool after the node; one pool for every result means one node.
    pools = {str(r.get("pool")) for r in ((alloc.get("devices") or {}).get("results") or []) if r.get("pool")}
    return pools.pop() if len(pools) == 1 else None


def claim_pod_names(facts: Facts, obj: Mapping[str, Any]) -> list[str]:
    """Pods holding a claim: reserved for, owning it, or naming it in their status."""
    md = obj.get("metadata") or {}
    names = [
        r.get("name")
        for r in (obj.get("status") or {}).get("reservedFor") or []
        if r.get("resource") in (None, "pods")
    ]
    names += [r.get("name") for r in md.get("ownerReferences") or [] if r.get("kind") == "Pod"]
    claim = md.get("name")
    for pod in facts.pods.values():
        if claim in pod.claims and pod.namespace == md.get("namespace"):
            names.append(pod.name)
    return [n for n in unique(str(x) for x in names if x)]


def _claim_pods(facts: Facts, obj: dict[str, Any], src: str) -> None:
    """Pods only known from a claim (reservedFor / owner) still get a node: the allocation's.

    A source that lists Pods (the live cluster, a full dump) is authoritative about them: a
    claim there naming a pod that is not listed names a pod that is gone, so none is made up.
    """
    md = obj.get("metadata") or {}
    ns = md.get("namespace")
    node = claim_node(obj)
    for name in claim_pod_names(facts, obj):
        key = f"{ns}/{name}" if ns else name
        old = facts.pods.get(key)
        if old is None and src in facts.pod_sources:
            continue
        if old is None:
            facts.pods[key] = Pod(
                name=name, namespace=ns, node=node, claims=(md.get("name", ""),), sources=(src,)
            )
        else:
            facts.pods[key] = replace(
                old, node=old.node or node, claims=unique((*old.claims, md.get("name", "")))
            )


def _rdma_requests(obj: Mapping[str, Any]) -> set[str]:
    """Requests whose selector demands dranet `rdma` or SR-IOV `rdmaCapable` == true: RDMA NICs."""
    out = set()
    for r in ((obj.get("spec") or {}).get("devices") or {}).get("requests") or []:
        alt = r.get("exactly") or r
        text = " ".join(str((x.get("cel") or {}).get("expression", "")) for x in alt.get("selectors") or [])
        if re.search(r"rdma(Capable)?\"?\]?\s*==\s*true", text):
            out.add(str(r.get("name")))
    return out


def _claim_placeholders(facts: Facts, obj: dict[str, Any], src: str) -> None:
    """NICs a claim holds whose ResourceSlice is not loaded: still tell which NICs a pod holds."""
    md = obj.get("metadata") or {}
    results = (
        (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
    ) or []
    node = claim_node(obj)
    rdma_reqs = _rdma_requests(obj)
    for r in results:
        driver, pool, dev = str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", ""))
        if (driver, pool, dev) in facts.devices:
            continue
        facts.warnings.append(
            f"ResourceClaim {md.get('name')}: device {driver}/{pool}/{dev} is in no ResourceSlice"
        )
        nnode = node or pool
        if driver not in NIC_DRIVERS or not nnode:
            continue
        nic = facts.nics.get((nnode, dev)) or NIC(
            node=nnode,
            name=dev,
            driver=driver,
            pool=pool,
            rdma=True if driver == GKE_RDMA_DRIVER or str(r.get("request")) in rdma_reqs else None,
            sources=(f"{src} (allocation only)",),
        )
        facts.nics[(nnode, dev)] = nic
        facts.devices[(driver, pool, dev)] = ("nic", nnode, dev)
        facts.node(nnode, src)
