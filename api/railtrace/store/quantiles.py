"""TTFT quantiles per path class and per pairing level over any window, from per-hour histograms.

Quantiles cannot be added up from sums, and reading a day's request rows is linear in traffic
(each row carries its whole summary, so each row read is a page read: 5,000 took ~50 ms at
10 M spans). So every request adds one to a log bucket of its TTFT, per hour and group, in
`ttft_hourly` (kept by `rollup.RollupDelta` in the transaction that writes the request rows,
like `stats_hourly`). A window reads its whole hours from there and its partial edge hours from
the covering index `ix_requests_start_ttft` (at most two hours of index entries, never a row).

Buckets are DDSketch's (Masson et al., VLDB 2019): bucket i holds (γ^(i-1), γ^i] with
γ = (1 + α) / (1 - α), and answers 2γ^i / (γ + 1), within α = 1 % of every value in it. A
quantile is the nearest rank (the value at ceil(q·n)), as Prometheus' summaries report, so the
answer is within 1 % of the exact nearest-rank TTFT of the same requests.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, Select, func, select

from railtrace.store.rollup import NO_TTFT, RELATIVE_ERROR, bucket_of, bucket_value, hour_of
from railtrace.store.schema import requests, ttft_hourly

QUANTILES = (0.5, 0.9, 0.99)


def quantile(sorted_values: list[float], q: float) -> float:
    """Nearest rank (the value at ceil(q·n)), as Prometheus' summaries and most SRE tools report."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def histogram_quantile(counts: Counter[int], q: float) -> float | None:
    """Nearest-rank quantile of a bucket histogram (NO_TTFT left out); None when it is empty."""
    valued = sorted((b, n) for b, n in counts.items() if b != NO_TTFT and n > 0)
    total = sum(n for _, n in valued)
    if not total:
        return None
    rank, seen = max(1, math.ceil(q * total)), 0
    for bucket, n in valued:
        seen += n
        if seen >= rank:
            return bucket_value(bucket)
    return bucket_value(valued[-1][0])  # pragma: no cover - rank <= total


def _hourly(conn: Connection, since_ns: int | None, until_ns: int | None) -> Iterable[tuple[Any, ...]]:
    t = ttft_hourly
    conds = []
    if since_ns is not None:
        conds.append(t.c.hour_ns >= since_ns)
    if until_ns is not None:
        conds.append(t.c.hour_ns < until_ns)
    group = (t.c.dimension, t.c.key, t.c.key_null, t.c.bucket)
    q = select(*group, func.sum(t.c.request_count)).where(*conds).group_by(*group)
    for dim, key, null, bucket, n in conn.execute(q):
        yield dim, None if null else key, bucket, int(n)


def edge_statement(since_ns: int, until_ns: int) -> Select[tuple[Any, Any, Any]]:
    """What a partial hour needs of its requests: every column is in `ix_requests_start_ttft`."""
    r = requests
    return select(r.c.path_class, r.c.pairing_level, r.c.ttft_s).where(
        r.c.start_ns >= since_ns, r.c.start_ns < until_ns
    )


def _raw(conn: Connection, since_ns: int, until_ns: int) -> Iterable[tuple[Any, ...]]:
    """The request rows of [since_ns, until_ns) as bucket counts, read from the covering index."""
    counts: Counter[tuple[str, str | None, int]] = Counter()
    for path_class, level, ttft in conn.execute(edge_statement(since_ns, until_ns)):
        bucket = bucket_of(ttft)
        counts[("path_class", path_class, bucket)] += 1
        counts[("pairing_level", level, bucket)] += 1
    for (dim, key, bucket), n in counts.items():
        yield dim, key, bucket, n


def _groups(hists: dict[tuple[str, str | None], Counter[int]], dim: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for (d, key), counts in hists.items():
        if d != dim:
            continue
        total = sum(counts.values())
        if total <= 0:
            continue
        out.append(
            {
                dim: key,
                "requests": total,
                "with_ttft": total - counts.get(NO_TTFT, 0),
                **{f"ttft_s_p{round(q * 100)}": histogram_quantile(counts, q) for q in QUANTILES},
            }
        )
    out.sort(key=lambda g: (-g["requests"], g[dim] or ""))
    return out


def ttft_quantiles(store: Any, since_ns: int | None, until_ns: int | None) -> dict[str, Any]:
    """Both groupings over [since_ns, until_ns): whole hours from `ttft_hourly`, edges from the index."""
    lo = None if since_ns is None else -hour_of(-since_ns)  # start of the first whole hour
    hi = None if until_ns is None else hour_of(until_ns)  # end of the last one
    parts: list[Iterable[tuple[Any, ...]]] = []
    with store._read(per_value_plans=True) as conn:
        if since_ns is not None and until_ns is not None and lo is not None and hi is not None and lo >= hi:
            parts.append(_raw(conn, since_ns, until_ns))  # no whole hour inside
        else:
            parts.append(_hourly(conn, lo, hi))
            if lo is not None and since_ns is not None and since_ns < lo:
                parts.append(_raw(conn, since_ns, lo))
            if hi is not None and until_ns is not None and hi < until_ns:
                parts.append(_raw(conn, hi, until_ns))
        hists: dict[tuple[str, str | None], Counter[int]] = {}
        for part in parts:
            for dim, key, bucket, n in part:
                hists.setdefault((dim, key), Counter())[bucket] += n
    by_path = _groups(hists, "path_class")
    return {
        "path_class": by_path,
        "pairing_level": _groups(hists, "pairing_level"),
        "rows": sum(g["requests"] for g in by_path),  # requests counted (each is in one path class)
        "from_ns": since_ns,
        "truncated": False,  # every request of the window counts (kept for clients of 0.x)
        "relative_error": RELATIVE_ERROR,
    }
