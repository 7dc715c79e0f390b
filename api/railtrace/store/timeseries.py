"""Requests, flags and TTFT quantiles per time bucket, and KV transfers per node pair and path.

The overview's trends need counts over time, and a day of request rows is
linear in traffic. So a bucket of an hour or more is read from the per-hour rollups
(`stats_hourly` for counts, `ttft_hourly` for TTFT histograms, kept by `rollup.RollupDelta`), and
only the window's partial edge hours from the covering index `ix_requests_start_ttft` (never a
row) plus the flag rows of those hours, both counted by the database. Buckets shorter than an
hour are read from the index and the flag rows alone, so `step_for` gives them only to windows
of at most `RAW_WINDOW_NS`: at 10 M spans a day (36,000 requests an hour) a 6-hour window of
10-minute buckets took 330 ms, nearly all of it the scan of its index entries, where whole hours
take 80-100 ms for a day (benchmarks/ui/README.md, "Time series").

Buckets are aligned on multiples of the step from the unix epoch (whole UTC hours and days), the
first and last clipped to the window: a bucket's hours all fall in it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

from sqlalchemy import BigInteger, Connection, case, cast, func, literal, select
from sqlalchemy.exc import OperationalError

from railtrace.store.engine import is_sqlite
from railtrace.store.quantiles import histogram_quantile
from railtrace.store.rollup import (
    GAMMA,
    HOUR_NS,
    MIN_TTFT_S,
    NO_TTFT,
    RELATIVE_ERROR,
    ZERO_BUCKET,
    bucket_of,
    decode_key,
    hour_of,
)
from railtrace.store.schema import request_flags, requests, stats_hourly, ttft_hourly

MINUTE_NS = 60 * 10**9
LOG_GAMMA = math.log(GAMMA)
# The steps a window is cut into, smallest first: the smallest that keeps the buckets at most
# the asked-for number is taken.
STEPS_NS = tuple(m * MINUTE_NS for m in (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880, 10080))
MAX_BUCKETS = 240
# Longest window read from request index entries alone (steps under an hour); longer windows
# get steps of whole hours, read from the rollups.
RAW_WINDOW_NS = 2 * HOUR_NS
# Longest window served: at most ~2,200 hours of rollup rows per group.
MAX_WINDOW_NS = 92 * 24 * HOUR_NS
# Transfers are grouped from the request rows (1 h: 50 ms, 24 h: 2.3 s at 10 M spans a day): their
# window is bounded (3 hours, and 10 minutes to spare for a browser's clock ahead of the
# service's), as is their answer.
MAX_TRANSFER_WINDOW_NS = 3 * HOUR_NS + 10 * MINUTE_NS
MAX_TRANSFER_GROUPS = 1000


class WindowError(ValueError):
    """A window the service will not cut (empty, too long, too many buckets)."""


def step_for(since_ns: int, until_ns: int, buckets: int) -> int:
    """The smallest step of `STEPS_NS` that cuts [since, until) into at most `buckets` buckets;
    a whole number of hours when the window is longer than `RAW_WINDOW_NS`."""
    if until_ns <= since_ns:
        raise WindowError("the window is empty: until must be after since")
    if until_ns - since_ns > MAX_WINDOW_NS:
        raise WindowError(f"the window is longer than {MAX_WINDOW_NS // (24 * HOUR_NS)} days")
    if not 1 <= buckets <= MAX_BUCKETS:
        raise WindowError(f"buckets must be 1..{MAX_BUCKETS}")
    for step in STEPS_NS:
        if until_ns - since_ns > RAW_WINDOW_NS and step < HOUR_NS:
            continue
        if _count(since_ns, until_ns, step) <= buckets:
            return step
    raise WindowError(f"the window needs more than {buckets} buckets")  # pragma: no cover - bounded


def _count(since_ns: int, until_ns: int, step: int) -> int:
    return (until_ns - 1) // step - since_ns // step + 1


def timeseries(store: Any, since_ns: int, until_ns: int, step_ns: int) -> dict[str, Any]:
    """Per bucket of `step_ns` over [since, until): requests per path class, requests per flag,
    and TTFT p50/p90/p99 (within `RELATIVE_ERROR`)."""
    first = since_ns // step_ns
    n = _count(since_ns, until_ns, step_ns)
    paths: list[Counter[str]] = [Counter() for _ in range(n)]
    flags: list[Counter[str]] = [Counter() for _ in range(n)]
    ttft: list[Counter[int]] = [Counter() for _ in range(n)]

    def index(ns: int) -> int:
        return ns // step_ns - first

    lo, hi = -hour_of(-since_ns), hour_of(until_ns)  # the whole hours inside
    if step_ns % HOUR_NS == 0 and lo < hi:
        edges = [(since_ns, lo), (hi, until_ns)]
    else:
        lo = hi = 0
        edges = [(since_ns, until_ns)]
    with store._read(per_value_plans=True) as conn:
        if lo < hi:
            for dim, hour, key1, key2, key3, nulls, count in _rollup(conn, lo, hi):
                (value,) = decode_key(dim, key1, key2, key3, nulls)
                target = paths if dim == "path_class" else flags
                target[index(hour)][value or "unknown"] += int(count)
            for hour, bucket, count in _ttft_rollup(conn, lo, hi):
                ttft[index(hour)][bucket] += int(count)
        for a, b in edges:
            if a >= b:
                continue
            for at, path_class, tb, count in _edge_counts(conn, a, b, step_ns):
                paths[at - first][path_class or "unknown"] += int(count)
                ttft[at - first][int(tb)] += int(count)
            for flag, at, count in _flag_counts(conn, a, b, step_ns):
                flags[at - first][flag] += int(count)
    out = []
    for i in range(n):
        start = max(since_ns, (first + i) * step_ns)
        end = min(until_ns, (first + i + 1) * step_ns)
        total = sum(paths[i].values())
        out.append(
            {
                "start_ns": start,
                "end_ns": end,
                "requests": total,
                "path_class": dict(sorted(paths[i].items())),
                "flags": dict(sorted(flags[i].items())),
                **{f"ttft_s_p{round(q * 100)}": histogram_quantile(ttft[i], q) for q in (0.5, 0.9, 0.99)},
            }
        )
    return {
        "since_ns": since_ns,
        "until_ns": until_ns,
        "step_s": step_ns / 1e9,
        "relative_error": RELATIVE_ERROR,
        "requests": sum(b["requests"] for b in out),
        "buckets": out,
    }


def _rollup(conn: Connection, lo: int, hi: int) -> Iterable[Any]:
    t = stats_hourly
    columns = (t.c.dimension, t.c.hour_ns, t.c.key1, t.c.key2, t.c.key3, t.c.key_nulls, t.c.request_count)
    where = (t.c.dimension.in_(("path_class", "flag")), t.c.hour_ns >= lo, t.c.hour_ns < hi)
    return conn.execute(select(*columns).where(*where))


def _ttft_rollup(conn: Connection, lo: int, hi: int) -> Iterable[Any]:
    """Each request counts once per dimension: the path class rows alone hold every request."""
    t = ttft_hourly
    group = (t.c.hour_ns, t.c.bucket)
    return conn.execute(
        select(*group, func.sum(t.c.request_count))
        .where(t.c.dimension == "path_class", t.c.hour_ns >= lo, t.c.hour_ns < hi)
        .group_by(*group)
    )


def _edge_counts(conn: Connection, since_ns: int, until_ns: int, step_ns: int) -> Iterable[Any]:
    """(step number, path class, TTFT bucket, requests) of [since, until), counted by the
    database over the covering index (index entries, never a row): Python's loop over 200,000
    entries (6 hours at 10 M spans a day) took 3-4 times as long as the scan itself.

    The TTFT bucket is `rollup.bucket_of` in SQL (`ln`, `ceil`); a SQLite built without its math
    functions gets the entries and buckets them here instead."""
    r = requests
    at = (r.c.start_ns // step_ns).label("at")
    where = (r.c.start_ns >= since_ns, r.c.start_ns < until_ns)
    tb = case(
        (r.c.ttft_s.is_(None), literal(NO_TTFT)),
        (r.c.ttft_s <= MIN_TTFT_S, literal(ZERO_BUCKET)),
        else_=cast(func.ceil(func.ln(r.c.ttft_s) / LOG_GAMMA), BigInteger),
    ).label("tb")
    stmt = select(at, r.c.path_class, tb, func.count()).where(*where).group_by(at, r.c.path_class, tb)
    try:
        return conn.execute(stmt).all()
    except OperationalError:
        if not is_sqlite(conn):
            raise
        # No ln() in this SQLite: a failed SELECT leaves its transaction as it was.
        counts: Counter[tuple[int, str | None, int]] = Counter()
        plain = select(r.c.start_ns, r.c.path_class, r.c.ttft_s).where(*where)
        for start, path_class, value in conn.execute(plain):
            counts[(start // step_ns, path_class, bucket_of(value))] += 1
        return [(*key, n) for key, n in counts.items()]


def _flag_counts(conn: Connection, since_ns: int, until_ns: int, step_ns: int) -> Iterable[Any]:
    """(flag, step number, requests) of the flag rows in the range, each joined to its request
    row as the stats count them."""
    f, r = request_flags, requests
    at = (f.c.start_ns // step_ns).label("at")
    stmt = (
        select(f.c.flag, at, func.count())
        .join(r, r.c.trace_id == f.c.trace_id)
        .where(f.c.start_ns >= since_ns, f.c.start_ns < until_ns)
        .group_by(f.c.flag, at)
    )
    return conn.execute(stmt).all()


def transfers(store: Any, since_ns: int, until_ns: int) -> dict[str, Any]:
    """Requests with a KV transfer per (prefill node, decode node, path class, pairing level) in
    [since, until), most first, at most `MAX_TRANSFER_GROUPS`: which node pairs moved KV over
    which path. Read from the request rows, so the window is at most `MAX_TRANSFER_WINDOW_NS`."""
    if until_ns <= since_ns:
        raise WindowError("the window is empty: until must be after since")
    if until_ns - since_ns > MAX_TRANSFER_WINDOW_NS:
        raise WindowError("the window is longer than 3 hours")
    r = requests
    keys = (r.c.prefill_node, r.c.decode_node, r.c.path_class, r.c.pairing_level)
    stmt = (
        select(*keys, func.count(), func.sum(r.c.kv_bytes), func.avg(r.c.kv_duration_s))
        .where(r.c.start_ns >= since_ns, r.c.start_ns < until_ns, r.c.kv_duration_s.is_not(None))
        .group_by(*keys)
        .order_by(func.count().desc(), *keys)
        .limit(MAX_TRANSFER_GROUPS + 1)
    )
    with store._read(per_value_plans=True) as conn:
        rows = conn.execute(stmt).all()
    groups = [
        {
            "prefill_node": pn,
            "decode_node": dn,
            "path_class": pc,
            "pairing_level": lv,
            "requests": int(n),
            "kv_bytes": int(b) if b is not None else None,
            "kv_duration_s_mean": float(d) if d is not None else None,
        }
        for pn, dn, pc, lv, n, b, d in rows[:MAX_TRANSFER_GROUPS]
    ]
    return {
        "since_ns": since_ns,
        "until_ns": until_ns,
        "groups": groups,
        "truncated": len(rows) > MAX_TRANSFER_GROUPS,
    }
