"""Grow the request tables of a kept scale database to a larger history, without its spans.

    .venv/bin/python -m benchmarks.scale.inflate --db-url URL --factor 10

The queries for the flagged list and for stats read only `requests` and `request_flags`; the
request detail reads one `requests` row. When a full load cannot be run, this copies every
assembled request (and its flag rows) `--factor - 1` times with a new trace id and its start
time moved by whole multiples of the loaded history's length, so the copies tile the time after
it: a run stopped after 1/10 of its day, inflated 10 times, has the request rows of the whole
day, hour by hour as dense as the full load would make them. With `--overlay` the copies lie
over the loaded history instead (copy k starts k microseconds later), so a full day loaded at
1/10 of the traffic, inflated 10 times, holds the full traffic's requests in that same day.
Spans, traces and request keys are not copied, so trace queries and storage figures stay those
of the real load. The per-hour stats rollup is then rebuilt from the request rows
(`railtrace.store.rollup.rebuild`, the migration's backfill). Run `run.py --db-url` afterwards
and read only the list, stats and detail figures.
"""

from __future__ import annotations

import argparse
import time

from sqlalchemy import text

from railtrace.store import make_engine, migrate, rollup

COLUMNS = (
    "request_id, model, ttft_s, e2e_s, path_class, transport, kv_duration_s, kv_bytes, prefill_pod, "
    "prefill_node, decode_pod, decode_node, pairing_level, flag_names, summary, updated_ns"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db-url", required=True)
    ap.add_argument("--factor", type=int, default=10)
    ap.add_argument(
        "--overlay", action="store_true", help="copies over the loaded history, not after it (denser)"
    )
    args = ap.parse_args()
    engine = make_engine(args.db_url)
    migrate(engine)  # a database kept by an older version gets the rollup table first
    sqlite = engine.dialect.name == "sqlite"
    t0 = time.perf_counter()
    with engine.begin() as conn:
        lo, hi, n = conn.execute(text("SELECT min(start_ns), max(start_ns), count(*) FROM requests")).one()
        length = hi - lo + 1

        def shift(k: int) -> int:
            return k * 1_000 if args.overlay else k * length

        for k in range(1, args.factor):
            tag = f"x{k:03d}"  # not a hex digit: no clash with real trace ids
            new_id = "(:tag || substr(trace_id, 5))"
            conn.execute(
                text(
                    f"INSERT INTO requests (trace_id, start_ns, {COLUMNS})"
                    f" SELECT {new_id}, start_ns + :shift, {COLUMNS}"
                    " FROM requests WHERE trace_id NOT LIKE 'x%'"
                ),
                {"tag": tag, "shift": shift(k)},
            )
            conn.execute(
                text(
                    "INSERT INTO request_flags (flag, start_ns, trace_id, ttft_s, kv_duration_s)"
                    f" SELECT flag, start_ns + :shift, {new_id}, ttft_s, kv_duration_s"
                    " FROM request_flags WHERE trace_id NOT LIKE 'x%'"
                ),
                {"tag": tag, "shift": shift(k)},
            )
            print(f"  copy {k}: +{n:,} requests, {time.perf_counter() - t0:.0f} s", flush=True)
        t1 = time.perf_counter()
        rollup.rebuild(conn)
        print(f"  stats rollup rebuilt: {time.perf_counter() - t1:.0f} s", flush=True)
        total = conn.execute(text("SELECT count(*) FROM requests")).scalar_one()
    if sqlite:
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    else:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM (ANALYZE) requests")
            conn.exec_driver_sql("VACUUM (ANALYZE) request_flags")
            conn.exec_driver_sql("VACUUM (ANALYZE) stats_hourly")
    engine.dispose()
    hours = (1 if args.overlay else args.factor) * length / 3.6e12
    print(
        f"{total:,} requests over {hours:.1f} h ({n:,} loaded x {args.factor}), "
        f"{time.perf_counter() - t0:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
