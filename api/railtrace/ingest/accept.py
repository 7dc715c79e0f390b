"""Accepting one export call, the same way whichever receiver it came through.

HTTP (`railtrace.server.otlp_http`) and gRPC (`railtrace.server.grpc_server`) each read their
transport's framing, then hand the bytes here: shed load while the writer is behind, build the
rows through the OTLP codec (`railtrace.otlp.export`), wait for the commit, count the outcome
and work out the `partial_success` (`rows_of` + `commit` on an event loop, `accept_blocking` on a
handler thread). Each receiver only maps the `Accepted` outcome to its own
status codes, so the two cannot drift apart in what they accept or how they count it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from starlette.concurrency import run_in_threadpool

from railtrace.ingest.writer import BulkWriter, Overloaded, WriterUnavailable, partial_success
from railtrace.metrics import Metrics
from railtrace.otlp import PayloadError
from railtrace.otlp.content import ContentFilter
from railtrace.otlp.export import PROTOBUF, export_rows
from railtrace.otlp.rows import RowBatch
from railtrace.store import InsertResult


class Outcome(Enum):
    """What became of an export call; each receiver maps it to its status codes."""

    COMMITTED = "ok"  # every valid span committed (some may be in `rejected`: partial success)
    INVALID = "invalid"  # not an export request at all (HTTP 400, gRPC INVALID_ARGUMENT)
    BEHIND = "behind"  # shed before decoding: the writer holds too many spans (429, RESOURCE_EXHAUSTED)
    OVERLOADED = "overloaded"  # this call's spans do not fit in the writer's queue (429, same)
    UNAVAILABLE = "unavailable"  # the writer is stopping or the database refuses writes (503, UNAVAILABLE)


@dataclass(frozen=True, slots=True)
class Accepted:
    outcome: Outcome
    message: str = ""
    rejected: int = 0  # spans refused: invalid, or over the per-trace cap
    committed: int = 0  # spans new to the store

    @property
    def retry(self) -> bool:
        """Whether the sender should retry the call later."""
        return self.outcome in (Outcome.BEHIND, Outcome.OVERLOADED, Outcome.UNAVAILABLE)


class ExportAcceptor:
    """The shared path from an export call's bytes to its commit and its answer."""

    def __init__(
        self,
        writer: BulkWriter,
        content: ContentFilter,
        metrics: Metrics,
        *,
        max_pending_spans: int,
        max_spans_per_trace: int,
        parse_inline_max_bytes: int,
        observe: Callable[[bytes, RowBatch], None] | None = None,
    ) -> None:
        self.writer = writer
        self.content = content
        self.metrics = metrics
        self.max_pending_spans = max_pending_spans
        self.max_spans_per_trace = max_spans_per_trace
        self.parse_inline_max_bytes = parse_inline_max_bytes
        self.observe = observe

    def behind(self, transport: str) -> Accepted | None:
        """`BEHIND` (and counted) while the writer holds too many spans: checked before a body is
        read or decoded, so an overloaded service spends nothing on calls it will refuse."""
        if self.writer.pending < self.max_pending_spans:
            return None
        self.metrics.throttled(transport)
        return Accepted(Outcome.BEHIND, "ingest is behind")

    def rows(self, raw: bytes, media: str, sender: str | None, claims: str | None = None) -> RowBatch:
        """The call's rows (raises `PayloadError`). `sender` and `claims`: who sent it and who
        vouches for its `k8s.*` claims (`railtrace.server.senders.Sender`), kept on each resource.
        `observe` (the traced-share estimate, `railtrace.server.sampling`) sees the call's bytes
        and rows."""
        batch = export_rows(self.content, raw, media, sender, claims)
        if self.observe is not None:
            self.observe(raw, batch)
        return batch

    async def rows_of(
        self, transport: str, raw: bytes, media: str, sender: str | None, claims: str | None = None
    ) -> RowBatch | Accepted:
        """The call's rows, from an event loop; `INVALID` (and counted) for a payload that is not
        an export request. A typical exporter batch (512 spans, ~400 KB of protobuf) is parsed
        on the loop's thread: a worker thread would cost more CPU than the parse (wake-ups, GIL
        hand-offs) and the GIL gives it no parallelism; larger or JSON bodies are parsed in a
        worker thread so the loop keeps answering. Two steps with `commit` so that the caller
        drops the body before it waits: only the rows stay while a call waits for its commit."""
        try:
            if media == PROTOBUF and len(raw) <= self.parse_inline_max_bytes:
                return self.rows(raw, media, sender, claims)
            return await run_in_threadpool(self.rows, raw, media, sender, claims)
        except PayloadError as exc:
            return self._invalid(transport, exc)

    async def commit(self, transport: str, batch: RowBatch) -> Accepted:
        """Wait for the rows' commit without blocking the event loop; count the outcome."""
        try:
            result = await self.writer.write(batch) if len(batch) else None
        except (Overloaded, WriterUnavailable) as exc:
            return self._refused(transport, exc)
        return self._committed(transport, batch, result)

    def accept_blocking(
        self, transport: str, raw: bytes, media: str, sender: str | None, claims: str | None = None
    ) -> Accepted:
        """From a handler thread of its own (gRPC): parse here, block until the commit."""
        try:
            batch = self.rows(raw, media, sender, claims)
        except PayloadError as exc:
            return self._invalid(transport, exc)
        try:
            result = self.writer.write_sync(batch) if len(batch) else None
        except (Overloaded, WriterUnavailable) as exc:
            return self._refused(transport, exc)
        return self._committed(transport, batch, result)

    def _invalid(self, transport: str, exc: PayloadError) -> Accepted:
        self.metrics.export_done(transport, "invalid")
        return Accepted(Outcome.INVALID, str(exc))

    def _refused(self, transport: str, exc: Overloaded | WriterUnavailable) -> Accepted:
        self.metrics.throttled(transport)
        if isinstance(exc, Overloaded):
            return Accepted(Outcome.OVERLOADED, f"ingest is behind ({exc})")
        return Accepted(Outcome.UNAVAILABLE, str(exc))

    def _committed(self, transport: str, batch: RowBatch, result: InsertResult | None) -> Accepted:
        rejected, message = partial_success(batch, result, self.max_spans_per_trace)
        committed = result.inserted if result is not None else 0
        self.metrics.export_done(transport, "partial" if rejected else "ok", committed, batch.rejected)
        return Accepted(Outcome.COMMITTED, message, rejected, committed)
