"""The audit over the store's recent traffic: one function for the CLI, the REST route and /metrics.

Reads request summaries newer than the window through the store's typed query (newest first,
keyset pages), bounded so one audit stays cheap on a busy store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from railtrace.contract.audit import ContractConfig, audit
from railtrace.contract.report import ContractReport
from railtrace.topology.model import Topology

PAGE = 1000
MAX_SUMMARIES = 200_000  # newest first; older traffic beyond this is not read


def recent_summaries(
    store: Any, window_s: float | None, limit: int = MAX_SUMMARIES
) -> Iterator[dict[str, Any]]:
    """Summaries from a `railtrace.store.Store` newer than `window_s` seconds (all when None)."""
    from railtrace.store import Cursor, RequestQuery

    since = None if window_s is None else time.time_ns() - int(window_s * 1e9)
    cursor = None
    seen = 0
    while True:
        page = store.list_requests(RequestQuery(since_ns=since, limit=PAGE, cursor=cursor))
        for item in page.items:
            yield item
            seen += 1
            if seen >= limit:
                return
        if not page.next_cursor:
            return
        cursor = Cursor.decode(page.next_cursor)


def audit_store(
    topology: Topology, store: Any, config: ContractConfig | None = None, now: datetime | None = None
) -> ContractReport:
    """The online audit: the topology plus the store's recent request summaries."""
    config = config or ContractConfig()
    return audit(topology, list(recent_summaries(store, config.window_s)), config, now)


class ContractCache:
    """One shared report for the REST route and the /metrics gauge, recomputed at most every `max_age_s`.

    A scrape and an API call arriving together must not each read the whole window from the
    store; a new topology (the holder swaps the object on reload) invalidates the cache.
    """

    def __init__(
        self,
        config: ContractConfig | None = None,
        max_age_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or ContractConfig()
        self.max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._report: ContractReport | None = None
        self._topology_id: int | None = None
        self._at = 0.0

    def get(self, topology: Topology, store: Any) -> ContractReport:
        with self._lock:
            now = self._clock()
            fresh = self._report is not None and now - self._at < self.max_age_s
            if fresh and self._topology_id == id(topology):
                return self._report  # type: ignore[return-value]
            self._report = audit_store(topology, store, self.config)
            self._topology_id = id(topology)
            self._at = now
            return self._report
