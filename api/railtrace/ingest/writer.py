"""The bulk writer: one thread, group commit, acknowledge only after commit.

Receivers (HTTP and gRPC, many threads) build rows themselves through the OTLP codec
(`railtrace.ingest.accept`), then hand a `RowBatch` to the writer and wait. The writer takes
everything queued (up to `write_batch_spans`), inserts it in one transaction and only then
completes each caller's wait. Concurrent exports therefore share one commit (and one fsync)
without any of them being answered before its spans are durable.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from railtrace.otlp.rows import RowBatch
from railtrace.store import InsertResult, Store

log = logging.getLogger(__name__)

Done = Callable[[InsertResult | None, BaseException | None], None]


class Overloaded(Exception):
    """More spans accepted than committed (HTTP 429 / gRPC RESOURCE_EXHAUSTED)."""


class WriterUnavailable(Exception):
    """The writer is stopped or the database is failing (HTTP 503 / gRPC UNAVAILABLE)."""


# Failed commits in a row after which exports are refused (503) until the database takes a
# write again.
FAILURES_BEFORE_REFUSING = 3


def _database_failing(exc: BaseException) -> bool:
    """Whether `exc` says the database cannot take writes at all, rather than that one
    export's rows were refused: a lost or refused connection, a full disk, an I/O error."""
    if isinstance(exc, (OperationalError, InterfaceError)):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


def partial_success(batch: RowBatch, result: InsertResult | None, cap: int) -> tuple[int, str]:
    """`partial_success` of an export: spans rejected as invalid plus spans dropped by the
    per-trace cap, and a message naming both reasons."""
    dropped = result.dropped if result is not None else 0
    message = batch.error_message
    if dropped:
        why = f"{dropped} spans dropped: their trace already holds the most spans one trace may ({cap})"
        message = f"{message}; {why}" if message else why
    return batch.rejected + dropped, message


class BulkWriter:
    """Single writer thread with bounded pending spans.

    After `FAILURES_BEFORE_REFUSING` failed commits in a row it refuses exports and probes the
    database itself with a small write transaction (`Store.probe_write`), backing off from
    `retry_initial_s` to `retry_max_s`: the first probe that commits makes it accept again.
    Without the probe a refusing writer never commits again, so nothing would ever end the
    refusal (an outage of a few seconds stopped ingest for good).
    """

    def __init__(
        self,
        store: Store,
        *,
        batch_spans: int = 4096,
        max_pending_spans: int = 200_000,
        on_commit: Callable[[InsertResult], None] | None = None,
        on_depth: Callable[[int], None] | None = None,
        retry_initial_s: float = 0.1,
        retry_max_s: float = 5.0,
        on_recovered: Callable[[float], None] | None = None,
    ) -> None:
        self.store = store
        self.batch_spans = max(1, batch_spans)
        self.max_pending_spans = max_pending_spans
        self._on_commit = on_commit
        self._on_depth = on_depth
        self._on_recovered = on_recovered
        self.retry_initial_s = max(0.01, retry_initial_s)
        self.retry_max_s = max(self.retry_initial_s, retry_max_s)
        self._queue: deque[tuple[RowBatch, Done]] = deque()
        self._cond = threading.Condition()
        self._pending = 0
        self._running = False
        self._thread: threading.Thread | None = None
        self.consecutive_failures = 0
        self._failing_since: float | None = None  # monotonic time of the streak's first failure
        self._retry_delay = self.retry_initial_s
        self._next_probe = 0.0
        self.commits = 0
        self.probes = 0
        self._busy_since: float | None = None  # monotonic start of the commit or probe under way

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def refusing(self) -> bool:
        return self.consecutive_failures >= FAILURES_BEFORE_REFUSING

    @property
    def healthy(self) -> bool:
        return self._running and not self.refusing

    @property
    def alive(self) -> bool:
        """The writer thread runs (False before start, after stop, or if it died)."""
        return self._running and self._thread is not None and self._thread.is_alive()

    @property
    def stuck_for(self) -> float:
        """Seconds the commit (or probe) under way has taken so far (0: none). A database that
        stops answering without closing the connection (packets dropped) holds it for good."""
        since = self._busy_since
        return 0.0 if since is None else time.monotonic() - since

    @property
    def failing_for(self) -> float:
        """Seconds since the first failure of the current streak of failed writes (0: none)."""
        since = self._failing_since
        return 0.0 if since is None else time.monotonic() - since

    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._run, name="railtrace-writer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Commit what is queued, then stop."""
        with self._cond:
            self._running = False
            self._cond.notify_all()
        if self._thread:
            self._thread.join(timeout=60)
        # Anything left (thread did not finish) is answered as unavailable, never as accepted.
        while self._queue:
            _, done = self._queue.popleft()
            done(None, WriterUnavailable("service is stopping"))

    def submit(self, batch: RowBatch, done: Done) -> None:
        """Queue a batch; `done` is called from the writer thread after commit (or failure)."""
        n = len(batch)
        with self._cond:
            if not self._running:
                raise WriterUnavailable("service is stopping")
            if self.refusing:
                raise WriterUnavailable("database writes are failing; retrying")
            if self._pending and self._pending + n > self.max_pending_spans:
                raise Overloaded(f"{self._pending} spans waiting for commit")
            self._pending += n
            self._queue.append((batch, done))
            self._cond.notify()
        if self._on_depth:
            self._on_depth(self._pending)

    def write_sync(self, batch: RowBatch, timeout: float | None = None) -> InsertResult:
        """Queue and block until committed (gRPC handler threads, tests)."""
        fut: Future[InsertResult] = Future()

        def done(result: InsertResult | None, error: BaseException | None) -> None:
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)  # type: ignore[arg-type]

        self.submit(batch, done)
        return fut.result(timeout)

    async def write(self, batch: RowBatch) -> InsertResult:
        """Queue and await the commit without blocking the event loop."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[InsertResult] = loop.create_future()

        def settle(result: InsertResult | None, error: BaseException | None) -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)  # type: ignore[arg-type]

        def done(result: InsertResult | None, error: BaseException | None) -> None:
            loop.call_soon_threadsafe(settle, result, error)

        self.submit(batch, done)
        return await fut

    def _take(self) -> list[tuple[RowBatch, Done]]:
        with self._cond:
            while self._running and not self._queue:
                if self.refusing:
                    wait = self._next_probe - time.monotonic()
                    if wait <= 0:
                        return []  # time for the next probe (`_run`)
                    self._cond.wait(min(wait, 0.5))
                else:
                    self._cond.wait(0.5)
            items: list[tuple[RowBatch, Done]] = []
            spans = 0
            while self._queue and (not items or spans + len(self._queue[0][0]) <= self.batch_spans):
                item = self._queue.popleft()
                spans += len(item[0])
                items.append(item)
            return items

    def _run(self) -> None:
        while True:
            items = self._take()
            if not items:
                if not self._running:
                    return
                if self.refusing and time.monotonic() >= self._next_probe:
                    self._probe()
                continue
            self._commit(items)

    def _probe(self) -> None:
        """One write transaction while refusing; success ends the refusal, failure backs off."""
        self.probes += 1
        self._busy_since = time.monotonic()
        try:
            self.store.probe_write()
        except Exception as exc:
            self._busy_since = None
            self._retry_delay = min(self._retry_delay * 2, self.retry_max_s)
            self._next_probe = time.monotonic() + self._retry_delay
            log.warning(
                "database still not writable (%s: %s); next try in %.1fs",
                type(exc).__name__,
                str(exc).splitlines()[0][:200] if str(exc) else "",
                self._retry_delay,
            )
            return
        self._busy_since = None
        self._succeeded()

    def _failed(self) -> None:
        self.consecutive_failures += 1
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        if self.consecutive_failures == FAILURES_BEFORE_REFUSING:
            log.error("database writes are failing: refusing exports and retrying the database")
            self._retry_delay = self.retry_initial_s
            self._next_probe = time.monotonic() + self._retry_delay

    def _succeeded(self) -> None:
        if self._failing_since is not None:
            outage = time.monotonic() - self._failing_since
            if self.refusing:
                log.warning("database writes work again after %.1fs: accepting exports", outage)
            if self._on_recovered:
                try:
                    self._on_recovered(outage)
                except Exception:
                    log.exception("on_recovered hook failed")
        self.consecutive_failures = 0
        self._failing_since = None
        self._retry_delay = self.retry_initial_s

    def _commit(self, items: list[tuple[RowBatch, Done]]) -> None:
        self._busy_since = time.monotonic()
        try:
            result = self.store.insert_batches([b for b, _ in items])
        except Exception as exc:
            self._busy_since = None
            # One bad export must not fail the others: retry one by one. Not when the database
            # itself is failing (unreachable, disk full): each retry would only fail again, and
            # against an unreachable server each waits for its connect timeout.
            if len(items) > 1 and not _database_failing(exc):
                for item in items:
                    self._commit([item])
                return
            log.warning("span insert failed: %s", exc)
            self._failed()
            self._finish(items, None, WriterUnavailable(f"database write failed: {type(exc).__name__}"))
            return
        self._busy_since = None
        self._succeeded()
        self.commits += 1
        if self._on_commit:
            try:
                self._on_commit(result)
            except Exception:  # metrics must never block acknowledgements
                log.exception("on_commit hook failed")
        # Per-call figures: each caller learns how many of its own spans were new.
        if len(items) == 1:
            self._finish(items, result, None)
        else:
            total = sum(len(b) for b, _ in items) or 1
            by_batch = result.dropped_by_batch or [0] * len(items)
            for (b, done), dropped in zip(items, by_batch, strict=True):
                kept = len(b) - dropped
                share = InsertResult(
                    inserted=round(result.inserted * kept / total),
                    duplicates=round(result.duplicates * kept / total),
                    dropped=dropped,
                )
                self._finish([(b, done)], share, None)

    def _finish(
        self, items: list[tuple[RowBatch, Done]], result: InsertResult | None, error: BaseException | None
    ) -> None:
        with self._cond:
            self._pending -= sum(len(b) for b, _ in items)
        for _, done in items:
            try:
                done(result, error)
            except Exception:
                log.exception("acknowledgement callback failed")
        if self._on_depth:
            self._on_depth(self._pending)
