"""TTFT quantiles per path class and per pairing level over a time window, from the request rows.

The per-hour rollup keeps sums (means), not distributions, so quantiles read the rows: newest
first through `ix_requests_start`, at most `MAX_ROWS` of them, so a page that asks stays fast
whatever the window; the answer says when it covers only the newest requests of the window.
A request row carries its whole summary, so each row read is a page read of its own: 5,000 take
~50 ms at 10 M spans (20,000 took 100-250 ms; benchmarks/ui/README.md). A covering index on
(start_ns, path_class, pairing_level, ttft_s) would lift the bound.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import select

from railtrace.store.schema import requests

MAX_ROWS = 5_000
QUANTILES = (0.5, 0.9, 0.99)


def quantile(sorted_values: list[float], q: float) -> float:
    """Nearest rank (the value at ceil(q·n)), as Prometheus' summaries and most SRE tools report."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def _groups(rows: list[Any], index: int, name: str) -> list[dict[str, Any]]:
    values: dict[str | None, list[float]] = {}
    counts: dict[str | None, int] = {}
    for row in rows:
        key, ttft = row[index], row[2]
        counts[key] = counts.get(key, 0) + 1
        if ttft is not None:
            values.setdefault(key, []).append(ttft)
    out = []
    for key in sorted(counts, key=lambda k: (-counts[k], k or "")):
        got = sorted(values.get(key, []))
        out.append(
            {
                name: key,
                "requests": counts[key],
                "with_ttft": len(got),
                **{f"ttft_s_p{round(q * 100)}": quantile(got, q) if got else None for q in QUANTILES},
            }
        )
    return out


def ttft_quantiles(store: Any, since_ns: int | None, until_ns: int | None) -> dict[str, Any]:
    """Both groupings from one read of the window's newest rows."""
    r = requests
    stmt = select(r.c.path_class, r.c.pairing_level, r.c.ttft_s, r.c.start_ns)
    if since_ns is not None:
        stmt = stmt.where(r.c.start_ns >= since_ns)
    if until_ns is not None:
        stmt = stmt.where(r.c.start_ns < until_ns)
    stmt = stmt.order_by(r.c.start_ns.desc()).limit(MAX_ROWS + 1)
    with store._read() as conn:
        rows = conn.execute(stmt).all()
    truncated = len(rows) > MAX_ROWS
    rows = rows[:MAX_ROWS]
    return {
        "path_class": _groups(rows, 0, "path_class"),
        "pairing_level": _groups(rows, 1, "pairing_level"),
        "rows": len(rows),
        # Only the newest MAX_ROWS requests of the window were read: they start at `from_ns`.
        "from_ns": rows[-1][3] if truncated and rows else since_ns,
        "truncated": truncated,
    }
