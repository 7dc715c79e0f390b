"""TopologyHolder: the service's current topology, replaced atomically on reload without restart."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from railtrace.topology.loaders import TopologyError, load_paths
from railtrace.topology.model import Topology


class TopologyHolder:
    """Thread-safe holder. Readers call `get()` once per request and keep that snapshot.

    A failed reload keeps the previous topology (nothing else lost) and records the error in
    `last_error`; `version` counts successful replacements so callers can tell a change happened.
    """

    def __init__(
        self, paths: Sequence[str | os.PathLike[str]] = (), topology: Topology | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._paths = [str(p) for p in paths]
        self._topology = (
            topology if topology is not None else (load_paths(self._paths) if self._paths else Topology())
        )
        self._version = 1
        self.last_error: str | None = None

    @property
    def paths(self) -> list[str]:
        return list(self._paths)

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    def get(self) -> Topology:
        with self._lock:
            return self._topology

    def replace(self, topology: Topology) -> int:
        """Swap in a new topology (e.g. built by a live Kubernetes source); returns the new version."""
        with self._lock:
            self._topology = topology
            self._version += 1
            self.last_error = None
            return self._version

    def reload(self) -> int:
        """Re-read the paths. Raises TopologyError (and keeps the old topology) if they cannot be read."""
        if not self._paths:
            return self.version
        try:
            topology = load_paths(self._paths)
        except TopologyError as exc:
            with self._lock:
                self.last_error = str(exc)
            raise
        return self.replace(topology)


def open_topology(paths: Sequence[str]) -> tuple[TopologyHolder, Any]:
    """The holder for topology `paths` (files, folders, and `k8s` for the live cluster) and the
    started live cluster source, or None when no path asks for it. Raises `TopologyError` on
    unreadable input."""
    from railtrace.topology.k8s_source import K8S_TOPOLOGY, start_live_topology, wants_live_topology

    holder = TopologyHolder([p for p in paths if p != K8S_TOPOLOGY])
    live = start_live_topology(holder, list(paths)) if wants_live_topology(paths) else None
    return holder, live
