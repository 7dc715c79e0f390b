"""TopologyBuilder: collects raw inputs and derives the immutable `Topology` from all of them at once.

Inputs are kept by identity (kind, namespace, name) so a live source can add, replace and remove
objects as they change and call `build()` again; derivation (pairing, rails, allocations) always
runs over the whole set, never incrementally, so the result never depends on arrival order.

`build()` feeds the inputs to the readers (`read_k8s`, `read_smi`, `read_doc`), which record what
each says in one `Facts`, then hands those to `derive`, which makes the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from railtrace.topology import read_doc, read_k8s, read_smi
from railtrace.topology.derive import derive
from railtrace.topology.facts import Facts, meta
from railtrace.topology.model import Topology
from railtrace.topology.nvsmi import TopoMatrix, parse_nccl_devices, parse_topo_matrix
from railtrace.topology.read_k8s import ByKind


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
        kind, ns, name = meta(obj)
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
        kind, ns, name = meta(obj)
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

    # -- build ---------------------------------------------------------------------------
    def build(self) -> Topology:
        """Read every input into one set of facts, in a fixed order of kinds, then derive from them.

        The order is the one the readers depend on: inventory before the railtrace documents that
        refine it, their pods before the cluster's Pods that merge with them, and pods before the
        nccl-tests output that names its hosts by pod.
        """
        facts = Facts(self._warnings)
        by_kind: ByKind = {}
        for key, obj in self._objects.items():
            by_kind.setdefault(key[0], []).append((obj, self._object_source.get(key, "")))
        read_k8s.read_inventory(facts, by_kind)
        for node, (matrix, src) in self._smi.items():
            read_smi.read_topo_matrix(facts, node, matrix, src)
        for doc, src in self._docs:
            facts.safe(doc, src, lambda d, s: read_doc.read_doc(facts, d, s))
        claims = read_k8s.read_workloads(facts, by_kind)
        read_smi.read_nccl(facts, self._nccl)
        return derive(facts, claims, by_kind, tuple(self._sources))
