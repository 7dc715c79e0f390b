"""Span writes: the span writer's group commit of export calls (chunk rows by COPY or multi-row
INSERT, resources, request keys, trace rows and their per-trace cap) and its write probe.
Apart from the other jobs because only the single writer thread runs it, and its cost is
ingest's.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    select,
)

from railtrace.otlp.rows import RowBatch, head_of_chunk
from railtrace.store.connection import MAX_KNOWN_RESOURCES, Job, StoreContext
from railtrace.store.schema import (
    span_chunks,
    traces,
)
from railtrace.store.statements import (
    _COPY_TYPES,
    _PG_INSERT_KEYS,
    _PG_UPSERT_TRACES,
    _STAGING,
    _STAGING_BEFORE_14,
    _TRACE_ARRIVED_AGAIN,
    _TRACE_COLUMNS,
    INSERT_COLUMNS,
    _chunks,
    _insert_values,
    among,
    listed,
)


@dataclass(slots=True)
class InsertResult:
    inserted: int
    duplicates: int
    # Spans not stored because their trace already held `max_spans_per_trace`: in all, and per
    # batch passed to `insert_batches` (in its order).
    dropped: int = 0
    dropped_by_batch: list[int] | None = None


class SpanWrites(Job):
    """The span writer's SQL: chunk, resource, request key and trace rows of export calls."""

    def __init__(self, ctx: StoreContext, max_spans_per_trace: int, checkpoint: Callable[[], None]) -> None:
        super().__init__(ctx)
        # Spans one trace id may hold; spans that would take it past are dropped (0: no cap).
        self.max_spans_per_trace = max_spans_per_trace
        self._span_counts = select(traces.c.trace_id, traces.c.span_count).where(
            among(traces.c.trace_id, "ids", self.sqlite)
        )
        # The WAL checkpoint after a commit (`Upkeep.checkpoint`).
        self._checkpoint = checkpoint
        p = "?" if self.sqlite else "%s"
        self._known_resources: set[int] = set()
        self._last_received_ns = 0
        self._probes = 0
        self._sql_chunk = (
            f"INSERT INTO span_chunks ({INSERT_COLUMNS}) VALUES ({', '.join([p] * 5)}) ON CONFLICT DO NOTHING"
        )
        self._sql_key = (
            f"INSERT INTO trace_keys (request_key, trace_id) VALUES ({p}, {p}) ON CONFLICT DO NOTHING"
        )
        self._sql_resource = (
            f"INSERT INTO resources (id, attributes) VALUES ({p}, {p}) ON CONFLICT DO NOTHING"
        )
        self._sql_trace = (
            f"INSERT INTO traces ({_TRACE_COLUMNS}) VALUES ({p}, {p}, {p}, {p}, {p}, TRUE, 0)"
            f"{_TRACE_ARRIVED_AGAIN}"
        )

    def _received_ns(self) -> int:
        now = max(time.time_ns(), self._last_received_ns + 1)
        self._last_received_ns = now
        return now

    def insert_batches(self, batches: Sequence[RowBatch]) -> InsertResult:
        """Insert the span chunks of several export calls in one transaction (group commit).

        A chunk already stored (same trace, same bytes: an exporter's retry) is ignored and its
        spans counted as duplicates; only traces that got new chunks are marked for
        (re)assembly. A span re-sent inside different bytes is stored again and dropped when
        read (`load_spans` keeps the first copy). Called from the single writer thread; the
        rows are the batches' own lists, stamped with this commit's receive time in place.
        """
        received = self._received_ns()
        rows: list[list[Any]] = []
        new_resources: dict[int, bytes] = {}
        keys: set[tuple[str, str]] = set()
        total = 0
        for b in batches:
            keys |= b.keys
            total += b.span_count
            for r in b.chunks:
                r[2] = received
            rows += b.chunks
            for rid, blob in b.resources.items():
                if rid not in self._known_resources:
                    new_resources[rid] = blob
        if not rows:
            return InsertResult(0, 0)
        dropped: dict[int, int] = {}  # id of a batch's chunk row -> its spans left out by the cap
        with self._turn():
            counts = self._insert(rows, new_resources, keys, received, dropped)
        if self._wal is not None:
            self._wal.sync()  # durable before any of these exports is answered
            self._checkpoint()
        if len(self._known_resources) > MAX_KNOWN_RESOURCES:
            self._known_resources.clear()
        self._known_resources.update(new_resources)
        inserted = sum(counts.values())
        if not dropped:
            return InsertResult(inserted, total - inserted)
        by_batch = [sum(dropped.get(id(r), 0) for r in b.chunks) for b in batches]
        n = sum(by_batch)
        return InsertResult(inserted, total - inserted - n, n, by_batch)

    def _insert(
        self,
        rows: list[list[Any]],
        new_resources: dict[int, bytes],
        keys: set[tuple[str, str]],
        received: int,
        dropped: dict[int, int],
    ) -> Counter[str]:
        """The transaction of `insert_batches`; returns the spans written per trace and counts
        the spans left out by the per-trace cap in `dropped` (by chunk row)."""
        with self._begin() as conn:
            if new_resources:  # first: the caller counts them as stored whatever the cap leaves
                conn.exec_driver_sql(self._sql_resource, list(new_resources.items()))
            if self.max_spans_per_trace > 0:
                rows = self._within_cap(conn, rows, dropped)
                if not rows:
                    return Counter()
            new = self._insert_chunks(conn, rows)
            if new < len(rows):  # some were already stored: count only the chunks this commit wrote
                written: set[tuple[str, int]] = set()
                for chunk in _chunks(sorted({r[0] for r in rows}), 500):
                    found = conn.execute(
                        select(span_chunks.c.trace_id, span_chunks.c.chunk_id).where(
                            span_chunks.c.trace_id.in_(chunk), span_chunks.c.received_ns == received
                        )
                    )
                    written.update((tid, cid) for tid, cid in found)
                # Each written chunk once (the same retry may have been queued twice).
                rows = list({(r[0], r[1]): r for r in rows if (r[0], r[1]) in written}.values())
            counts: Counter[str] = Counter()
            roots = set()
            for r in rows:
                counts[r[0]] += r[3]
                if r[5]:
                    roots.add(r[0])
            self._insert_rows(conn, self._sql_key, _PG_INSERT_KEYS, sorted(keys))
            trace_rows = [(tid, received, received, n, tid in roots) for tid, n in sorted(counts.items())]
            self._insert_rows(conn, self._sql_trace, _PG_UPSERT_TRACES, trace_rows)
        return counts

    def _within_cap(
        self, conn: Connection, rows: list[list[Any]], dropped: dict[int, int]
    ) -> list[list[Any]]:
        """The rows that keep each trace within `max_spans_per_trace` spans, in order; the
        spans left out are counted in `dropped` (by id of their row). A chunk that would take
        its trace past the cap is cut: its first spans up to the cap are kept (a new chunk of
        them), the rest refused, so a trace never holds more than the cap and a call is refused
        only its excess. Why a cap: one trace id fed hundreds of thousands of spans made every
        read and assembly of it load them all (seconds and hundreds of MB each time), and every
        other request's verdict waited behind it. Why cut: refusing the whole chunk refused
        spans the trace still had room for."""
        held: dict[str, int] = {}
        for group in _chunks(sorted({r[0] for r in rows}), 500):
            for tid, n in conn.execute(self._span_counts, {"ids": listed(group, self.sqlite)}):
                held[tid] = n
        cap = self.max_spans_per_trace
        kept = []
        for r in rows:
            has = held.get(r[0], 0)
            room = cap - has
            if r[3] <= room:
                held[r[0]] = has + r[3]
                kept.append(r)
                continue
            part = head_of_chunk(r, room) if room > 0 else None
            if part is None:
                dropped[id(r)] = r[3]
                continue
            dropped[id(r)] = r[3] - part[3]
            held[r[0]] = has + part[3]
            kept.append(part)
        return kept

    def _insert_chunks(self, conn: Connection, rows: list[list[Any]]) -> int:
        """Insert chunk rows, skipping ones already stored; returns how many were new (more than
        `len(rows)` when the driver cannot tell, which sends the caller the careful way).

        PostgreSQL: binary COPY into a per-connection staging table, then one INSERT ... SELECT
        with ON CONFLICT DO NOTHING -- several times cheaper than row-by-row parameter binding
        on both the client and the server. SQLite: executemany in one transaction.
        """
        dbapi = conn.connection
        cur = dbapi.cursor()
        try:
            if self.sqlite:
                return _insert_values(cur, self._sql_chunk, [r[:5] for r in rows])
            if not dbapi.info.get("railtrace_staging_chunks"):
                # The bodies are compressed as COPY writes them here and kept compressed when
                # moved, so this table compresses them as span_chunks does (lz4, migration 0006).
                cur.execute(
                    _STAGING if (conn.dialect.server_version_info or (0,)) >= (14,) else _STAGING_BEFORE_14
                )
                dbapi.info["railtrace_staging_chunks"] = True
            with cur.copy(f"COPY railtrace_chunks_in ({INSERT_COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(_COPY_TYPES)
                for r in rows:
                    copy.write_row(r[:5])
            cur.execute(
                f"INSERT INTO span_chunks ({INSERT_COLUMNS}) SELECT {INSERT_COLUMNS} FROM railtrace_chunks_in"
                " ON CONFLICT DO NOTHING"
            )
            return cur.rowcount
        finally:
            cur.close()

    def _insert_rows(self, conn: Connection, sql: str, pg_sql: str, rows: list[tuple[Any, ...]]) -> None:
        """These rows: on SQLite by `sql` (a one-row INSERT) in a few multi-row statements, on
        PostgreSQL by `pg_sql` in one statement taking one array per column."""
        if not rows:
            return
        if not self.sqlite:
            conn.exec_driver_sql(pg_sql, tuple(list(column) for column in zip(*rows, strict=True)))
            return
        cur = conn.connection.cursor()
        try:
            _insert_values(cur, sql, rows)
        finally:
            cur.close()

    def probe_write(self) -> None:
        """Commit one small write, made durable as span commits are; raises if the database
        cannot take it (unreachable, disk full). The span writer calls this while it refuses
        exports, to learn when writes work again.

        SQLite: the header's `user_version` (which nothing else uses) is set, a real page
        write through the WAL; PostgreSQL: a transaction id is assigned, so its commit
        writes and flushes a commit record. Neither touches the schema's tables."""
        with self._turn(), self.engine.connect() as conn:
            if self.sqlite:
                # Two constants in turn: each probe changes the header, so each one writes.
                self._probes += 1
                conn.exec_driver_sql(_SQLITE_PROBES[self._probes % 2])
            else:
                conn.exec_driver_sql("SELECT txid_current()")
            conn.commit()
        if self._wal is not None:
            self._wal.sync()


_SQLITE_PROBES = ("PRAGMA user_version = 1", "PRAGMA user_version = 2")
