"""The per-hour rollups: `stats_hourly` (counts and sums) and `ttft_hourly` (TTFT histograms):
their key encoding, their upkeep and their rebuild.

Stats over a day used to aggregate every request of the day (linear in traffic: over a second
at 400,000 requests a day). The rollup holds, per hour, group and dimension, the request count
and the sums and non-null counts of the averaged columns, so a day's whole hours are ~24 rows
per group. It is kept in the same transaction as the request rows (`Store.save_assembly`,
`Store.delete_older_than`): a `RollupDelta` collects the rows removed (-1) and written (+1) and
applies them at the end as increments.

Replicas sharing one PostgreSQL update the same hot rows (the current hour's), so the deltas
are applied as `INSERT ... ON CONFLICT DO UPDATE SET c = c + excluded.c` (no read-modify-write,
no lost update), sorted by key (one order for every writer, so no two transactions wait on each
other in a cycle), as the last statements of the transaction (the row locks are held only until
its commit). Float sums that are added to and subtracted from can differ from a fresh AVG in
the last bits; rows whose count reaches zero are deleted, which also drops their residue.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    inspect,
    literal,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from railtrace.store.schema import request_flags, requests, stats_hourly, ttft_hourly

HOUR_NS = 3_600 * 10**9
DIMENSIONS = ("flag", "path_class", "pair", "coverage")
KEY_COUNT = {"pair": 3, "coverage": 2}  # group values per dimension; one for the others
KEY_COLUMNS = ("dimension", "hour_ns", "key1", "key2", "key3", "key_nulls")
SUM_COLUMNS = ("request_count", "ttft_sum", "ttft_n", "kv_sum", "kv_n")
# The request columns a request's rollup contribution is made of (read back when it is replaced).
REQUEST_COLUMNS = (
    requests.c.trace_id,
    requests.c.start_ns,
    requests.c.path_class,
    requests.c.prefill_node,
    requests.c.decode_node,
    requests.c.pairing_level,
    requests.c.coverage,
    requests.c.resolution,
    requests.c.ttft_s,
    requests.c.kv_duration_s,
)

Key = tuple[str, int, str, str, str, int]  # KEY_COLUMNS

# -- TTFT histograms (`ttft_hourly`, read by `quantiles.py`) ------------------------------------
# Buckets are DDSketch's (Masson et al., VLDB 2019): bucket i holds (γ^(i-1), γ^i] with
# γ = (1 + α) / (1 - α) and answers 2γ^i / (γ + 1), within α of every value in it.
RELATIVE_ERROR = 0.01
GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
_LOG_GAMMA = math.log(GAMMA)
MIN_TTFT_S = 1e-6  # this and below (zero included): one bucket, answered as 0
ZERO_BUCKET = -10_000
NO_TTFT = -10_001  # a request without a first token: counted among the requests, no value
TTFT_DIMENSIONS = ("path_class", "pairing_level")
TTFT_KEY_COLUMNS = ("dimension", "hour_ns", "key", "key_null", "bucket")
TtftKey = tuple[str, int, str, int, int]  # TTFT_KEY_COLUMNS


def bucket_of(ttft_s: float | None) -> int:
    if ttft_s is None or math.isnan(ttft_s):
        return NO_TTFT
    if ttft_s <= MIN_TTFT_S:
        return ZERO_BUCKET
    return math.ceil(math.log(ttft_s) / _LOG_GAMMA)


def bucket_value(bucket: int) -> float:
    """The value a bucket answers: within `RELATIVE_ERROR` of each value it holds."""
    if bucket == ZERO_BUCKET:
        return 0.0
    return 2 * GAMMA**bucket / (GAMMA + 1)


def ttft_keys(
    start_ns: int, ttft_s: float | None, path_class: str | None, level: str | None
) -> list[TtftKey]:
    """The two histogram rows a request counts in: its path class's and its pairing level's."""
    hour, bucket = hour_of(start_ns), bucket_of(ttft_s)
    return [
        (dim, hour, value or "", int(value is None), bucket)
        for dim, value in zip(TTFT_DIMENSIONS, (path_class, level), strict=True)
    ]


def hour_of(ns: int) -> int:
    """Start of the hour holding `ns` (floor, also for times before 1970)."""
    return ns - ns % HOUR_NS


def encode_key(values: Sequence[str | None]) -> tuple[str, str, str, int]:
    """Up to three group values as (key1, key2, key3, key_nulls): '' for a NULL, its bit set."""
    padded = [*values, "", ""][:3]
    nulls = sum(1 << i for i, v in enumerate(values) if v is None)
    return (padded[0] or "", padded[1] or "", padded[2] or "", nulls)


def decode_key(dimension: str, key1: str, key2: str, key3: str, nulls: int) -> tuple[str | None, ...]:
    """The group values `encode_key` encoded (one for flag and path_class, three for pair)."""
    keys = (key1, key2, key3)[: KEY_COUNT.get(dimension, 1)]
    return tuple(None if nulls >> i & 1 else k for i, k in enumerate(keys))


class RollupDelta:
    """Rollup changes of one transaction: request and flag rows removed and written.

    Sums are kept as the lists of their terms and added with `math.fsum` at the end, so a
    request re-assembled with unchanged values nets to exactly zero and touches nothing.
    """

    def __init__(self) -> None:
        self._d: dict[Key, list[Any]] = {}
        self._ttft: dict[TtftKey, int] = {}

    def _add(self, key: Key, sign: int, ttft: float | None, kv: float | None) -> None:
        acc = self._d.setdefault(key, [0, [], 0, [], 0])
        acc[0] += sign
        if ttft is not None:
            acc[1].append(sign * ttft)
            acc[2] += sign
        if kv is not None:
            acc[3].append(sign * kv)
            acc[4] += sign

    def request(self, row: Any, sign: int) -> None:
        """A request row (with the `REQUEST_COLUMNS`, by name) added (+1) or removed (-1)."""
        hour = hour_of(row["start_ns"])
        ttft, kv = row["ttft_s"], row["kv_duration_s"]
        self._add(("path_class", hour, *encode_key([row["path_class"]])), sign, ttft, kv)
        pair = [row["prefill_node"], row["decode_node"], row["pairing_level"]]
        self._add(("pair", hour, *encode_key(pair)), sign, ttft, kv)
        coverage = [row["coverage"], row["resolution"]]
        self._add(("coverage", hour, *encode_key(coverage)), sign, ttft, kv)
        for key in ttft_keys(row["start_ns"], ttft, row["path_class"], row["pairing_level"]):
            self._ttft[key] = self._ttft.get(key, 0) + sign

    def flag(self, flag: str, start_ns: int, request: Any, sign: int) -> None:
        """A flag row of `request` (its request row, for the averaged columns)."""
        self._add(
            ("flag", hour_of(start_ns), *encode_key([flag])),
            sign,
            request["ttft_s"],
            request["kv_duration_s"],
        )

    def removed(self, request_rows: Iterable[Any], flag_rows: Iterable[Any]) -> None:
        """Subtract deleted rows: request rows (`REQUEST_COLUMNS`) and flag rows (flag, start_ns,
        trace_id). A flag row counts only with its request row (stats join the two)."""
        by_id = {r["trace_id"]: r for r in request_rows}
        for r in by_id.values():
            self.request(r, -1)
        for f in flag_rows:
            if f["trace_id"] in by_id:
                self.flag(f["flag"], f["start_ns"], by_id[f["trace_id"]], -1)

    def rows(self) -> list[dict[str, Any]]:
        """The non-zero changes as upsert parameters, sorted by key."""
        out = []
        for key in sorted(self._d):
            n, ttft, ttft_n, kv, kv_n = self._d[key]
            ttft_sum, kv_sum = math.fsum(ttft), math.fsum(kv)
            if n or ttft_n or kv_n or ttft_sum or kv_sum:
                values = (n, ttft_sum, ttft_n, kv_sum, kv_n)
                out.append(dict(zip(KEY_COLUMNS + SUM_COLUMNS, key + values, strict=True)))
        return out

    def ttft_rows(self) -> list[dict[str, Any]]:
        """The non-zero histogram changes as upsert parameters, sorted by key."""
        return [
            dict(zip(TTFT_KEY_COLUMNS, k, strict=True), request_count=n)
            for k, n in sorted(self._ttft.items())
            if n
        ]

    def apply(self, conn: Connection) -> None:
        """Add the changes to `stats_hourly` and `ttft_hourly`; delete the rows whose count
        reached zero."""
        for rows, (add, drop), key_columns in (
            (self.rows(), _statements(conn.dialect.name), KEY_COLUMNS),
            (self.ttft_rows(), _ttft_statements(conn.dialect.name), TTFT_KEY_COLUMNS),
        ):
            if not rows:
                continue
            conn.execute(add, rows)
            emptied = [{f"k_{k}": r[k] for k in key_columns} for r in rows if r["request_count"] < 0]
            if emptied:
                conn.execute(drop, emptied)


@functools.cache
def _statements(dialect: str) -> tuple[Any, Any]:
    """The upsert adding deltas and the delete of emptied rows, built once per dialect (building
    a statement cost more than running it on a page's few rollup rows)."""
    t = stats_hourly
    add = (pg_insert if dialect == "postgresql" else sqlite_insert)(t)
    add = add.on_conflict_do_update(
        index_elements=[t.c[k] for k in KEY_COLUMNS],
        set_={c: t.c[c] + add.excluded[c] for c in SUM_COLUMNS},
    )
    drop = delete(t).where(*(t.c[k] == bindparam(f"k_{k}") for k in KEY_COLUMNS), t.c.request_count <= 0)
    return add, drop


@functools.cache
def _ttft_statements(dialect: str) -> tuple[Any, Any]:
    t = ttft_hourly
    add = (pg_insert if dialect == "postgresql" else sqlite_insert)(t)
    add = add.on_conflict_do_update(
        index_elements=[t.c[k] for k in TTFT_KEY_COLUMNS],
        set_={"request_count": t.c.request_count + add.excluded.request_count},
    )
    drop = delete(t).where(*(t.c[k] == bindparam(f"k_{k}") for k in TTFT_KEY_COLUMNS), t.c.request_count <= 0)
    return add, drop


def rebuild_ttft(conn: Connection, batch: int = 20_000) -> int:
    """Recompute `ttft_hourly` from the request rows (migration 0011's backfill, and `rebuild`).

    A bucket needs a logarithm, which SQLite may be built without, so the rows stream through
    Python on the covering index `ix_requests_start_ttft` and are counted here. Returns the
    number of requests counted."""
    conn.execute(delete(ttft_hourly))
    r = requests
    counts: dict[TtftKey, int] = {}
    stmt = select(r.c.start_ns, r.c.ttft_s, r.c.path_class, r.c.pairing_level)
    n = 0
    for row in conn.execute(stmt.execution_options(yield_per=batch)):
        n += 1
        for key in ttft_keys(*row):
            counts[key] = counts.get(key, 0) + 1
    rows = [dict(zip(TTFT_KEY_COLUMNS, k, strict=True), request_count=c) for k, c in sorted(counts.items())]
    for i in range(0, len(rows), batch):
        conn.execute(insert(ttft_hourly), rows[i : i + batch])
    return n


def _hour_sql(start_ns: Any) -> Any:
    """`hour_of` in SQL (floor modulo in both dialects, whose % truncates toward zero)."""
    h: Any = literal_column(str(HOUR_NS))
    return start_ns - (start_ns % h + h) % h


def rebuild(conn: Connection) -> None:
    """Recompute the whole rollup from `requests` and `request_flags`.

    The backfill of migration 0003 and of tools that write request rows in bulk (the scale
    benchmark's inflate.py); the service itself keeps the rollup up to date as it writes.
    """
    r, f = requests, request_flags
    conn.execute(delete(stats_hourly))
    sums = (
        func.count(),
        func.coalesce(func.sum(r.c.ttft_s), 0.0),
        func.count(r.c.ttft_s),
        func.coalesce(func.sum(r.c.kv_duration_s), 0.0),
        func.count(r.c.kv_duration_s),
    )
    empty = literal("")
    zero = literal(0)

    def null_bit(col: Any, bit: int) -> Any:
        return case((col.is_(None), bit), else_=0)

    hour_r, hour_f = _hour_sql(r.c.start_ns), _hour_sql(f.c.start_ns)
    pair = (r.c.prefill_node, r.c.decode_node, r.c.pairing_level)
    coverage = (r.c.coverage, r.c.resolution)
    queries = [
        select(literal("flag"), hour_f, f.c.flag, empty, empty, zero, *sums)
        .select_from(f.join(r, r.c.trace_id == f.c.trace_id))
        .group_by(hour_f, f.c.flag),
        select(literal("path_class"), hour_r, r.c.path_class, empty, empty, zero, *sums).group_by(
            hour_r, r.c.path_class
        ),
        select(
            literal("pair"),
            hour_r,
            *(func.coalesce(c, "") for c in pair),
            null_bit(pair[0], 1) + null_bit(pair[1], 2) + null_bit(pair[2], 4),
            *sums,
        ).group_by(hour_r, *pair),
        select(
            literal("coverage"),
            hour_r,
            *(func.coalesce(c, "") for c in coverage),
            empty,
            null_bit(coverage[0], 1) + null_bit(coverage[1], 2),
            *sums,
        ).group_by(hour_r, *coverage),
    ]
    if "coverage" not in {c["name"] for c in inspect(conn).get_columns("requests")}:
        queries.pop()  # migration 0003's backfill runs before 0009 added the coverage columns
    for q in queries:
        conn.execute(insert(stats_hourly).from_select([*KEY_COLUMNS, *SUM_COLUMNS], q))
    if inspect(conn).has_table("ttft_hourly"):  # migration 0003's backfill runs before 0011
        rebuild_ttft(conn)


def read(
    conn: Connection, dimension: str, since_ns: int | None, until_ns: int | None
) -> Iterable[tuple[tuple[str | None, ...], tuple[int, float, int, float, int]]]:
    """Sums per group over the hours in [since_ns, until_ns) (each bound a whole hour, or None)."""
    t = stats_hourly
    conds = [t.c.dimension == dimension]
    if since_ns is not None:
        conds.append(t.c.hour_ns >= since_ns)
    if until_ns is not None:
        conds.append(t.c.hour_ns < until_ns)
    keys = (t.c.key1, t.c.key2, t.c.key3, t.c.key_nulls)
    q = select(*keys, *(func.sum(t.c[c]) for c in SUM_COLUMNS)).where(and_(*conds)).group_by(*keys)
    for row in conn.execute(q):
        yield (
            decode_key(dimension, *row[:4]),
            (
                int(row[4]),
                float(row[5]),
                int(row[6]),
                float(row[7]),
                int(row[8]),
            ),
        )
