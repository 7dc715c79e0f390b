"""How long a SQLite group commit takes while receiver threads build rows (GIL contention).

    .venv/bin/python -m benchmarks.ingest.contended [--threads 4] [--rows-per-statement 1024 1]

The writer's commit runs while `--threads` threads do what the OTLP/HTTP receiver does for
each export call (content scan, parse, row building) on the benchmark payload, without
pause. Each commit holds two 512-span calls, as under the end-to-end benchmark's load.
`--rows-per-statement 1` steps once per row, as `executemany` did; the sqlite3 module lets
go of the GIL around each step, and the writer then has to win it back from the receiver
threads. Prints the commit's wall-clock time (mean, median) and the writer's CPU time.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import railtrace.store.statements as store_module
from benchmarks.common.harness import uptime
from benchmarks.common.payload import export_calls
from railtrace.otlp.content import content_filter
from railtrace.otlp.export import prepare
from railtrace.store import Store, make_engine, migrate

HERE = Path(__file__).resolve().parent

PROTOBUF = "application/x-protobuf"


def commit_times(
    calls: list[bytes], threads: int, rows_per_statement: int
) -> tuple[list[float], list[float]]:
    store_module.MAX_ROWS_PER_STATEMENT = rows_per_statement
    batches = [prepare(c) for c in calls]
    content = content_filter(None)
    stop = threading.Event()

    def receive() -> None:
        i = 0
        while not stop.is_set():
            raw = calls[i % len(calls)]
            prepare(content.apply(raw, PROTOBUF), content_free=content.covers_content)
            i += 1

    with tempfile.TemporaryDirectory(prefix="railtrace-contended-") as tmp:
        engine = make_engine(f"sqlite:///{tmp}/bench.db")
        migrate(engine)
        store = Store(engine)
        workers = [threading.Thread(target=receive, daemon=True) for _ in range(threads)]
        for w in workers:
            w.start()
        walls, cpus = [], []
        try:
            for i in range(0, len(batches), 2):
                t, c = time.perf_counter(), time.thread_time()
                store.insert_batches(batches[i : i + 2])
                walls.append(time.perf_counter() - t)
                cpus.append(time.thread_time() - c)
        finally:
            stop.set()
            for w in workers:
                w.join()
            engine.dispose()
    return walls, cpus


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spans", type=int, default=81_920)
    ap.add_argument("--threads", type=int, default=4, help="receiver threads building rows meanwhile")
    ap.add_argument("--rows-per-statement", type=int, nargs="+", default=[1024, 1])
    args = ap.parse_args()
    calls = export_calls(args.spans)
    print(uptime())
    for rows in args.rows_per_statement:
        walls, cpus = commit_times(calls, args.threads, rows)
        print(
            f"{rows:5d} rows per statement, {args.threads} receiver threads: commit of 2 calls "
            f"{statistics.mean(walls) * 1e3:.1f} ms mean, {statistics.median(walls) * 1e3:.1f} ms median, "
            f"writer CPU {statistics.mean(cpus) * 1e3:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
