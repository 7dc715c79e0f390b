"""Assembly throughput: how many stored spans per second become request summaries with verdicts.

    .venv/bin/python -m benchmarks.assembly.run [--db sqlite|postgresql] [--spans 40960] [--repeat 3]
    .venv/bin/python -m benchmarks.assembly.run --profile        # pyinstrument tree of one run

The ingest benchmark's realistic 8-span P/D traces are stored first, exactly as the service's
writer stores them (`prepare` + `Store.insert_batches`), then the real assembler
(`Assembler.run_once` with the default pipeline: normalisation, assembly, verdicts against a
topology, the summary and flag rows, the metric updates) runs until nothing is left, in this
process and without the receivers, so the figure is assembly alone. Reported per run: spans
per wall-clock second and per CPU-second of this process (the figure to compare on a shared
machine), then the median and spread over `--repeat` runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from benchmarks.common.databases import Database
from benchmarks.common.payload import export_calls
from railtrace.metrics import Metrics
from railtrace.otlp.export import prepare
from railtrace.scheduling.assembler import Assembler, default_pipeline
from railtrace.settings import Settings
from railtrace.store import Store, make_engine, migrate
from railtrace.topology import TopologyHolder

HERE = Path(__file__).resolve().parent

FLEET = HERE.parents[1] / "tests" / "verdicts" / "fleet.yaml"


def one_run(kind: str, calls: list[bytes], profile: bool) -> dict[str, float]:
    db = Database(kind)
    try:
        engine = make_engine(db.url)
        migrate(engine)
        store = Store(engine)
        for call in calls:
            store.insert_batches([prepare(call)])
        settings = Settings(db=db.url, quiet_period_s=0.0)
        holder = TopologyHolder([str(FLEET)])
        assembler = Assembler(store, settings, Metrics(), default_pipeline(settings, holder.get))
        later = time.time_ns() + 3600 * 10**9
        profiler = None
        if profile:
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.001)
            profiler.start()
        wall, cpu = time.perf_counter(), time.process_time()
        while assembler.run_once(now_ns=later, limit=500):
            pass
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if profiler is not None:
            profiler.stop()
            print(profiler.output_text(unicode=False, color=False))
        spans = 512 * len(calls)
        requests = store.stats("path_class", None, None)
        assembled = sum(r["requests"] for r in requests)
        engine.dispose()
        return {"spans": spans, "requests": assembled, "wall_rate": spans / wall, "cpu_rate": spans / cpu}
    finally:
        db.drop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--spans", type=int, default=40_960)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="print a pyinstrument profile (one run)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    calls = export_calls(args.spans)
    runs = []
    for i in range(1 if args.profile else args.repeat):
        r = one_run(args.db, calls, args.profile)
        runs.append(r)
        print(
            f"run {i + 1}: {r['spans']:,} spans -> {r['requests']:,} requests; "
            f"{r['wall_rate']:,.0f} spans/s wall clock, {r['cpu_rate']:,.0f} per CPU-second",
            flush=True,
        )
    summary = {
        key: {
            "median": statistics.median(r[key] for r in runs),
            "min": min(r[key] for r in runs),
            "max": max(r[key] for r in runs),
        }
        for key in ("wall_rate", "cpu_rate")
    }
    print(
        f"{args.db}: median {summary['wall_rate']['median']:,.0f} spans/s wall clock "
        f"({summary['wall_rate']['min']:,.0f}-{summary['wall_rate']['max']:,.0f}), "
        f"{summary['cpu_rate']['median']:,.0f} per CPU-second "
        f"({summary['cpu_rate']['min']:,.0f}-{summary['cpu_rate']['max']:,.0f})"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"python": platform.python_version(), "db": args.db, "runs": runs, "summary": summary})
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
