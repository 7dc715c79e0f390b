"""Host-side GPU reports → raw facts: `nvidia-smi topo -m` matrices and nccl-tests device lists.

Both name GPUs by index rather than by a driver's device name, so they refine the GPU already
known at that index on the node (or add one) instead of adding a second device.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

from railtrace.topology.facts import RDMA_NAME, Facts
from railtrace.topology.model import GPU, NIC, unique
from railtrace.topology.nvsmi import TopoMatrix


def read_topo_matrix(facts: Facts, node: str, matrix: TopoMatrix, src: str) -> None:
    """One host's matrix: kept for pairing, and GPU/NIC NUMA where nothing better said it."""
    nd = facts.node(node, src)
    nd.setdefault("smi", matrix)
    by_index = {g.index: g for g in facts.gpus.on(node) if g.index is not None}
    for idx, info in matrix.gpus.items():
        g = by_index.get(idx) or GPU(node=node, name=f"gpu-{idx}", index=idx)
        if g.numa is None and info.get("numa") is not None:
            g = replace(g, numa=cast("int", info["numa"]), numa_source="nvidia-smi topo -m NUMA Affinity")
        facts.gpus[(node, g.name)] = replace(g, sources=unique((*g.sources, src)))
    gpu_numa = {idx: info.get("numa") for idx, info in matrix.gpus.items()}
    for nic_name in matrix.nics:
        existing = next((n for n in facts.nics.on(node) if nic_name in n.aliases()), None)
        nic = existing or NIC(
            node=node,
            name=nic_name,
            rdma_device=nic_name if RDMA_NAME.match(nic_name) else None,
            rdma=True if RDMA_NAME.match(nic_name) else None,
        )
        if nic.numa is None:
            near = {
                gpu_numa.get(i)
                for (i, n), code in matrix.links.items()
                if n == nic_name and code in ("PIX", "PXB", "PHB", "NODE")
            } - {None}
            if len(near) == 1:
                nic = replace(
                    nic, numa=cast("int", near.pop()), numa_source="nvidia-smi topo -m (NODE/PIX to a GPU)"
                )
        facts.nics[(node, nic.name)] = replace(nic, sources=unique((*nic.sources, src)))


def read_nccl(facts: Facts, records: list[tuple[dict[str, Any], str]]) -> None:
    """GPU inventory from nccl-tests output. Its host is the pod's hostname, i.e. usually a pod name,
    so this runs after the pods are read."""
    for rec, src in records:
        host = str(rec["host"])
        pods = [p for p in facts.pods.values() if p.name == host and p.node]
        if pods:
            node = pods[0].node or host
        else:
            node = host
            facts.warnings.append(f"{src}: host {host} is not a known pod or node; assumed to be a node name")
        facts.node(node, src)
        idx = int(rec["index"])
        bus = str(rec["bus"])
        bus = bus if bus.count(":") == 2 and "." in bus else bus + ".0" if bus.count(":") == 2 else bus
        existing = next((g for g in facts.gpus.on(node) if g.index == idx), None)
        g = existing or GPU(node=node, name=f"gpu-{idx}", index=idx)
        facts.gpus[(node, g.name)] = replace(
            g,
            pci_bus_id=g.pci_bus_id or bus,
            product=g.product or rec.get("product") or None,
            sources=unique((*g.sources, src)),
        )
