"""Statement building, for every job of the store: the Core statements of assembly's steps
(`_Statements`, built once per dialect), the id lists bound as one parameter (`among`,
`listed`), the PostgreSQL bulk statements taking one array per column, SQLite's multi-row
INSERTs and the driver-level executions. Kept apart so that every job runs the same SQL text
and each statement is built and compiled once.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import orjson
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    String,
    any_,
    bindparam,
    delete,
    false,
    func,
    literal_column,
    null,
    or_,
    select,
    union,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import Executable

from railtrace.store.engine import is_sqlite
from railtrace.store.rollup import REQUEST_COLUMNS
from railtrace.store.schema import (
    FREE,
    READY,
    request_flags,
    requests,
    resources,
    span_chunks,
    trace_keys,
    traces,
)

INSERT_COLUMNS = "trace_id, chunk_id, received_ns, span_count, body"
_COPY_TYPES = ["text", "int8", "int8", "int4", "bytea"]
# PostgreSQL: a commit's request keys and trace rows, the rows of `SpanWrites._sql_key` and
# `SpanWrites._sql_trace`, each as one statement taking one array per column (see `_rows_as_arrays`),
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
# The per-connection table ingest's COPY writes chunk rows to (`SpanWrites._insert_chunks`).
_STAGING = (
    "CREATE TEMP TABLE IF NOT EXISTS railtrace_chunks_in"
    " (LIKE span_chunks INCLUDING DEFAULTS INCLUDING COMPRESSION) ON COMMIT DELETE ROWS"
)
_STAGING_BEFORE_14 = (  # no per-column compression before PostgreSQL 14
    "CREATE TEMP TABLE IF NOT EXISTS railtrace_chunks_in"
    " (LIKE span_chunks INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
)


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


def _chunks(items: Sequence[Any], n: int) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


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
            select(tk.request_key, tk.trace_id, t.first_arrival_ns)
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
