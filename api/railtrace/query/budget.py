"""Budgets of the read API's queries: time, rows, and how many run at once.

A search scans rows in Python and a trace read decodes spans; unbounded, one request could hold
a worker as long as its input made it, while liveness, ingest and shutdown waited. So every
search and trace read gets a `Budget` (a deadline and a row budget) that its scan loops check,
and runs through the `QueryGate`: at most `query_concurrency` at once, each on a daemon thread
of its own (never the event loop, never the worker-thread pool that liveness, readiness and
ingest use), given up at its deadline or as soon as the service stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

# How much longer than its deadline the gate waits for a query's thread before answering 503:
# scan loops check the budget between rows, so only a database call outlives it.
OVERRUN_S = 2.0
# How often a waiting request looks at its query and at the gate.
POLL_S = 0.05


class QueryUnavailable(Exception):
    """A query not answered: the service is stopping, too many are running, or one call outran
    its time budget. HTTP 503 with `Retry-After`."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(slots=True)
class Budget:
    """The deadline and row budget of one query. Scan loops call `left()` between rows and stop
    when it says no; `spent` then says why, for the answer's partial marker."""

    timeout_s: float
    max_rows: int
    stopping: threading.Event = field(default_factory=threading.Event)
    deadline: float = 0.0
    rows: int = 0
    spent: str | None = None

    def __post_init__(self) -> None:
        if not self.deadline:
            self.deadline = time.monotonic() + self.timeout_s

    def left(self) -> bool:
        """True while time and rows remain and the service is not stopping; else records why."""
        if self.spent is None:
            if self.stopping.is_set():
                self.spent = "the service is stopping"
            elif time.monotonic() >= self.deadline:
                self.spent = f"time budget of {self.timeout_s:g} s spent"
            elif self.rows >= self.max_rows:
                self.spent = f"row budget of {self.max_rows} spans spent"
        return self.spent is None

    def take(self, rows: int) -> None:
        self.rows += rows

    @property
    def rows_left(self) -> int:
        return max(0, self.max_rows - self.rows)


class QueryGate:
    """Runs queries on daemon threads, `slots` at a time, within their budgets.

    A slot is held until the query's thread ends, even when its caller has given up on it, so
    a database call that outlives its deadline still counts against the concurrency."""

    def __init__(self, slots: int, timeout_s: float) -> None:
        self.slots = max(1, slots)
        self.timeout_s = timeout_s
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._running = 0

    @property
    def running(self) -> int:
        with self._lock:
            return self._running

    def budget(self, max_rows: int) -> Budget:
        return Budget(self.timeout_s, max_rows, self.stopping)

    def close(self) -> None:
        """Stop: running queries end at their next budget check; waiting and new ones get 503."""
        self.stopping.set()

    async def run(self, fn: Callable[[Budget], T], budget: Budget) -> T:
        """`fn(budget)` on a daemon thread once a slot is free; its result or exception."""
        await self._acquire(budget)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def settle(result: Any, exc: BaseException | None) -> None:
            if done.done():
                return
            if exc is not None:
                done.set_exception(exc)
            else:
                done.set_result(result)

        def work() -> None:
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn(budget)
            except BaseException as exc:  # handed to the waiting request, whatever it is
                error = exc
            finally:
                with self._lock:
                    self._running -= 1
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(settle, result, error)

        try:
            threading.Thread(target=work, name="railtrace-query", daemon=True).start()
        except BaseException:
            with self._lock:
                self._running -= 1
            raise
        while not done.done():
            if self.stopping.is_set():
                raise QueryUnavailable("the service is stopping")
            if time.monotonic() >= budget.deadline + OVERRUN_S:
                raise QueryUnavailable(
                    f"the query did not finish within its time budget of {budget.timeout_s:g} s"
                    " (query_timeout_s); narrow it (time range, filters) and try again"
                )
            await asyncio.wait({done}, timeout=POLL_S)
        return done.result()

    async def _acquire(self, budget: Budget) -> None:
        while True:
            with self._lock:
                if self._running < self.slots:
                    self._running += 1
                    return
            if self.stopping.is_set():
                raise QueryUnavailable("the service is stopping")
            if time.monotonic() >= budget.deadline:
                raise QueryUnavailable(
                    f"{self.slots} queries are running (query_concurrency) and none finished"
                    f" within {budget.timeout_s:g} s; try again",
                    retry_after_s=max(1, round(budget.timeout_s)),
                )
            await asyncio.sleep(POLL_S)
