"""The insert alone while the database grows: does ingest stay fast as history accumulates?

    .venv/bin/python -m benchmarks.ingest.history --spans 2048000
    .venv/bin/python -m benchmarks.ingest.history --spans 2048000 --checkpoint-pages 1000,16384
    .venv/bin/python -m benchmarks.ingest.history --db postgresql --spans 1024000

Builds the benchmark payload (distinct traces), then commits it segment by segment with the
writer's own call (`Store.insert_batches`, 8 export calls = 4,096 spans per commit) into one
fresh database, and prints the wall-clock and per-CPU-second rate of each segment. Every new
trace inserts into indexes keyed by random trace ids, so the later segments show what
history costs. `--checkpoint-pages` (SQLite) repeats the run for each WAL checkpoint
interval, overriding the store's own.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sqlalchemy import event

from benchmarks.common.databases import Database
from benchmarks.common.payload import export_calls
from railtrace.otlp.export import prepare
from railtrace.store import Store, make_engine, migrate

HERE = Path(__file__).resolve().parent


def grow(calls: list[bytes], db: str, segment_calls: int, checkpoint_pages: int | None) -> list[str]:
    database = Database(db)
    try:
        engine = make_engine(database.url)
        if checkpoint_pages is not None:
            event.listen(
                engine,
                "connect",
                lambda conn, _r: conn.execute(f"PRAGMA wal_autocheckpoint={checkpoint_pages}"),
            )
        migrate(engine)
        store = Store(engine)
        out = []
        for first in range(0, len(calls), segment_calls):
            batches = [prepare(c) for c in calls[first : first + segment_calls]]
            n = sum(len(b) for b in batches)
            t, cpu = time.perf_counter(), time.process_time()
            for i in range(0, len(batches), 8):
                store.insert_batches(batches[i : i + 8])
            wall, cpu = time.perf_counter() - t, time.process_time() - cpu
            out.append(f"{n / wall / 1000:.0f}k / {n / cpu / 1000:.0f}k")
            print(
                f"  {(first + segment_calls) * 512:>10,} spans: {out[-1]} (wall / per CPU-second)", flush=True
            )
        engine.dispose()
        return out
    finally:
        database.drop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spans", type=int, default=2_048_000)
    ap.add_argument("--segment", type=int, default=204_800, help="spans per measured segment")
    ap.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--checkpoint-pages", help="SQLite: comma list of WAL checkpoint intervals to compare")
    args = ap.parse_args()
    calls = export_calls(args.spans, seed=7)
    print(f"payload: {len(calls) * 512:,} spans in {len(calls)} export calls", flush=True)
    runs = [int(p) for p in args.checkpoint_pages.split(",")] if args.checkpoint_pages else [None]
    for pages in runs:
        label = "the store's own checkpoint interval" if pages is None else f"checkpoint every {pages} pages"
        print(f"{args.db}, {label}:", flush=True)
        grow(calls, args.db, max(1, args.segment // 512), pages)
    return 0


if __name__ == "__main__":
    sys.exit(main())
