"""TTFT quantiles per path class or pairing level over a time window, from the request rows.

The per-hour rollup keeps sums (means), not distributions, so quantiles read the rows: newest
first through `ix_requests_start`, at most `MAX_ROWS` of them (an hour of a 400,000-request day
is ~17,000), so a page that asks stays fast whatever the window; the answer says when it covers
only the newest requests of the window.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import select

from railtrace.store.queries import StoreError
from railtrace.store.schema import requests

MAX_ROWS = 20_000
QUANTILES = (0.5, 0.9, 0.99)
GROUPS = {"path_class": requests.c.path_class, "pairing_level": requests.c.pairing_level}


def quantile(sorted_values: list[float], q: float) -> float:
    """Nearest rank (the value at ceil(q·n)), as Prometheus' summaries and most SRE tools report."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def ttft_quantiles(store: Any, group_by: str, since_ns: int | None, until_ns: int | None) -> dict[str, Any]:
    if group_by not in GROUPS:
        raise StoreError("group_by must be path_class or pairing_level")
    r = requests
    stmt = select(GROUPS[group_by], r.c.ttft_s, r.c.start_ns)
    if since_ns is not None:
        stmt = stmt.where(r.c.start_ns >= since_ns)
    if until_ns is not None:
        stmt = stmt.where(r.c.start_ns < until_ns)
    stmt = stmt.order_by(r.c.start_ns.desc(), r.c.trace_id.desc()).limit(MAX_ROWS + 1)
    with store._read() as conn:
        rows = conn.execute(stmt).all()
    truncated = len(rows) > MAX_ROWS
    rows = rows[:MAX_ROWS]
    groups: dict[str | None, list[float]] = {}
    counts: dict[str | None, int] = {}
    for key, ttft, _ in rows:
        counts[key] = counts.get(key, 0) + 1
        if ttft is not None:
            groups.setdefault(key, []).append(ttft)
    out = []
    for key in sorted(counts, key=lambda k: (-counts[k], k or "")):
        values = sorted(groups.get(key, []))
        out.append(
            {
                group_by: key,
                "requests": counts[key],
                "with_ttft": len(values),
                **{f"ttft_s_p{round(q * 100)}": quantile(values, q) if values else None for q in QUANTILES},
            }
        )
    return {
        "group_by": group_by,
        "groups": out,
        "rows": len(rows),
        # Only the newest MAX_ROWS requests of the window were read.
        "from_ns": rows[-1][2] if truncated and rows else since_ns,
        "truncated": truncated,
    }
