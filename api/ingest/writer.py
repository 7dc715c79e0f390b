"""The bulk writer: one thread, group commit, acknowledge only after commit.

Receivers (HTTP and gRPC, many threads) decode, normalise and build rows themselves, then
hand a `RowBatch` to the writer and wait. The writer takes everything queued (up to
`write_batch_spans`), inserts it in one transaction and only then completes each caller's
wait. Concurrent exports therefore share one commit (and one fsync) without any of them
being answered before its spans are durable.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from railtrace.otlp.decode import parse_json, parse_protobuf
from railtrace.store import InsertResult, RowBatch, Store, rows_from_bytes, rows_from_request

log = logging.getLogger(__name__)

Done = Callable[[InsertResult | None, BaseException | None], None]


class Overloaded(Exception):
    """More spans accepted than committed (HTTP 429 / gRPC RESOURCE_EXHAUSTED)."""


class WriterUnavailable(Exception):
    """The writer is stopped or the database is failing (HTTP 503 / gRPC UNAVAILABLE)."""


def prepare(
    body: bytes | ExportTraceServiceRequest,
    media: str = "application/x-protobuf",
    content_free: bool = False,
    sender: str | None = None,
) -> RowBatch:
    """Turn an export call into rows (on the receiver's event loop or in a worker thread).

    `content_free`: the caller's content filter has already ruled out content attributes.
    `sender`: the address the call came from (`railtrace.server.senders`), kept on each resource.
    Raises `PayloadError` for a payload that cannot be parsed at all.
    """
    if isinstance(body, ExportTraceServiceRequest):
        return rows_from_request(body, content_free=content_free, sender=sender)
    if media == "application/json":
        return rows_from_request(parse_json(body), content_free=content_free, sender=sender)
    batch = rows_from_bytes(body, content_free, sender)  # the usual call: no protobuf objects at all
    if batch is not None:
        return batch
    return rows_from_request(parse_protobuf(body), raw=body, content_free=content_free, sender=sender)


class BulkWriter:
    """Single writer thread with bounded pending spans."""

    def __init__(
        self,
        store: Store,
        *,
        batch_spans: int = 4096,
        max_pending_spans: int = 200_000,
        on_commit: Callable[[InsertResult], None] | None = None,
        on_depth: Callable[[int], None] | None = None,
    ) -> None:
        self.store = store
        self.batch_spans = max(1, batch_spans)
        self.max_pending_spans = max_pending_spans
        self._on_commit = on_commit
        self._on_depth = on_depth
        self._queue: deque[tuple[RowBatch, Done]] = deque()
        self._cond = threading.Condition()
        self._pending = 0
        self._running = False
        self._thread: threading.Thread | None = None
        self.consecutive_failures = 0
        self.commits = 0

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def healthy(self) -> bool:
        return self._running and self.consecutive_failures < 3

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
            if self.consecutive_failures >= 3:
                raise WriterUnavailable("database writes are failing")
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
                continue
            self._commit(items)

    def _commit(self, items: list[tuple[RowBatch, Done]]) -> None:
        try:
            result = self.store.insert_batches([b for b, _ in items])
        except Exception as exc:
            if len(items) > 1:  # one bad export must not fail the others: retry one by one
                for item in items:
                    self._commit([item])
                return
            log.warning("span insert failed: %s", exc)
            self.consecutive_failures += 1
            self._finish(items, None, WriterUnavailable(f"database write failed: {type(exc).__name__}"))
            return
        self.consecutive_failures = 0
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
            for b, done in items:
                share = InsertResult(
                    inserted=round(result.inserted * len(b) / total),
                    duplicates=round(result.duplicates * len(b) / total),
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
