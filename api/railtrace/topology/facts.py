"""The raw per-node facts that the readers fill and the derivation turns into a `Topology`.

Every reader (`read_k8s`, `read_smi`, `read_doc`) writes into one `Facts`, so that a later input
can refine what an earlier one said about the same device (a railtrace document overriding a
ResourceSlice, the topo matrix adding a GPU's NUMA) and the derivation sees one merged inventory.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from railtrace.topology.model import GPU, NIC, Pod

_T = TypeVar("_T")

# Both the SR-IOV driver and railtrace YAML spell link types loosely; the model has two.
LINK_TYPES = {"ib": "infiniband", "infiniband": "infiniband", "eth": "ethernet", "ethernet": "ethernet"}
# An RDMA verbs device name: a NIC named so by the topo matrix or YAML is an RDMA NIC.
RDMA_NAME = re.compile(r"^(mlx5_\w+|rdmap\w+|efa\w*|bnxt_re\w*|irdma\w*|ib\w+)$")

# The exceptions a malformed input object raises while it is read: reported, never fatal.
MALFORMED = (AttributeError, TypeError, ValueError, KeyError, IndexError)


def meta(obj: Mapping[str, Any]) -> tuple[str, str | None, str]:
    """(kind, namespace, name) of a Kubernetes object: its identity for the builder and in warnings."""
    md = obj.get("metadata") or {}
    return str(obj.get("kind", "")), md.get("namespace"), str(md.get("name") or md.get("generateName") or "")


def as_int(v: Any) -> int | None:
    """An integer, or None for anything that is not one (inputs carry numbers as strings too)."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


class ByNode(dict[tuple[str, str], _T], Generic[_T]):
    """Devices keyed (node, name) with a per-node view kept in step, so lookups stay linear in the fleet."""

    def __init__(self) -> None:
        super().__init__()
        self._by_node: dict[str, dict[str, _T]] = {}

    def __setitem__(self, key: tuple[str, str], value: _T) -> None:
        super().__setitem__(key, value)
        self._by_node.setdefault(key[0], {})[key[1]] = value

    def on(self, node: str) -> list[_T]:
        return list(self._by_node.get(node, {}).values())


class Facts:
    """What the inputs said, merged but not yet derived from.

    `nodes` holds one plain dict per node: labels, addresses and sources, plus the keys a reader
    may set — `attr_<field>` (a driver's per-device node attribute, with its key), `cfg_<field>`
    (railtrace YAML), `cd_domain` (ComputeDomain clique), `smi` (the node's topo matrix) and
    `redacted` (attribute keys whose value was withheld).
    """

    def __init__(self, warnings: list[str]) -> None:
        self.warnings: list[str] = list(warnings)
        self.nodes: dict[str, dict[str, Any]] = {}
        self.gpus: ByNode[GPU] = ByNode()
        self.nics: ByNode[NIC] = ByNode()
        # (driver, pool, device) -> (kind, node, name): how a claim's results find their devices.
        self.devices: dict[tuple[str, str, str], tuple[str, str, str]] = {}
        self.pods: dict[str, Pod] = {}
        self.networks: dict[str, str] = {}
        self.compute_domains: list[str] = []
        self.device_classes: dict[str, str] = {}
        # (node, GPU name or index) -> NIC names: railtrace YAML's `gpu:` on a NIC.
        self.config_pairs: dict[tuple[str, str], list[str]] = {}
        self.unknown_devices: dict[tuple[str, str], list[str]] = {}  # (node, driver) -> device names
        self.pod_sources: set[str] = set()
        # Pods of railtrace YAML that name their GPUs and NICs: (pod, GPU refs, NIC refs).
        self.doc_allocs: list[tuple[Pod, list[str], list[str]]] = []

    def node(self, name: str, source: str = "") -> dict[str, Any]:
        n = self.nodes.setdefault(name, {"name": name, "labels": {}, "addresses": [], "sources": []})
        if source and source not in n["sources"]:
            n["sources"].append(source)
        return n

    def safe(self, obj: Any, src: str, fn: Callable[[Any, str], object]) -> bool:
        """Run one object's reading or derivation; a malformed object is reported and costs nothing else."""
        try:
            fn(obj, src)
            return True
        except MALFORMED as exc:
            kind, _ns, name = meta(obj) if isinstance(obj, Mapping) else ("entry", None, repr(obj)[:40])
            if isinstance(obj, Mapping) and not obj.get("metadata"):
                kind, name = kind or "entry", str(obj.get("name", "<unnamed>"))
            where = f" ({src})" if src else ""
            self.warnings.append(
                f"{kind or 'document'} {name}{where}: malformed, skipped ({type(exc).__name__}: {exc})"
            )
            return False
