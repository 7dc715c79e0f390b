"""railtrace topology YAML → raw facts: nodes, their GPUs and NICs, pods and hand-described allocations.

A document is read after the cluster's inventory so that its values override what the slices
said; each field it sets is recorded as decided by it.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from railtrace.topology import read_smi
from railtrace.topology.facts import LINK_TYPES, RDMA_NAME, Facts, as_int
from railtrace.topology.model import GPU, NIC, Pod, unique
from railtrace.topology.nvsmi import parse_topo_matrix

COLLECT_SOURCE = "node (railtrace topology collect)"
DOC_SOURCE = "railtrace topology"


def read_doc(facts: Facts, doc: dict[str, Any], src: str) -> None:
    """railtrace topology YAML; one bad node or pod entry is reported and costs nothing else.

    A document written by `railtrace topology collect` (`collected:` set) is the node's own
    account of its hardware: its values win over the slices' and are recorded as decided by it.
    """
    decider = COLLECT_SOURCE if doc.get("collected") else DOC_SOURCE
    for nd_doc in doc.get("nodes") or []:
        facts.safe(nd_doc, src, lambda d, s: _doc_node(facts, d, s, decider))
    for p in doc.get("pods") or []:
        facts.safe(p, src, lambda d, s: _doc_pod(facts, d, s))


def _doc_node(facts: Facts, nd_doc: dict[str, Any], src: str, decider: str) -> None:
    name = str(nd_doc.get("name", ""))
    if not name:
        facts.warnings.append(f"{src}: node without name skipped")
        return
    nd = facts.node(name, src)
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
    if nd_doc.get("topoMatrix"):
        read_smi.read_topo_matrix(
            facts, name, parse_topo_matrix(str(nd_doc["topoMatrix"])), f"{src} topoMatrix"
        )
    for g in nd_doc.get("gpus") or []:
        gname = str(g.get("name") if g.get("name") is not None else f"gpu-{g.get('index')}")
        # The bus id says which GPU this is; a name is only a name (the collector numbers GPUs
        # in PCI order, a driver may not).
        bus = g.get("pciBusID")
        old = next((x for x in facts.gpus.on(name) if bus and x.pci_bus_id == bus), None)
        if old is None:
            old = facts.gpus.get((name, gname))
            if old is not None and bus and old.pci_bus_id and old.pci_bus_id != bus:
                facts.warnings.append(
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
        facts.gpus[(name, gname)] = replace(
            old,
            # The collector's index is PCI order; a driver's own numbering is kept over it.
            index=as_int(g.get("index"))
            if g.get("index") is not None and not (decider == COLLECT_SOURCE and old.index is not None)
            else (old.index if old.index is not None else as_int(re.sub(r"\D", "", gname))),
            uuid=g.get("uuid", old.uuid),
            pci_bus_id=g.get("pciBusID", old.pci_bus_id),
            pcie_root=g.get("pcieRoot", old.pcie_root),
            numa=as_int(g["numa"]) if g.get("numa") is not None else old.numa,
            numa_source=DOC_SOURCE if g.get("numa") is not None else old.numa_source,
            product=g.get("product", old.product),
            sources=unique((*old.sources, src)),
            decided_by=decided,
        )
    for c in nd_doc.get("nics") or []:
        cname = str(c.get("name", ""))
        if not cname:
            facts.warnings.append(f"{src}: node {name}: NIC without name skipped")
            return
        refs = {cname} | {str(c[k]) for k in ("pciAddress", "rdmaDevice", "ifName") if c.get(k)}
        old_nic = (
            facts.nics.get((name, cname))
            or next((n for n in facts.nics.on(name) if cname in n.aliases()), None)
            or next((n for n in facts.nics.on(name) if refs & n.aliases()), None)
            or NIC(node=name, name=cname)
        )
        decided = dict(old_nic.decided_by)
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
        facts.nics[(name, old_nic.name)] = replace(
            old_nic,
            rdma=bool(c["rdma"]) if "rdma" in c else (old_nic.rdma if old_nic.rdma is not None else True),
            rdma_device=c.get(
                "rdmaDevice", old_nic.rdma_device or (cname if RDMA_NAME.match(cname) else None)
            ),
            if_name=c.get("ifName", old_nic.if_name),
            pci_address=c.get("pciAddress", old_nic.pci_address),
            pcie_root=c.get("pcieRoot", old_nic.pcie_root),
            numa=as_int(c["numa"]) if c.get("numa") is not None else old_nic.numa,
            numa_source=DOC_SOURCE if c.get("numa") is not None else old_nic.numa_source,
            rail=str(c["rail"]) if c.get("rail") is not None else old_nic.rail,
            rail_source=DOC_SOURCE if c.get("rail") is not None else old_nic.rail_source,
            network=c.get("network", old_nic.network),
            sources=unique((*old_nic.sources, src)),
            link_type=LINK_TYPES.get(str(c["linkType"]).lower()) if c.get("linkType") else old_nic.link_type,
            function=str(c["function"]).upper() if c.get("function") else old_nic.function,
            pf=c.get("pf", old_nic.pf),
            pf_pci_address=c.get("pfPciAddress", old_nic.pf_pci_address),
            rate=c.get("rate", old_nic.rate),
            decided_by=decided,
        )
        if c.get("gpu") is not None:
            facts.config_pairs.setdefault((name, str(c["gpu"])), []).append(old_nic.name)


def _doc_pod(facts: Facts, p: dict[str, Any], src: str) -> None:
    pname = str(p.get("name", ""))
    if not pname:
        facts.warnings.append(f"{src}: pod without name skipped")
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
    facts.pods[f"{ns}/{pname}" if ns else pname] = pod
    if p.get("gpus") or p.get("nics"):
        # A hand-described allocation: recorded like a claim named after the pod.
        facts.doc_allocs.append(
            (pod, [str(x) for x in p.get("gpus") or []], [str(x) for x in p.get("nics") or []])
        )
