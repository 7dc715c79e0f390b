"""Topology model and loaders: Kubernetes objects, `nvidia-smi topo -m`, railtrace topology YAML."""

from railtrace.topology.builder import TopologyBuilder
from railtrace.topology.holder import TopologyHolder, open_topology
from railtrace.topology.identity import resolve_address, resolve_endpoint
from railtrace.topology.loaders import TopologyError, load_paths
from railtrace.topology.model import GPU, NIC, Allocation, Node, Pairing, Pod, Topology

__all__ = [
    "GPU",
    "NIC",
    "Allocation",
    "Node",
    "Pairing",
    "Pod",
    "Topology",
    "TopologyBuilder",
    "TopologyError",
    "TopologyHolder",
    "load_paths",
    "open_topology",
    "resolve_address",
    "resolve_endpoint",
]
