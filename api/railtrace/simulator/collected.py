"""A simulated fleet as the node collector and the Kubernetes API's Pods describe it, without DRA.

For clusters whose NICs come from device plugins or the SR-IOV driver, railtrace learns hardware
from `railtrace topology collect` on each node. `railtrace demo --topology-source collected` runs
the fleet that way: each node's hardware becomes a sysfs record, is expanded into a tree and read
by the real collector; the service then sees only those documents plus Pods (no Nodes,
ResourceSlices or ResourceClaims). Rails and node placement are not known to a node, so the
verdicts that need them stay unjudged — which is what such a cluster gives.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml

from railtrace.simulator.fleet import Fleet, Node, _pod_obj, engine_entries
from railtrace.topology.collect import collect
from railtrace.topology.sysfs_record import expand


def node_record(node: Node, product: str) -> dict[str, Any]:
    """The node's PCI tree: each GPU and NIC behind a switch port under its root complex."""
    pci: dict[str, Any] = {}
    for g in node.gpus:
        dom, bus = g.pci_bus_id.split(":")[:2]
        pci[g.pci_bus_id] = {
            "parent": f"{g.pcie_root}/{dom}:{bus}:01.0",
            "class": "0x030200",
            "vendor": "0x10de",
            "device": "0x2335",
            "numa": g.numa,
            "nvidia": {"Model": product, "GPU UUID": g.uuid},
        }
    ib: dict[str, Any] = {}
    net: dict[str, Any] = {}
    for n in node.nics:
        dom, bus = n.pci_address.split(":")[:2]
        pci[n.pci_address] = {
            "parent": f"{n.pcie_root}/{dom}:{bus}:02.0",
            "class": "0x020000",
            "vendor": "0x15b3",
            "device": "0x1021",
            "numa": n.numa,
        }
        ib[n.rdma_device] = {
            "pci": n.pci_address,
            "ports": {1: {"link_layer": "Ethernet", "rate": "400 Gb/sec (4X NDR)", "state": "4: ACTIVE"}},
        }
        net[n.if_name] = {"pci": n.pci_address, "type": 1}
    return {"node": node.name, "pci": pci, "infiniband": ib, "net": net}


def write_collected(fleet: Fleet, folder: str | Path) -> list[Path]:
    """Per node the collector's YAML, plus the Pods and their vLLM engine ids; nothing from DRA."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for node in fleet.nodes:
        with tempfile.TemporaryDirectory(prefix="railtrace-sysfs-") as tmp:
            doc = collect(expand(node_record(node, fleet.shape.product), Path(tmp)), node=node.name)
        doc["collected"]["sysfsRoot"] = f"simulated {node.name}"
        path = out / f"collected-{node.name}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        paths.append(path)
    pods = [_pod_obj(fleet.shape, p) for p in fleet.pods]
    for pod in pods:
        pod.get("status", {}).pop("resourceClaimStatuses", None)  # no DRA: no claims to point at
    path = out / "pods.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": pods}, sort_keys=False))
    paths.append(path)
    engines = {
        "apiVersion": "railtrace.io/v1alpha1",
        "kind": "Topology",
        "pods": engine_entries(fleet),
    }
    path = out / "engines.yaml"
    path.write_text(yaml.safe_dump(engines, sort_keys=False))
    paths.append(path)
    return paths
