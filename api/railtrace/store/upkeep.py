"""Upkeep: the span writer's passive WAL checkpoints, retention's bounded deletes, PostgreSQL
statistics refreshed as tables grow, and the liveness ping. Apart because none of it serves
a request: it keeps the database short, small and well planned.
"""

from __future__ import annotations

import math
import time

from sqlalchemy import (
    delete,
    select,
    text,
)

from railtrace.store.connection import Job, StoreContext
from railtrace.store.engine import checkpoint_sqlite_wal
from railtrace.store.publish import _delete_requests
from railtrace.store.rollup import RollupDelta
from railtrace.store.schema import (
    request_flags,
    requests,
    span_chunks,
    trace_keys,
    traces,
)

# Seconds between the span writer's passive WAL checkpoints (`Upkeep.checkpoint`).
CHECKPOINT_INTERVAL_S = 0.5


class Upkeep(Job):
    """Keeping the database in shape: WAL checkpoints, retention, statistics, liveness."""

    def __init__(self, ctx: StoreContext) -> None:
        super().__init__(ctx)
        self._last_checkpoint = -math.inf  # never: the first commit checkpoints, whatever the uptime

    def checkpoint(self) -> None:
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
