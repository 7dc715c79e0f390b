"""The store's facade: `Store`, one object per engine whose methods are the SQL the service
runs, each handed to the module of its job -- span writes (`writes.py`), trace leases
(`leases.py`), reads (`reads.py`), assembly results (`publish.py`), upkeep (`upkeep.py`) -- over
one shared `StoreContext` (`connection.py`); statement building is in `statements.py`.

The result types callers see (`InsertResult`, `AssembledGroup`, `DirtyTrace`) are re-exported
here; statement helpers are imported from the module that holds them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

from sqlalchemy import Engine

from railtrace.model import KeyHolder, RequestSummary, Span
from railtrace.otlp.rows import RowBatch
from railtrace.store.connection import StoreContext
from railtrace.store.leases import DirtyTrace, Leases
from railtrace.store.publish import AssembledGroup, Publisher
from railtrace.store.queries import Page, RequestQuery
from railtrace.store.reads import Reads
from railtrace.store.upkeep import Upkeep
from railtrace.store.writes import InsertResult, SpanWrites

__all__ = ["AssembledGroup", "DirtyTrace", "InsertResult", "Store"]


class Store:
    """SQL for one engine. Thread-safe: every method takes its own connection."""

    def __init__(self, engine: Engine, max_spans_per_trace: int = 0) -> None:
        ctx = StoreContext(engine)
        self.engine = engine
        self.sqlite = ctx.sqlite
        self._q = ctx.q
        self._writers = ctx.writers
        self._wal = ctx.wal
        self._read = ctx.read
        self._upkeep = Upkeep(ctx)
        self._writes = SpanWrites(ctx, max_spans_per_trace, self._upkeep.checkpoint)
        self._leases = Leases(ctx)
        self._reads = Reads(ctx)
        self._publisher = Publisher(ctx)

    @property
    def max_spans_per_trace(self) -> int:
        """Spans one trace id may hold; chunks that would take it past are dropped (0: no cap)."""
        return self._writes.max_spans_per_trace

    @max_spans_per_trace.setter
    def max_spans_per_trace(self, value: int) -> None:
        self._writes.max_spans_per_trace = value

    # -- span writes (writes.py) ---------------------------------------------------------------

    def insert_batches(self, batches: Sequence[RowBatch]) -> InsertResult:
        """`SpanWrites.insert_batches`: several export calls' chunks in one transaction."""
        return self._writes.insert_batches(batches)

    def probe_write(self) -> None:
        """`SpanWrites.probe_write`: one small durable write; raises if the database can't take it."""
        self._writes.probe_write()

    # -- trace leases (leases.py) --------------------------------------------------------------

    def dirty_traces(self, quiet_before_ns: int, wait_before_ns: int, limit: int = 500) -> list[DirtyTrace]:
        """`Leases.dirty_traces`: traces ready for assembly."""
        return self._leases.dirty_traces(quiet_before_ns, wait_before_ns, limit)

    def claim_ready(
        self,
        owner: str,
        quiet_before_ns: int,
        wait_before_ns: int,
        now_ns: int,
        lease_ns: int,
        limit: int = 500,
        skip: Collection[str] = (),
        again: Collection[str] = (),
    ) -> list[DirtyTrace]:
        """`Leases.claim_ready`: lease up to `limit` ready traces to `owner`."""
        return self._leases.claim_ready(
            owner, quiet_before_ns, wait_before_ns, now_ns, lease_ns, limit, skip, again
        )

    def claim(self, owner: str, trace_ids: Iterable[str], now_ns: int, lease_ns: int) -> set[str]:
        """`Leases.claim`: lease these traces to `owner` where no other replica holds them."""
        return self._leases.claim(owner, trace_ids, now_ns, lease_ns)

    def release(self, owner: str, trace_ids: Iterable[str]) -> None:
        """`Leases.release`: give up `owner`'s leases on these traces."""
        self._leases.release(owner, trace_ids)

    def count_dirty(self) -> int:
        return self._leases.count_dirty()

    def trace_states(self, trace_ids: Iterable[str]) -> dict[str, DirtyTrace]:
        """`Leases.trace_states`: arrival state of these traces (unknown ids are absent)."""
        return self._leases.trace_states(trace_ids)

    def traces_for_keys(self, keys: Iterable[str]) -> list[KeyHolder]:
        """`Leases.traces_for_keys`: (request key, trace id, first arrival) of traces holding these keys."""
        return self._leases.traces_for_keys(keys)

    # -- reads (reads.py) ----------------------------------------------------------------------

    def load_spans(self, trace_ids: Iterable[str], normalize: bool = True) -> list[Span]:
        """`Reads.load_spans`: spans of these traces."""
        return self._reads.load_spans(trace_ids, normalize)

    def load_spans_page(
        self, trace_ids: Iterable[str], after: tuple[str, int, int] | None, limit: int
    ) -> tuple[list[Span], tuple[str, int, int] | None]:
        """`Reads.load_spans_page`: a page of these traces' spans and the next page's position."""
        return self._reads.load_spans_page(trace_ids, after, limit)

    def count_spans(self) -> int:
        """`Reads.count_spans`: spans stored."""
        return self._reads.count_spans()

    def span_ids(self) -> set[tuple[str, str]]:
        """`Reads.span_ids`: (trace id, span id) of every stored span (for checks and tests)."""
        return self._reads.span_ids()

    def previous_summaries(self, trace_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """`Reads.previous_summaries`: stored summaries of these traces' requests."""
        return self._reads.previous_summaries(trace_ids)

    def list_requests(self, q: RequestQuery) -> Page:
        """`Reads.list_requests`: a page of request summaries."""
        return self._reads.list_requests(q)

    def get_request(self, ident: str) -> dict[str, Any] | None:
        """`Reads.get_request`: a summary by trace id (primary or stitched) or by request id."""
        return self._reads.get_request(ident)

    def get_request_json(self, ident: str) -> bytes | None:
        """`Reads.get_request_json`: the stored JSON of `get_request`, as stored."""
        return self._reads.get_request_json(ident)

    def service_names(self, limit: int) -> list[str]:
        """`Reads.service_names`: the services that sent spans."""
        return self._reads.service_names(limit)

    def trace_exists(self, trace_id: str) -> bool:
        return self._reads.trace_exists(trace_id)

    def stats(self, group_by: str, since_ns: int | None, until_ns: int | None) -> list[dict[str, Any]]:
        """`Reads.stats`: requests and mean TTFT / KV time per group."""
        return self._reads.stats(group_by, since_ns, until_ns)

    # -- assembly results (publish.py) ---------------------------------------------------------

    def save_assembly(
        self,
        summaries: Sequence[RequestSummary],
        group: dict[str, int],
        superseded: Iterable[str],
        now_ns: int,
    ) -> None:
        """`Publisher.save_assembly`: store summaries and clear their traces' dirty marks."""
        self._publisher.save_assembly(summaries, group, superseded, now_ns)

    def publish(
        self, groups: Sequence[AssembledGroup], now_ns: int, owner: str | None = None
    ) -> list[AssembledGroup]:
        """`Publisher.publish`: store these groups' summaries in one transaction."""
        return self._publisher.publish(groups, now_ns, owner)

    # -- upkeep (upkeep.py) --------------------------------------------------------------------

    def delete_older_than(self, cutoff_ns: int, batch: int = 500) -> int:
        """`Upkeep.delete_older_than`: one bounded batch of old traces deleted."""
        return self._upkeep.delete_older_than(cutoff_ns, batch)

    def refresh_statistics(self) -> list[str]:
        """`Upkeep.refresh_statistics`: PostgreSQL tables ANALYZEd that outgrew their statistics."""
        return self._upkeep.refresh_statistics()

    def ping(self) -> None:
        self._upkeep.ping()
