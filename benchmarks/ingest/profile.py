"""Profile `railtrace serve` while it ingests the benchmark payload, with py-spy attached.

    .venv/bin/python -m benchmarks.ingest.profile [--db sqlite|postgresql] [--spans 102400]

Starts the service as its own process (as `run.py` does), attaches `py-spy record` to it
(all threads, GIL-holding samples only, so the profile shows where Python time goes rather
than where threads wait), posts the calls from four client threads, and prints the
functions with the most self time and the most total time. The raw profile (speedscope
JSON) is left in `benchmarks/.work/` for a closer look. Needs `pip install py-spy`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from benchmarks.common.databases import Database
from benchmarks.common.harness import post_all, serve_process
from benchmarks.common.payload import export_calls

HERE = Path(__file__).resolve().parent

WORK = HERE.parent / ".work"


def summarise(path: Path, top: int) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(self-time share, total-time share) per function from a speedscope file."""
    doc = json.loads(path.read_text())
    frames = doc["shared"]["frames"]
    selfc: Counter[str] = Counter()
    total: Counter[str] = Counter()
    n = 0.0
    for prof in doc["profiles"]:
        for stack, weight in zip(prof["samples"], prof["weights"], strict=True):
            n += weight
            if not stack:
                continue
            names = [f"{frames[i]['name']} ({Path(frames[i].get('file', '')).name})" for i in stack]
            selfc[names[-1]] += weight
            for name in set(names):
                total[name] += weight
    n = n or 1.0
    return (
        [(k, v / n) for k, v in selfc.most_common(top)],
        [(k, v / n) for k, v in total.most_common(top)],
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--spans", type=int, default=102_400)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--quiet-period", type=float, default=3600.0, help="3600 defers assembly")
    args = ap.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    calls = export_calls(args.spans)
    WORK.mkdir(parents=True, exist_ok=True)
    out = WORK / f"ingest-profile-{args.db}.speedscope.json"
    database = Database(args.db)
    try:
        with serve_process(database.url, database.tmp, args.quiet_period) as (proc, base):
            spy = subprocess.Popen(
                [
                    py_spy,
                    "record",
                    "--pid",
                    str(proc.pid),
                    "--threads",
                    "--gil",
                    "--rate",
                    "200",
                    "--format",
                    "speedscope",
                    "--output",
                    str(out),
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            time.sleep(1.0)
            elapsed, _retries = post_all(base, calls, args.clients)
            spy.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
            _, err = spy.communicate(timeout=120)
            if not out.exists():
                raise RuntimeError(f"py-spy wrote no profile: {err.decode()[-1000:]}")
    finally:
        database.drop()
    print(
        f"{len(calls) * 512} spans in {elapsed:.1f} s ({len(calls) * 512 / elapsed:,.0f} spans/s wall clock)"
    )
    selfs, totals = summarise(out, args.top)
    print("\nself time (share of GIL-holding samples):")
    for name, share in selfs:
        print(f"  {share:6.1%}  {name}")
    print("\ntotal time:")
    for name, share in totals:
        print(f"  {share:6.1%}  {name}")
    print(f"\nprofile: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
