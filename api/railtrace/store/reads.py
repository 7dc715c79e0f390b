"""Reads: spans of traces (whole or by page, resources cached), stored summaries, the request
list and detail lookups, counts and statistics. Apart because none of it writes: each runs in
a read-only transaction ended by COMMIT.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

import orjson
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    func,
    or_,
    select,
    tuple_,
)
from sqlalchemy.sql import Executable, Select

from railtrace.model import Span
from railtrace.normalize import normalize_span, request_id_forms
from railtrace.otlp.rows import chunk_records
from railtrace.otlp.spans import StoredResource, records_reader
from railtrace.store.connection import MAX_KNOWN_RESOURCES, Job, StoreContext
from railtrace.store.engine import is_sqlite
from railtrace.store.queries import Cursor, Page, RequestOrder, RequestQuery, StoreError
from railtrace.store.rollup import DIMENSIONS, hour_of
from railtrace.store.rollup import read as rollup_read
from railtrace.store.schema import (
    request_flags,
    requests,
    resources,
    span_chunks,
    traces,
)
from railtrace.store.statements import (
    _chunks,
    _compiled,
    _text,
    among,
    listed,
)

# Chunk rows a page of `Store.load_spans_page` reads per query.
PAGE_CHUNKS = 32


class Reads(Job):
    """Spans, summaries and statistics read back, for assembly and the API."""

    def __init__(self, ctx: StoreContext) -> None:
        super().__init__(ctx)
        # Resources read back, by id. A row never changes (its id is a hash of its content) and
        # is never deleted, so they are kept across calls, up to about MAX_KNOWN_RESOURCES.
        self._resources: dict[int, StoredResource] = {}

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

    def service_names(self, limit: int) -> list[str]:
        """The `service.name` of the stored resources (at most `limit` rows read; kept once per
        process and scope, never deleted), `unknown_service` for a resource without one."""
        names: set[str] = set()
        with self._read() as conn:
            for (blob,) in conn.execute(select(resources.c.attributes).limit(limit)):
                name = ((orjson.loads(blob) or {}).get("resource") or {}).get("service.name")
                names.add(str(name) if name not in (None, "") else "unknown_service")
        return sorted(names)

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


# Group value names of the multi-key stats dimensions.
STATS_KEYS = {
    "pair": ("prefill_node", "decode_node", "pairing_level"),
    "coverage": ("recipe", "resolution"),
}
