"""The one place SQL is written: span inserts (group commit), assembly state, queries, retention."""

from __future__ import annotations

import contextlib
import functools
import math
import operator
import sqlite3
import time
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Engine,
    String,
    and_,
    any_,
    bindparam,
    delete,
    false,
    func,
    literal_column,
    null,
    or_,
    select,
    text,
    tuple_,
    union,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import Executable, Select

from railtrace.model import RequestSummary, Span, resolution_label
from railtrace.normalize import normalize_span, request_id_forms
from railtrace.otlp.rows import RowBatch, chunk_records
from railtrace.otlp.spans import StoredResource, records_reader
from railtrace.store.engine import SqliteWal, SqliteWriters, checkpoint_sqlite_wal, is_sqlite
from railtrace.store.queries import Cursor, Page, RequestOrder, RequestQuery, StoreError
from railtrace.store.rollup import DIMENSIONS, REQUEST_COLUMNS, RollupDelta, hour_of
from railtrace.store.rollup import read as rollup_read
from railtrace.store.schema import (
    FREE,
    LEASED,
    READY,
    request_flags,
    requests,
    resources,
    span_chunks,
    trace_keys,
    traces,
)

INSERT_COLUMNS = "trace_id, chunk_id, received_ns, span_count, body"
MAX_KNOWN_RESOURCES = 100_000
# Seconds between the span writer's passive WAL checkpoints (`Store._checkpoint`).
CHECKPOINT_INTERVAL_S = 0.5
# Chunk rows a page of `Store.load_spans_page` reads per query.
PAGE_CHUNKS = 32
_COPY_TYPES = ["text", "int8", "int8", "int4", "bytea"]
# PostgreSQL: a commit's request keys and trace rows, the rows of `Store._sql_key` and
# `Store._sql_trace`, each as one statement taking one array per column (see `_rows_as_arrays`),
# where executemany executed one statement per row.
_PG_INSERT_KEYS = (
    "INSERT INTO trace_keys (request_key, trace_id)"
    " SELECT * FROM unnest(%s::text[], %s::text[]) ON CONFLICT DO NOTHING"
)
# A trace that got spans again: its last arrival moves on and it awaits (re)assembly.
_TRACE_ARRIVED_AGAIN = (
    " ON CONFLICT (trace_id) DO UPDATE SET"
    " last_arrival_ns = excluded.last_arrival_ns,"
    " span_count = traces.span_count + excluded.span_count,"
    " has_root = (traces.has_root OR excluded.has_root),"
    " dirty = TRUE,"
    " late_spans = traces.late_spans"
    " + CASE WHEN traces.assembled_ns IS NULL THEN 0 ELSE excluded.span_count END"
)
_TRACE_COLUMNS = "trace_id, first_arrival_ns, last_arrival_ns, span_count, has_root, dirty, late_spans"
_PG_UPSERT_TRACES = (
    f"INSERT INTO traces ({_TRACE_COLUMNS}) SELECT *, TRUE, 0"
    " FROM unnest(%s::text[], %s::int8[], %s::int8[], %s::int4[], %s::bool[])"
    f"{_TRACE_ARRIVED_AGAIN}"
)
# The per-connection table ingest's COPY writes chunk rows to (`Store._insert_chunks`).
_STAGING = (
    "CREATE TEMP TABLE IF NOT EXISTS railtrace_chunks_in"
    " (LIKE span_chunks INCLUDING DEFAULTS INCLUDING COMPRESSION) ON COMMIT DELETE ROWS"
)
_STAGING_BEFORE_14 = (  # no per-column compression before PostgreSQL 14
    "CREATE TEMP TABLE IF NOT EXISTS railtrace_chunks_in"
    " (LIKE span_chunks INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
)


@dataclass(slots=True)
class InsertResult:
    inserted: int
    duplicates: int
    # Spans not stored because their trace already held `max_spans_per_trace`: in all, and per
    # batch passed to `insert_batches` (in its order).
    dropped: int = 0
    dropped_by_batch: list[int] | None = None


@dataclass(slots=True)
class AssembledGroup:
    """Summaries of one group of traces (a request, or the hops of one stitched together).

    `marks`: each trace id -> its last arrival seen when its spans were loaded. `superseded`:
    primary trace ids of stored requests these summaries replace. `speculative`: loaded
    before its quiet period ended, so `Store.publish` stores it only if nothing arrived since.
    `first`: no stored request held any of its traces when the caller looked
    (`Store.previous_summaries`, under its lease), so storing it deletes no old rows first;
    should one have appeared meanwhile, the insert fails on its key and nothing is stored.
    """

    summaries: list[RequestSummary]
    marks: dict[str, int]
    superseded: set[str] = field(default_factory=set)
    speculative: bool = False
    first: bool = False


@dataclass(slots=True)
class DirtyTrace:
    trace_id: str
    last_arrival_ns: int
    late_spans: int
    assembled: bool
    dirty: bool = True


class Store:
    """SQL for one engine. Thread-safe: every method takes its own connection."""

    def __init__(self, engine: Engine, max_spans_per_trace: int = 0) -> None:
        self.engine = engine
        self.sqlite = is_sqlite(engine)
        self._q = _statements(self.sqlite)
        # Spans one trace id may hold; chunks that would take it past are dropped (0: no cap).
        self.max_spans_per_trace = max_spans_per_trace
        self._span_counts = select(traces.c.trace_id, traces.c.span_count).where(
            among(traces.c.trace_id, "ids", self.sqlite)
        )
        # Writers of a SQLite file take turns through a lock that wakes the next at once.
        self._writers = SqliteWriters(engine.url.database or "") if self.sqlite else None
        # SQLite commits do not wait for the disk; the span writer flushes the WAL after its turn.
        self._wal = SqliteWal(engine.url.database or "") if self.sqlite else None
        self._last_checkpoint = -math.inf  # never: the first commit checkpoints, whatever the uptime
        p = "?" if self.sqlite else "%s"
        self._known_resources: set[int] = set()
        # Resources read back, by id. A row never changes (its id is a hash of its content) and
        # is never deleted, so they are kept across calls, up to about MAX_KNOWN_RESOURCES.
        self._resources: dict[int, StoredResource] = {}
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

    # -- ingest ----------------------------------------------------------------------------

    def _received_ns(self) -> int:
        now = max(time.time_ns(), self._last_received_ns + 1)
        self._last_received_ns = now
        return now

    def _checkpoint(self) -> None:
        """The span writer's share of keeping the WAL short, after its commit and outside its
        turn: a passive checkpoint at most every CHECKPOINT_INTERVAL_S, so that the copying
        happens while the other writers go on (SQLite's automatic checkpoint runs inside the
        commit that crosses its threshold, and so inside that writer's turn: tens to hundreds
        of milliseconds in which assembly could not store anything); and the WAL bound."""
        now = time.monotonic()
        if now - self._last_checkpoint < CHECKPOINT_INTERVAL_S:
            return
        self._last_checkpoint = now
        checkpoint_sqlite_wal(self.engine, self._turn)

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """This writer's turn among the SQLite file's writers (`SqliteWriters`); PostgreSQL
        needs none."""
        if self._writers is None:
            yield
        else:
            with self._writers.turn():
                yield

    @contextlib.contextmanager
    def _read(self, per_value_plans: bool = False) -> Iterator[Connection]:
        """A read-only transaction, ended by COMMIT (`per_value_plans`: see `_per_value_plans`).

        Why not the ROLLBACK that closing a connection would send: psycopg forgets every
        statement it prepared on a connection at each ROLLBACK (and has the server drop them),
        so no statement of the store stayed prepared from one call to the next, and PostgreSQL
        parsed and planned each run anew (planning alone 0.15-0.5 ms per run of an assembly
        statement, and of the request detail lookup; benchmarks/verdicts/README.md). A read that
        fails still rolls back.
        """
        with self.engine.connect() as conn:
            with _per_value_plans(conn) if per_value_plans else contextlib.nullcontext():
                yield conn
            conn.commit()

    @contextlib.contextmanager
    def _begin(self, per_value_plans: bool = False) -> Iterator[Connection]:
        """A write transaction, in this writer's turn."""
        with (
            self._turn(),
            self.engine.begin() as conn,
            _per_value_plans(conn) if per_value_plans else contextlib.nullcontext(),
        ):
            yield conn

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
        dropped: list[list[Any]] = []
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
        gone = {id(r) for r in dropped}
        by_batch = [sum(r[3] for r in b.chunks if id(r) in gone) for b in batches]
        n = sum(by_batch)
        return InsertResult(inserted, total - inserted - n, n, by_batch)

    def _insert(
        self,
        rows: list[list[Any]],
        new_resources: dict[int, bytes],
        keys: set[tuple[str, str]],
        received: int,
        dropped: list[list[Any]],
    ) -> Counter[str]:
        """The transaction of `insert_batches`; returns the spans written per trace and adds
        the chunk rows left out by the per-trace cap to `dropped`."""
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
        self, conn: Connection, rows: list[list[Any]], dropped: list[list[Any]]
    ) -> list[list[Any]]:
        """The rows that keep each trace within `max_spans_per_trace` spans, in order; the
        others go to `dropped`. A chunk (one export call's spans of a trace) is kept or dropped
        whole, so a trace never holds more than the cap. Why: one trace id fed hundreds of
        thousands of spans made every read and assembly of it load them all (seconds and
        hundreds of MB each time), and every other request's verdict waited behind it."""
        held: dict[str, int] = {}
        for group in _chunks(sorted({r[0] for r in rows}), 500):
            for tid, n in conn.execute(self._span_counts, {"ids": listed(group, self.sqlite)}):
                held[tid] = n
        cap = self.max_spans_per_trace
        kept = []
        for r in rows:
            n = held.get(r[0], 0) + r[3]
            if n > cap:
                dropped.append(r)
            else:
                held[r[0]] = n
                kept.append(r)
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

    # -- assembly state ----------------------------------------------------------------------

    def dirty_traces(self, quiet_before_ns: int, wait_before_ns: int, limit: int = 500) -> list[DirtyTrace]:
        """Traces whose last span is older than the quiet period and whose root arrived
        (or which waited longer than the maximum)."""
        t = traces.c

        def waiting(lease: ColumnElement[bool]) -> Any:  # free or held: each by its own index
            return (
                select(t.trace_id, t.last_arrival_ns, t.late_spans, t.assembled_ns)
                .where(
                    READY,
                    lease,
                    t.last_arrival_ns <= quiet_before_ns,
                    or_(t.has_root.is_(True), t.first_arrival_ns <= wait_before_ns),
                )
                .order_by(t.last_arrival_ns)
                .limit(limit)
                .subquery()
            )

        found = union_all(*(select(*q.c) for q in (waiting(FREE), waiting(LEASED)))).subquery()
        q = select(*found.c).order_by(found.c.last_arrival_ns, found.c.trace_id).limit(limit)
        with self._read(per_value_plans=True) as conn:
            return [DirtyTrace(r[0], r[1], r[2], r[3] is not None) for r in conn.execute(q)]

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
        """Lease up to `limit` ready traces (as `dirty_traces` picks them) to `owner`: free
        ones and, of those `owner` holds already, the ones in `again`. Never returned: those in
        `skip` (traces `owner` has assembled and not stored yet); should their lease have run
        out, it is renewed.

        Replicas sharing one PostgreSQL each claim a disjoint set: the candidate rows are
        locked with FOR UPDATE SKIP LOCKED, so a replica never waits for or takes rows
        another is claiming, and a lease (`claimed_by`, `claimed_until_ns`) keeps them its
        own until it saves or releases them -- or the lease runs out because it died.
        Why `again` and not every lease of `owner`: the traces it has assembled ahead are
        leased to it too, and leaving them out by their lease costs nothing, where testing
        each row against `skip` in the statement cost PostgreSQL a comparison per listed id
        (a claim of 128 took 21 ms instead of 6 with a thousand of them).
        """
        params = {
            "owner": owner,
            "now": now_ns,
            "until": now_ns + lease_ns,
            "quiet_before": quiet_before_ns,
            "wait_before": wait_before_ns,
            "limit": limit,
            "again": listed(again, self.sqlite),
        }
        with self._begin(per_value_plans=True) as conn:
            rows = list(conn.execute(self._q.claim_ready, params).all())
        if skip:  # only if their lease ran out: it is renewed, they are not returned
            rows = [r for r in rows if r[0] not in skip]
        rows.sort(key=lambda r: (r[1], r[0]))
        return [DirtyTrace(r[0], r[1], r[2], r[3] is not None) for r in rows]

    def claim(self, owner: str, trace_ids: Iterable[str], now_ns: int, lease_ns: int) -> set[str]:
        """Lease these traces (dirty or not) to `owner` where no other replica holds them;
        returns the ids now held by `owner` (unknown ids are never returned)."""
        ids = sorted(set(trace_ids))
        if not ids:
            return set()
        params = {"ids": listed(ids, self.sqlite), "owner": owner, "now": now_ns, "until": now_ns + lease_ns}
        with self._begin() as conn:
            return set(conn.execute(self._q.claim, params).scalars())

    def release(self, owner: str, trace_ids: Iterable[str]) -> None:
        """Give up `owner`'s leases on these traces (they stay dirty if they were)."""
        ids = sorted(set(trace_ids))
        if not ids:
            return
        with self._begin() as conn:
            _release(conn, owner, ids, self.sqlite)

    def count_dirty(self) -> int:
        with self._read() as conn:
            # Free and held traces are counted through their own partial indexes.
            free, held = (select(func.count()).where(READY, c).scalar_subquery() for c in (FREE, LEASED))
            return int(conn.execute(select(free + held)).scalar_one())

    def trace_states(self, trace_ids: Iterable[str]) -> dict[str, DirtyTrace]:
        """Arrival state of these traces (unknown ids are absent)."""
        ids = sorted(set(trace_ids))
        if not ids:
            return {}
        with self._read() as conn:
            rows = conn.execute(self._q.trace_states, {"ids": listed(ids, self.sqlite)}).all()
        return {r[0]: DirtyTrace(r[0], r[1], r[2], r[3] is not None, bool(r[4])) for r in rows}

    def traces_for_keys(self, keys: Iterable[str]) -> list[tuple[str, str]]:
        """(request key, trace id) for every trace holding one of these keys (stitching), each
        key's traces in the order they first arrived."""
        ks = sorted({k for k in keys if k})
        if not ks:
            return []
        with self._read() as conn:
            return [
                (r[0], r[1]) for r in conn.execute(self._q.traces_for_keys, {"ids": listed(ks, self.sqlite)})
            ]

    def load_spans(self, trace_ids: Iterable[str], normalize: bool = True) -> list[Span]:
        """Spans of these traces, attributes decoded; normalised unless the caller (assembly,
        which normalises itself) says not to. A span stored twice (re-sent in a different
        export call) is returned once, as first received."""
        ids = sorted(set(trace_ids))
        out: list[Span] = []
        if not ids:
            return out
        read = records_reader()
        known = self._resources
        with self._read() as conn:
            for group in _chunks(ids, 200):
                rows = _fetch_binary(conn, self._q.chunks, {"ids": listed(group, self.sqlite)})
                chunks = [(tid, chunk_records(body)) for tid, body in rows]
                needed = {rid for _, records in chunks for rid, _ in records}
                missing = needed - known.keys()
                if missing:
                    if len(known) > MAX_KNOWN_RESOURCES:  # start again from this group's (a new
                        # dict: other threads reading go on with the one they hold)
                        known = self._resources = {rid: known[rid] for rid in needed - missing}
                    found = conn.execute(self._q.resources, {"ids": listed(missing, self.sqlite)})
                    for rid, blob in found:
                        known[rid] = StoredResource.of(orjson.loads(blob))
                spans: list[Span] = []
                trace: list[Span] = []
                for i, (tid, records) in enumerate(chunks):
                    trace += read(tid, records, known)
                    if i + 1 < len(chunks) and chunks[i + 1][0] == tid:
                        continue  # rows come in trace order: the trace's next chunk
                    if len({sp.span_id for sp in trace}) < len(trace):  # a span re-sent in other bytes
                        trace = _first_of_each(trace)
                    spans += trace
                    trace = []
                if normalize:
                    spans = [normalize_span(sp) for sp in spans]
                spans.sort(key=_SPAN_ORDER)
                out += spans
        return out

    def load_spans_page(
        self, trace_ids: Iterable[str], after: tuple[str, int, int] | None, limit: int
    ) -> tuple[list[Span], tuple[str, int, int] | None]:
        """Up to `limit` normalised spans of these traces from position `after`, and the
        position of the next page (None: no more).

        A position is (trace id, chunk id, spans of that chunk already given): pages follow
        the chunks' key order, so a page reads only its own chunks however big the trace, and
        memory is bounded by `limit` (plus one chunk). A page's spans are in start order; a
        span re-sent in different bytes is returned once per page it appears in."""
        ids = sorted(set(trace_ids))
        out: list[Span] = []
        if not ids or limit <= 0:
            return out, None
        sc = span_chunks.c
        cols = select(sc.trace_id, sc.chunk_id, sc.body).where(among(sc.trace_id, "ids", self.sqlite))
        t: Any = bindparam("t")
        c: Any = bindparam("c")
        read = records_reader()
        pos, exclusive, more = after, False, True
        with self._read() as conn:
            while more and len(out) < limit:
                stmt, params = cols, {"ids": listed(ids, self.sqlite)}
                if pos is not None:
                    later = sc.chunk_id > c if exclusive else sc.chunk_id >= c
                    stmt = stmt.where(or_(sc.trace_id > t, and_(sc.trace_id == t, later)))
                    params |= {"t": pos[0], "c": pos[1]}
                stmt = stmt.order_by(sc.trace_id, sc.chunk_id).limit(bindparam("n"))
                rows = _fetch_binary(conn, stmt, params | {"n": PAGE_CHUNKS})
                taken: list[tuple[str, list[tuple[int, bytes]]]] = []
                room = limit - len(out)
                full = False
                for tid, cid, body in rows:
                    records = chunk_records(body)
                    skip = pos[2] if pos is not None and not exclusive and (tid, cid) == pos[:2] else 0
                    take = records[skip : skip + room]
                    room -= len(take)
                    taken.append((tid, take))
                    pos = (tid, cid, skip + len(take))
                    if skip + len(take) < len(records):
                        full = True  # the page ends inside this chunk
                        break
                known = self._resources_for(conn, {rid for _, rs in taken for rid, _ in rs})
                for tid, records in taken:
                    out += read(tid, records, known)
                exclusive = True
                if full:
                    break
                if len(rows) < PAGE_CHUNKS:
                    more = False
            if more and len(out) >= limit and pos is not None and not full:
                # The page ended with a chunk: is there a later one?
                later = or_(sc.trace_id > t, and_(sc.trace_id == t, sc.chunk_id > c))
                probe = select(sc.trace_id).where(among(sc.trace_id, "ids", self.sqlite), later).limit(1)
                params = {"ids": listed(ids, self.sqlite), "t": pos[0], "c": pos[1]}
                more = conn.execute(probe, params).first() is not None
        page = [normalize_span(sp) for sp in out]
        if len({sp.span_id for sp in page}) < len(page):
            page = _first_of_each(page)
        page.sort(key=_SPAN_ORDER)
        return page, pos if more else None

    def _resources_for(self, conn: Connection, needed: set[int]) -> dict[int, StoredResource]:
        """The stored resources of these ids, from the cache or read (and cached)."""
        known = self._resources
        missing = needed - known.keys()
        if missing:
            if len(known) > MAX_KNOWN_RESOURCES:
                known = self._resources = {rid: known[rid] for rid in needed - missing}
            found = conn.execute(self._q.resources, {"ids": listed(missing, self.sqlite)})
            for rid, blob in found:
                known[rid] = StoredResource.of(orjson.loads(blob))
        return known

    def count_spans(self) -> int:
        """Spans stored (a span re-sent inside a different export call counts twice)."""
        with self._read() as conn:
            total = conn.execute(select(func.sum(span_chunks.c.span_count))).scalar_one()
        return int(total or 0)

    def span_ids(self) -> set[tuple[str, str]]:
        """(trace id, span id) of every stored span; reads every chunk, so for checks and tests."""
        out: set[tuple[str, str]] = set()
        with self._read() as conn:
            for tid, body in conn.execute(select(span_chunks.c.trace_id, span_chunks.c.body)):
                out.update((tid, PbSpan.FromString(enc).span_id.hex()) for _, enc in chunk_records(body))
        return out

    def previous_summaries(self, trace_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Stored summaries of the requests these traces belonged to, by their primary trace."""
        ids = sorted(set(trace_ids))
        if not ids:
            return {}
        with self._read() as conn:
            rows = conn.execute(self._q.previous_summaries, {"ids": listed(ids, self.sqlite)}).all()
        return {tid: orjson.loads(blob) for tid, blob in rows}

    def save_assembly(
        self,
        summaries: Sequence[RequestSummary],
        group: dict[str, int],
        superseded: Iterable[str],
        now_ns: int,
    ) -> None:
        """Store summaries and clear their traces' dirty marks, whatever arrived meanwhile.

        `group` maps each trace id to the last arrival seen when it was loaded: a trace that got
        new spans since stays dirty and is assembled again. `superseded` are primary trace ids
        whose old request rows are replaced (a trace later stitched into another request).
        """
        self.publish([AssembledGroup(list(summaries), dict(group), set(superseded))], now_ns)

    def publish(
        self, groups: Sequence[AssembledGroup], now_ns: int, owner: str | None = None
    ) -> list[AssembledGroup]:
        """Store the summaries of these groups in one transaction; returns the groups stored.

        A speculative group (loaded before its quiet period ended) is stored only if none of
        its traces got a span since it was loaded. The check locks those trace rows first (a
        write on each, so SQLite's write lock is held too): an export committing a span to
        one of them either came before, and the group is dropped (its traces stay dirty and
        are assembled again after their new quiet period), or waits for this commit and marks
        the trace dirty again. `owner`'s leases on every trace of `groups` are given up.
        """
        built = [_request_rows(g.summaries, now_ns) for g in groups]
        with self._begin() as conn:
            speculative = {t: seen for g in groups if g.speculative for t, seen in g.marks.items()}
            unchanged = _unchanged(conn, speculative) if speculative else set()
            keep = [not g.speculative or g.marks.keys() <= unchanged for g in groups]
            stored = [g for g, k in zip(groups, keep, strict=True) if k]
            marks = {t: seen for g in stored for t, seen in g.marks.items()}
            kept = [b for b, k in zip(built, keep, strict=True) if k]
            # Old rows to delete: those these summaries supersede, and any under their own
            # primary trace unless the group is known to be the first stored of its traces.
            replaced = {p for g in stored for p in g.superseded}
            replaced.update(p for g, b in zip(stored, kept, strict=True) if not g.first for p in b.rows)
            marked = _save(conn, kept, marks, replaced, now_ns)
            # Marking a trace assembled gives up its lease; the rest are given up here: the
            # traces of groups not stored, and those that got a span since they were loaded.
            if owner is not None and (len(stored) < len(groups) or marked < len(marks)):
                held = sorted({tid for g in groups for tid in g.marks})
                if held:
                    _release(conn, owner, held, self.sqlite)
        return stored

    # -- queries -------------------------------------------------------------------------------

    def list_requests(self, q: RequestQuery) -> Page:
        stmt = list_statement(q)
        with self._read(per_value_plans=True) as conn:
            rows = conn.execute(stmt).all()
        page = Page(items=[orjson.loads(row[0]) for row in rows[: q.limit]])
        if len(rows) > q.limit:
            last = rows[q.limit - 1]
            page.next_cursor = Cursor(last[1], last[2], q.order).encode()
        return page

    def get_request(self, ident: str) -> dict[str, Any] | None:
        """A summary by trace id (primary or stitched) or by request id."""
        blob = self.get_request_json(ident)
        return orjson.loads(blob) if blob is not None else None

    def get_request_json(self, ident: str) -> bytes | None:
        """The stored JSON of `get_request`, as stored: the API answers with it unparsed.

        One statement for the ways an id can name a request (its primary trace, a stitched
        trace of it, its request id, an id any of its spans carried, in any of vLLM's forms:
        docs/normalisation.md, "Request id forms"), in that order of preference: the detail
        endpoint is what a dashboard polls, mostly for requests not assembled yet.
        """
        with self._read() as conn:
            forms = request_id_forms(ident) or [""]
            params = {"ident": _text(ident), "key": forms[0], "engine_key": forms[-1]}
            blob = conn.execute(self._q.summary_by_ident, params).scalar()
        return bytes(blob) if blob is not None else None

    def trace_exists(self, trace_id: str) -> bool:
        with self._read() as conn:
            return (
                conn.execute(select(traces.c.trace_id).where(traces.c.trace_id == trace_id)).first()
                is not None
            )

    def stats(self, group_by: str, since_ns: int | None, until_ns: int | None) -> list[dict[str, Any]]:
        """Requests and mean TTFT / KV time per group, largest groups first (at most 1,000).

        The whole hours inside [since, until) come from the per-hour rollup (`rollup.py`), the
        partial hours at the edges from the request rows: the cost is one hour of rows at most
        plus ~24 rollup rows per group and day, not the window's every request.
        """
        if group_by not in DIMENSIONS:
            raise StoreError("group_by must be one of path_class, flag, pair, coverage")
        lo = None if since_ns is None else -hour_of(-since_ns)  # start of the first whole hour
        hi = None if until_ns is None else hour_of(until_ns)  # end of the last one
        parts: list[Iterable[tuple[tuple[Any, ...], tuple[Any, ...]]]] = []
        with self._read(per_value_plans=True) as conn:
            if (
                since_ns is not None
                and until_ns is not None
                and lo is not None
                and hi is not None
                and lo >= hi
            ):
                parts.append(_raw_stats(conn, group_by, since_ns, until_ns))  # no whole hour inside
            else:
                parts.append(rollup_read(conn, group_by, lo, hi))
                if lo is not None and since_ns is not None and since_ns < lo:
                    parts.append(_raw_stats(conn, group_by, since_ns, lo))
                if hi is not None and until_ns is not None and hi < until_ns:
                    parts.append(_raw_stats(conn, group_by, hi, until_ns))
            totals: dict[tuple[Any, ...], list[Any]] = {}
            for part in parts:
                for key, sums in part:
                    acc = totals.setdefault(key, [0, 0.0, 0, 0.0, 0])
                    for i, v in enumerate(sums):
                        acc[i] += v
        names = STATS_KEYS.get(group_by, (group_by,))
        ranked = sorted(
            ((k, v) for k, v in totals.items() if v[0] > 0),
            key=lambda kv: (-kv[1][0], [(x is None, x or "") for x in kv[0]]),
        )
        return [
            {
                **dict(zip(names, key, strict=True)),
                "requests": n,
                "ttft_s_mean": ttft / ttft_n if ttft_n > 0 else None,
                "kv_duration_s_mean": kv / kv_n if kv_n > 0 else None,
            }
            for key, (n, ttft, ttft_n, kv, kv_n) in ranked[:1000]
        ]

    # -- retention -----------------------------------------------------------------------------

    def delete_older_than(self, cutoff_ns: int, batch: int = 500) -> int:
        """Delete one bounded batch of traces (spans, request rows) last touched before `cutoff_ns`.
        Returns how many traces went; call again until 0."""
        with self._begin(per_value_plans=True) as conn:
            ids = [
                r[0]
                for r in conn.execute(
                    select(traces.c.trace_id).where(traces.c.last_arrival_ns < cutoff_ns).limit(batch)
                )
            ]
            if not ids:
                return 0
            conn.execute(delete(span_chunks).where(span_chunks.c.trace_id.in_(ids)))
            conn.execute(delete(trace_keys).where(trace_keys.c.trace_id.in_(ids)))
            delta = RollupDelta()
            _delete_requests(conn, ids, delta)
            conn.execute(delete(traces).where(traces.c.trace_id.in_(ids)))
            delta.apply(conn)
        return len(ids)

    def refresh_statistics(self) -> list[str]:
        """PostgreSQL: ANALYZE each table assembly looks rows up in that now holds more than
        twice the rows its statistics know of (never analysed: none). Returns those tables.

        Why: on a young, fast-growing database autovacuum (a look a minute, at 10 % change)
        lags behind, and without statistics the planner reads `trace_keys` whole for every
        assembly step, a cost that grows with the history. Once the statistics are current
        this is one catalog query. SQLite plans these lookups by index without statistics.
        """
        if self.sqlite:
            return []
        with self._read() as conn:
            rows = conn.execute(_TABLE_GROWTH, {"tables": list(_ANALYZE)}).all()
        stale = sorted(name for name, known, live in rows if live > 2 * max(known, STATISTICS_MIN_ROWS))
        for name in stale:
            with self.engine.begin() as conn:
                conn.execute(_STATISTICS_SAMPLE)
                conn.execute(_ANALYZE[name])
        return stale

    def ping(self) -> None:
        with self._read() as conn:
            conn.execute(text("SELECT 1"))

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

# The tables assembly reads by lists of ids, and the columns it looks them up by (ANALYZE takes
# no parameters: the names are the schema's own). Only those columns: statistics of the span
# bodies and of the summaries cost ANALYZE most of its time (requests 347 ms, span_chunks 249 ms
# at ~50,000 rows) and plan nothing assembly does. A column-limited ANALYZE leaves autovacuum's
# count of changes as it was, so autovacuum still analyses the whole table for the API's queries.
_ANALYZE = {
    t.name: text(
        f"ANALYZE {t.name} ({', '.join(c.name for c in columns)})" if columns else f"ANALYZE {t.name}"
    )
    for t, columns in (
        (traces, ()),  # every column: all are small, and the claim filters on most
        (trace_keys, ()),
        (span_chunks, (span_chunks.c.trace_id,)),
        (requests, (requests.c.trace_id, requests.c.request_id)),
        (request_flags, (request_flags.c.trace_id,)),
    )
}
# A tenth of the default sample (3,000 rows instead of 30,000): the lookups by ids need the row
# count and that the ids are distinct, which a small sample shows as well. At the default, one
# ANALYZE held up its assembler for up to 300 ms on a young database that doubles every few
# seconds; autovacuum's own ANALYZE later samples at the server's setting.
_STATISTICS_SAMPLE = text("SET LOCAL default_statistics_target = 10")
# Rows the statistics know of (reltuples: -1 if never analysed) and rows there are now.
_TABLE_GROWTH = text(
    "SELECT c.relname, c.reltuples, s.n_live_tup FROM pg_class c"
    " JOIN pg_stat_user_tables s ON s.relid = c.oid"
    " WHERE c.oid IN (SELECT to_regclass(name) FROM unnest(CAST(:tables AS text[])) AS name)"
)
STATISTICS_MIN_ROWS = 1000  # below this a table's plan does not matter


def _delete_requests(conn: Connection, trace_ids: Sequence[str], delta: RollupDelta) -> None:
    """Delete these request rows and their flags, subtracting what they had added to the
    rollup (the columns come back from the DELETE itself, so a row two writers race to
    delete is subtracted only by the one that deleted it)."""
    if not trace_ids:
        return
    sqlite = is_sqlite(conn)
    q, ids = _statements(sqlite), {"ids": listed(trace_ids, sqlite)}
    flag_rows = conn.execute(q.delete_flags, ids).mappings().all()
    old = conn.execute(q.delete_requests, ids).mappings().all()
    delta.removed(old, flag_rows)


def _release(conn: Connection, owner: str, trace_ids: Sequence[str], sqlite: bool) -> None:
    conn.execute(_statements(sqlite).release, {"ids": listed(trace_ids, sqlite), "owner": owner})


def _unchanged(conn: Connection, marks: dict[str, int]) -> set[str]:
    """The traces of `marks` whose last arrival is still the one seen. Every row of `marks`
    is locked (to the end of the transaction) as its last arrival is read, so a span
    committed after the check waits for this commit."""
    sqlite = is_sqlite(conn)
    rows = conn.execute(_statements(sqlite).lock_traces, {"ids": listed(marks, sqlite)})
    return {tid for tid, last in rows if marks[tid] == last}


@dataclass(slots=True)
class _RequestRows:
    """The rows one group's summaries become: built before the storing transaction, which
    holds the write lock (on SQLite the whole database's) from its first statement on."""

    rows: dict[str, dict[str, Any]]  # by primary trace id
    flags: list[dict[str, Any]]
    trace_to_request: dict[str, str]


def _request_rows(summaries: Sequence[RequestSummary], now_ns: int) -> _RequestRows:
    trace_to_request: dict[str, str] = {}
    for s in summaries:
        for tid in s.trace_ids or [s.trace_id]:
            trace_to_request.setdefault(tid, s.trace_id)
    rows: dict[str, dict[str, Any]] = {}
    flag_rows: list[dict[str, Any]] = []
    for s in summaries:
        if s.trace_id in rows:  # two requests under one primary trace: the first is kept
            continue
        names = sorted(_flags(s))
        row = rows[s.trace_id] = _request_row(s, now_ns, names)
        # The list's sort keys are repeated in the flag's rows: `?flag=` in each order walks
        # one index of request_flags (schema.py).
        keys = {k: row[k] for k in ("start_ns", "ttft_s", "kv_duration_s")}
        flag_rows += [{"flag": n, "trace_id": s.trace_id, **keys} for n in names]
    return _RequestRows(rows, flag_rows, trace_to_request)


def _save(
    conn: Connection,
    built: Sequence[_RequestRows],
    group: dict[str, int],
    replaced: Iterable[str],
    now_ns: int,
) -> int:
    """Delete the request rows (and flags) of the primary traces `replaced`, write the request
    rows, flags and rollup of disjoint groups; clear the dirty mark (and the lease) of each
    trace of `group` whose last arrival is still the one seen. Returns how many were cleared."""
    rows: dict[str, dict[str, Any]] = {}
    flag_rows: list[dict[str, Any]] = []
    trace_to_request: dict[str, str] = {}
    for b in built:
        rows.update(b.rows)
        flag_rows += b.flags
        trace_to_request.update(b.trace_to_request)
    delta = RollupDelta()
    for row in rows.values():
        delta.request(row, +1)
    for f in flag_rows:
        delta.flag(f["flag"], f["start_ns"], rows[f["trace_id"]], +1)
    _delete_requests(conn, sorted(set(replaced)), delta)
    q = _statements(is_sqlite(conn))
    if rows:
        _write_rows(conn, q.insert_requests, list(rows.values()))
    if flag_rows:
        _write_rows(conn, q.insert_flags, flag_rows)
    marked = 0
    if group:
        marked = _write_rows(
            conn,
            q.mark_assembled,
            [
                {"tid": tid, "seen": seen, "rtid": trace_to_request.get(tid)}
                for tid, seen in sorted(group.items())
            ],
            {"now": now_ns},
        )
    delta.apply(conn)  # last: holds the shared rollup rows' locks only until commit
    return marked


def _write_rows(
    conn: Connection, stmt: Executable, rows: Sequence[dict[str, Any]], common: dict[str, Any] | None = None
) -> int:
    """Run `stmt` (one of `_Statements`' row writes) for these rows, with `common` bound once;
    returns the rows it wrote.

    SQLite: the one-row statement for each row, handed to the driver. PostgreSQL: the statement
    takes each column as one array (`_rows_as_arrays`), so all rows are one execution.
    """
    if is_sqlite(conn):
        return _executemany(conn, stmt, [{**row, **common} for row in rows] if common else rows)
    params = {k: [row[k] for row in rows] for k in rows[0]}
    sql, _ = _compiled(stmt, conn.dialect)
    return conn.exec_driver_sql(sql, {**params, **(common or {})}).rowcount


def _rows_as_arrays(name: str, columns: Sequence[tuple[str, Any]]) -> Any:
    """`unnest(:a, :b, ...) AS name(a, b, ...)`: rows given as one array parameter per column.

    Why, on PostgreSQL: each row of executemany is its own statement execution, and storing a
    page of requests wrote three rows per request that way (request, flags, dirty mark). As one
    statement each, a row cost the client 9 us instead of 22-37 and the server 27-32 instead of
    33-49 (the dirty mark, 80-row pages; benchmarks/verdicts/README.md). Array types without a
    length: a cast to VARCHAR(n)[] would cut a value that the column rejects.
    """
    arrays = [bindparam(n, type_=ARRAY(String() if isinstance(t, String) else t)) for n, t in columns]
    return func.unnest(*arrays).table_valued(*(n for n, _ in columns)).render_derived(name=name)


def _insert_from_arrays(table: Any) -> Any:
    given = _rows_as_arrays("given", [(c.name, c.type) for c in table.c])
    return table.insert().from_select([c.name for c in table.c], select(*given.c))


@functools.lru_cache(maxsize=16)
def _compiled(stmt: Any, dialect: Dialect) -> tuple[str, tuple[str, ...] | None]:
    """`stmt`'s text for `dialect` and, if its placeholders are positional, their names in order."""
    c = stmt.compile(dialect=dialect)
    return str(c), tuple(c.positiontup) if c.positional and c.positiontup is not None else None


def _executemany(conn: Connection, stmt: Executable, rows: Sequence[dict[str, Any]]) -> int:
    """`stmt` (a Core statement without defaults to fill) once per row, handed to the driver;
    returns the rows written (the drivers add up the rows of each execution).

    Why: SQLAlchemy's executemany prepares every value of every row in Python (by name, then
    through each column type's processor), which cost more than the database's own work for
    assembly's request, flag and trace rows. The values here are plain str, int, float, bool,
    bytes or None, which both drivers take as they are.
    """
    sql, order = _compiled(stmt, conn.dialect)
    if order is None:
        return conn.exec_driver_sql(sql, list(rows)).rowcount
    return conn.exec_driver_sql(sql, [tuple([row[k] for k in order]) for row in rows]).rowcount


@contextlib.contextmanager
def _per_value_plans(conn: Connection) -> Iterator[None]:
    """PostgreSQL: no statement run in this block is prepared, so each run is planned for its
    values. Every other statement of the store stays prepared, and after five runs PostgreSQL
    may plan it once for any values.

    Why: the id-list lookups and the writes have one best plan whatever the values, but some
    statements do not. A generic plan of the look for ready traces walked `ix_traces_last_arrival`
    from the oldest trace kept, filtering out every assembled one (as `dirty IS true` once did,
    `test_ready_traces.py`), where a plan for the values reads `ix_traces_ready`; the API's lists
    and statistics filter by a flag that may be rare or common and a window of an hour or a
    week; retention's look for expired traces by a cutoff.
    """
    if is_sqlite(conn):
        yield
        return
    driver = conn.connection.driver_connection
    threshold = driver.prepare_threshold  # type: ignore[union-attr]
    driver.prepare_threshold = None  # type: ignore[union-attr]
    try:
        yield
    finally:
        driver.prepare_threshold = threshold  # type: ignore[union-attr]


def _fetch_binary(conn: Connection, stmt: Executable, params: dict[str, Any]) -> list[Any]:
    """`stmt`'s rows; from PostgreSQL in its binary format.

    Why: bytea in the text format is hex, which the server writes and the client parses again:
    reading assembly's span chunks (~6 KB a request) took 38 us a chunk that way, 14 in binary.
    """
    if is_sqlite(conn):
        return list(conn.execute(stmt, params).all())
    sql, _ = _compiled(stmt, conn.dialect)
    if not conn.in_transaction():  # the driver's cursor joins the transaction the caller ends
        conn.begin()
    cur = conn.connection.cursor(binary=True)
    try:
        cur.execute(sql, params)
        return list(cur.fetchall())
    finally:
        cur.close()


def _raw_stats(
    conn: Connection, group_by: str, since_ns: int, until_ns: int
) -> Iterable[tuple[tuple[Any, ...], tuple[int, float, int, float, int]]]:
    """Per group of the request rows in [since_ns, until_ns): count, then sum and non-null
    count of TTFT and of KV time (the rollup's columns, so the two add up; a group may come
    more than once, to be added up).

    By flag, this reads the request rows' `flag_names` (their flag rows' names, written with
    them) grouped by combination and splits it here: one pass over the range on the start
    index, where the join of every flag row to its request row took 3-5 times as long.
    """
    r = requests
    if group_by == "flag":
        keys: tuple[Any, ...] = (r.c.flag_names,)
    elif group_by == "path_class":
        keys = (r.c.path_class,)
    elif group_by == "coverage":
        keys = (r.c.coverage, r.c.resolution)
    else:
        keys = (r.c.prefill_node, r.c.decode_node, r.c.pairing_level)
    ttft, kv = r.c.ttft_s, r.c.kv_duration_s
    sums = (func.count(), func.sum(ttft), func.count(ttft), func.sum(kv), func.count(kv))
    stmt = select(*keys, *sums).where(r.c.start_ns >= since_ns, r.c.start_ns < until_ns).group_by(*keys)
    k = len(keys)
    for row in conn.execute(stmt):
        n, ttft_sum, ttft_n, kv_sum, kv_n = row[k:]
        values = (int(n), float(ttft_sum or 0.0), int(ttft_n), float(kv_sum or 0.0), int(kv_n))
        if group_by != "flag":
            yield tuple(row[:k]), values
        elif row[0]:
            for name in row[0].split(","):
                yield (name,), values


def list_statement(q: RequestQuery) -> Select[Any]:
    """The select of a page of `q`'s order, descending on (key, trace id); docs/ui.md ("Sorting") gives
    the plan and cost of each order and filter."""
    r, f = requests, request_flags
    # Newest first or slowest first; `?flag=` walks the flag's rows of request_flags, which
    # repeat the sort keys. Slowest first reads a partial index of the rows that have the
    # value, and names its predicate as written (SQLite uses a partial index only then).
    keys = f.c if q.flag else r.c
    key_col = {
        RequestOrder.START: keys.start_ns,
        RequestOrder.TTFT: keys.ttft_s,
        RequestOrder.KV_TIME: keys.kv_duration_s,
    }[q.order]
    start_col, tid_col = keys.start_ns, keys.trace_id
    stmt = select(r.c.summary, key_col, tid_col)
    if q.flag:
        stmt = stmt.join(f, f.c.trace_id == r.c.trace_id).where(f.c.flag == q.flag)
    if q.order is not RequestOrder.START:
        stmt = stmt.where(key_col.is_not(None))
    conds = []
    if q.path_class:
        conds.append(r.c.path_class == q.path_class)
    if q.since_ns is not None:
        conds.append(start_col >= q.since_ns)
    if q.until_ns is not None:
        conds.append(start_col < q.until_ns)
    if q.node:
        conds.append(or_(r.c.prefill_node == _text(q.node), r.c.decode_node == _text(q.node)))
    if q.pod:
        conds.append(or_(r.c.prefill_pod == _text(q.pod), r.c.decode_pod == _text(q.pod)))
    if q.model:
        conds.append(r.c.model == _text(q.model))
    if q.cursor:
        c = q.cursor
        # A row-value comparison, which both databases take as one range of the index (an OR
        # of its two halves made SQLite read two ranges and sort them).
        conds.append(tuple_(key_col, tid_col) < tuple_(c.value, c.trace_id))
    if conds:
        stmt = stmt.where(*conds)
    return stmt.order_by(key_col.desc(), tid_col.desc()).limit(q.limit + 1)


_SPAN_ORDER = operator.attrgetter("start_ns", "span_id")


def _first_of_each(spans: list[Span]) -> list[Span]:
    """The first span of each span id, in order."""
    seen: set[str] = set()
    out = []
    for sp in spans:
        if sp.span_id not in seen:
            seen.add(sp.span_id)
            out.append(sp)
    return out


def _chunks(items: Sequence[Any], n: int) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _start_ns(s: RequestSummary) -> int:
    try:
        dt = datetime.fromisoformat(s.start.replace("Z", "+00:00"))
    except ValueError:
        return 0
    return round(dt.timestamp() * 1e6) * 1000


def _flags(s: RequestSummary) -> set[str]:
    return {str(f.name)[:64] for f in s.flags}


def _request_row(s: RequestSummary, now_ns: int, flag_names: list[str]) -> dict[str, Any]:
    kv = s.kv_transfer
    return {
        "trace_id": s.trace_id,
        "request_id": _text((s.request_id or None) and s.request_id[:256]),
        "model": _text((s.model or None) and s.model[:256]),
        "start_ns": _start_ns(s),
        # Floats as floats: PostgreSQL takes a page's values of a column as one array, which
        # must be of one Python type (an int among floats would fail the whole page).
        "ttft_s": _float(s.ttft_s),
        "e2e_s": _float(s.e2e_s),
        "path_class": (kv.path_class if kv else None) or "unknown",
        "transport": (kv.transport if kv else None) or "unknown",
        "kv_duration_s": _float(kv.duration_s) if kv else None,
        "kv_bytes": kv.bytes if kv else None,
        "prefill_pod": _text(s.prefill.get("pod")),
        "prefill_node": _text(s.prefill.get("node")),
        "decode_pod": _text(s.decode.get("pod")),
        "decode_node": _text(s.decode.get("node")),
        "pairing_level": _text(s.pairing_level),
        "coverage": _text(str(s.coverage.get("recipe") or "")[:32] or None),
        "resolution": resolution_label(s.resolved, s.identity),
        "flag_names": ",".join(flag_names),
        "summary": orjson.dumps(s.to_dict(), option=orjson.OPT_NON_STR_KEYS),
        "updated_ns": now_ns,
    }


# Group value names of the multi-key stats dimensions.
STATS_KEYS = {
    "pair": ("prefill_node", "decode_node", "pairing_level"),
    "coverage": ("recipe", "resolution"),
}


def _text(value: str | None) -> str | None:
    """A string for a text column, or to compare with one: NUL (which PostgreSQL's text cannot
    hold) as U+FFFD, on both databases. The summary JSON keeps the value as sent."""
    return value.replace("\x00", "\ufffd") if value and "\x00" in value else value


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


MAX_ROWS_PER_STATEMENT = 1024


@functools.lru_cache(maxsize=64)
def _multi_row_sql(sql: str, size: int) -> str:
    """The one-row INSERT `sql` as a statement taking `size` rows (NULL rows are dropped)."""
    head, rest = sql.split(" VALUES ", 1)
    end = rest.index(")") + 1
    row, tail = rest[:end], rest[end:]
    columns = ", ".join(f"column{i + 1}" for i in range(row.count(",") + 1))
    return f"{head} SELECT {columns} FROM (VALUES {', '.join([row] * size)}) WHERE column1 IS NOT NULL{tail}"


def _insert_values(cur: Any, sql: str, rows: Sequence[Sequence[Any]]) -> int:
    """Run `INSERT INTO t (...) VALUES (?, ...) <tail>` for many rows in as few statements as
    possible; returns how many rows were written (conflicts skipped are not counted).

    Why: the sqlite3 module lets go of the GIL around every statement step, and executemany
    steps once per row. Under ingest load the receiver threads hold the GIL, and each time
    they take it over, the writer waits up to a switch interval to get it back before it can
    step the next row. A commit of two export calls took 3-4x as long that way as with one
    statement per table (benchmarks/ingest/README.md). A statement holds a power of two of
    rows, the rest padded with NULL rows that its WHERE drops, so that only a few statement
    texts exist and SQLite's statement cache keeps them prepared.
    """
    if not rows:
        return 0
    width = len(rows[0])
    variables = cur.connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    limit = min(MAX_ROWS_PER_STATEMENT, variables // width)
    most = 1
    while most * 2 <= limit:
        most *= 2
    written = 0
    for start in range(0, len(rows), most):
        part = rows[start : start + most]
        size = 1
        while size < len(part):
            size *= 2
        statement = _multi_row_sql(sql, size)
        params = [v for r in part for v in r]
        params += [None] * (width * (size - len(part)))
        cur.execute(statement, params)
        written += cur.rowcount
    return written


def among(col: ColumnElement[Any], name: str, sqlite: bool) -> ColumnElement[bool]:
    """`col` is one of the values bound as `name` (made by `listed`): one statement text and
    one parameter whatever their number.

    Why: an expanding `IN (...)` is rendered anew for every execution, a placeholder per value,
    and SQLAlchemy's preparing of those values cost assembly more than the database did. SQLite
    reads the values from a JSON array (`json_each`), PostgreSQL from an array (`= ANY`); both
    look them up in the column's index as the `IN` list did.
    """
    if sqlite:
        return col.in_(select(func.json_each(bindparam(name, type_=String)).table_valued("value").c.value))
    item = String() if isinstance(col.type, String) else col.type  # no length: a cast would cut
    return col == any_(bindparam(name, type_=ARRAY(item)))


def listed(values: Iterable[Any], sqlite: bool) -> Any:
    """The parameter value of `among` for these values (duplicates and order do not matter)."""
    return orjson.dumps(list(values)).decode() if sqlite else list(values)


class _Statements:
    """The statements of assembly's every step for one dialect, built once.

    Why: building a Core statement (and the cache key SQLAlchemy finds its compiled form by)
    cost about three times executing it on a page of ids; built once, every value a bound
    parameter, each is compiled once and found again at once.
    """

    def __init__(self, sqlite: bool) -> None:
        t, sc, tk, r, f = traces.c, span_chunks.c, trace_keys.c, requests.c, request_flags.c

        def ids(col: ColumnElement[Any]) -> ColumnElement[bool]:
            return among(col, "ids", sqlite)

        def claimable() -> ColumnElement[bool]:
            """Not leased, lease run out, or leased to `owner`."""
            return or_(
                t.claimed_until_ns.is_(None),
                t.claimed_until_ns < bindparam("now"),
                t.claimed_by == bindparam("owner"),
            )

        # Storing a page of requests: their rows and flags, and each trace's dirty mark cleared
        # where its last arrival is still the one seen. One row per execution on SQLite, every
        # row in one execution on PostgreSQL (`_write_rows`).
        assembled = {
            "dirty": false(),
            "late_spans": literal_column("0"),
            "assembled_ns": bindparam("now"),
            "claimed_by": null(),
            "claimed_until_ns": null(),
        }
        if sqlite:
            self.insert_requests: Executable = requests.insert()
            self.insert_flags: Executable = request_flags.insert()
            self.mark_assembled: Executable = (
                update(traces)
                .where(t.trace_id == bindparam("tid"), t.last_arrival_ns == bindparam("seen"))
                .values(**assembled, request_trace_id=bindparam("rtid"))
            )
        else:
            self.insert_requests = _insert_from_arrays(requests)
            self.insert_flags = _insert_from_arrays(request_flags)
            m = _rows_as_arrays("m", [("tid", String()), ("seen", BigInteger()), ("rtid", String())])
            self.mark_assembled = (
                update(traces)
                .where(t.trace_id == m.c.tid, t.last_arrival_ns == m.c.seen)
                .values(**assembled, request_trace_id=m.c.rtid)
            )
        lease: dict[str, Any] = {"claimed_by": bindparam("owner"), "claimed_until_ns": bindparam("until")}
        eligible = (
            t.last_arrival_ns <= bindparam("quiet_before"),
            or_(t.has_root.is_(True), t.first_arrival_ns <= bindparam("wait_before")),
        )

        def candidates(name: str, *where: ColumnElement[bool], oldest: bool = True) -> Any:
            """One source of traces to claim, locked as they are read (PostgreSQL)."""
            q = select(t.trace_id, t.last_arrival_ns).where(*where, *eligible)
            if oldest:
                q = q.order_by(t.last_arrival_ns).limit(bindparam("limit"))
            if not sqlite:
                q = q.with_for_update(skip_locked=True)
            return q.cte(name)

        # Three sources, each read through its own index: the ready traces nobody holds
        # (`ix_traces_ready`, oldest first), those whose lease ran out (`ix_traces_leased`: a
        # replica died), and the owner's own leases it asks for again (by id). One walk of
        # every ready trace, held ones included, skipped the held ones row by row. The last two
        # are few and read whole (ordered by arrival, SQLite would walk ix_traces_last_arrival
        # instead); the oldest `limit` of all three are claimed.
        sources = [
            candidates("free_traces", READY, FREE),
            candidates("expired_traces", READY, t.claimed_until_ns < bindparam("now"), oldest=False),
            candidates(
                "again_traces",
                READY,
                t.claimed_by == bindparam("owner"),
                among(t.trace_id, "again", sqlite),
                oldest=False,
            ),
        ]
        found = union(*(select(c.c.trace_id, c.c.last_arrival_ns) for c in sources)).subquery("found")
        pick = select(found.c.trace_id).order_by(found.c.last_arrival_ns).limit(bindparam("limit"))
        self.claim_ready = (
            update(traces)
            .where(t.trace_id.in_(pick.scalar_subquery()))
            .values(**lease)
            .returning(t.trace_id, t.last_arrival_ns, t.late_spans, t.assembled_ns)
        )
        self.claim = update(traces).where(ids(t.trace_id), claimable()).values(**lease).returning(t.trace_id)
        self.release = (
            update(traces)
            .where(ids(t.trace_id), t.claimed_by == bindparam("owner"))
            .values(claimed_by=null(), claimed_until_ns=null())
        )
        self.trace_states = select(
            t.trace_id, t.last_arrival_ns, t.late_spans, t.assembled_ns, t.dirty
        ).where(ids(t.trace_id))
        # In order of first arrival: a key held by more traces than one request has is
        # stitched through the traces that came first (railtrace.scheduling.grouping.group_traces).
        self.traces_for_keys = (
            select(tk.request_key, tk.trace_id)
            .select_from(trace_keys.outerjoin(traces, t.trace_id == tk.trace_id))
            .where(ids(tk.request_key))
            .order_by(tk.request_key, t.first_arrival_ns, tk.trace_id)
        )
        self.chunks = (
            select(sc.trace_id, sc.body)
            .where(ids(sc.trace_id))
            .order_by(sc.trace_id, sc.received_ns, sc.chunk_id)
        )
        self.resources = select(resources.c.id, resources.c.attributes).where(ids(resources.c.id))
        # Two index lookups (as one OR with a subquery, PostgreSQL scanned every request row):
        # the requests of these primary traces, then those these traces were stitched into.
        self.previous_summaries = union_all(
            select(r.trace_id, r.summary).where(ids(r.trace_id)),
            select(r.trace_id, r.summary)
            .join(traces, t.request_trace_id == r.trace_id)
            .where(ids(t.trace_id), t.request_trace_id != t.trace_id),
        )
        self.delete_flags = (
            delete(request_flags).where(ids(f.trace_id)).returning(f.flag, f.start_ns, f.trace_id)
        )
        self.delete_requests = delete(requests).where(ids(r.trace_id)).returning(*REQUEST_COLUMNS)
        by_primary = select(r.summary, literal_column("0").label("pref")).where(
            r.trace_id == bindparam("ident")
        )
        by_stitched = (
            select(r.summary, literal_column("1").label("pref"))
            .join(traces, t.request_trace_id == r.trace_id)
            .where(t.trace_id == bindparam("ident"))
        )
        # The id's joinable keys (`request_id_forms`): as the request's own id, then as a key
        # any span of any of its traces carried (trace_keys: the EPP's x-request-id, vLLM's
        # id, the sidecar's UUID, a KV connector's id), newest request first.
        keys: tuple[Any, ...] = (bindparam("key"), bindparam("engine_key"))
        by_request_id = (
            select(r.summary, literal_column("2").label("pref"))
            .where(r.request_id.in_(keys))
            .order_by(r.start_ns.desc())
            .limit(1)
            .subquery()
        )
        by_key = (
            select(r.summary, literal_column("3").label("pref"))
            .select_from(trace_keys)
            .join(traces, t.trace_id == tk.trace_id)
            .join(requests, r.trace_id == t.request_trace_id)
            .where(tk.request_key.in_(keys))
            .order_by(r.start_ns.desc())
            .limit(1)
            .subquery()
        )
        found = union_all(by_primary, by_stitched, select(by_request_id), select(by_key)).subquery()
        self.summary_by_ident = select(found.c.summary).order_by(found.c.pref).limit(1)
        # Each row locked and its last arrival read: on PostgreSQL by SELECT ... FOR UPDATE
        # (a no-op write would add a row version and an entry in every index of `traces`),
        # on SQLite by a no-op write, which takes the database's write lock.
        self.lock_traces: Any
        if sqlite:
            self.lock_traces = (
                update(traces)
                .where(ids(t.trace_id))
                .values(claimed_until_ns=t.claimed_until_ns)
                .returning(t.trace_id, t.last_arrival_ns)
            )
        else:
            self.lock_traces = select(t.trace_id, t.last_arrival_ns).where(ids(t.trace_id)).with_for_update()


@functools.cache
def _statements(sqlite: bool) -> _Statements:
    return _Statements(sqlite)
