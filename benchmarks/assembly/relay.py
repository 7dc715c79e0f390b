"""Instructions per assembled request of the metric relay of `--assembly-processes`, counted by
callgrind: what an assembly child spends counting a request (`RecordedMetrics`, as
`Assembler._count` calls it) and taking and pickling its batches, and what the serve process
spends unpickling and applying them (`Metrics.merge`, under the interpreter lock its receivers
need; `workers.replay` in code before 2026-12-01).

    .venv/bin/python -m benchmarks.assembly.relay --requests 2048 --batch 16

The request summaries are the real ones: the ingest benchmark's 8-span P/D requests assembled
with the default pipeline (in this process, not counted), saved, then three children run under
callgrind: one only loads them, one also counts them in batches of `--batch` requests (one
batch per relay interval), one also applies those batches in a serve-side `Metrics`. The
differences, divided by the requests, are the child's and the serve process's share.
"""

from __future__ import annotations

import argparse
import pickle
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.assembly.instructions import FLEET, store

HERE = Path(__file__).resolve().parent


def instructions(child: list[str], out: Path) -> int:
    """Instructions of this script run with `child` arguments under callgrind."""
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__, *child]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    totals = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.M)
    if totals is None:
        raise RuntimeError(f"no instruction total in {out}")
    return int(totals.group(1))


def summaries(requests: int, folder: Path) -> Path:
    """Assemble the benchmark's requests once and save what `request_assembled` was given."""
    import time

    from railtrace.scheduling.assembler import Assembler, default_pipeline
    from railtrace.scheduling.workers import RecordedMetrics
    from railtrace.settings import Settings
    from railtrace.store import Store, make_engine
    from railtrace.topology import TopologyHolder

    seen: list[tuple[dict[str, Any], dict[str, Any] | None]] = []

    class Capture(RecordedMetrics):
        def request_assembled(self, new: dict[str, Any], old: dict[str, Any] | None) -> None:
            seen.append((new, old))

    url = f"sqlite:///{folder / 'relay.db'}"
    store(url, requests)
    settings = Settings(db=url, quiet_period_s=0.0)
    s = Store(make_engine(url))
    pipeline = default_pipeline(settings, TopologyHolder([str(FLEET)]).get)
    assembler = Assembler(s, settings, Capture(), pipeline)  # type: ignore[arg-type]
    later = time.time_ns() + 3600 * 10**9
    while assembler.run_once(now_ns=later, limit=500):
        pass
    if len(seen) != requests:
        raise RuntimeError(f"assembled {len(seen)} requests, not {requests}")
    path = folder / "summaries.pickle"
    path.write_bytes(pickle.dumps(seen))
    return path


def run(path: str, phase: str, batch: int) -> int:
    """The counted child: load the summaries; with phase "child" or "serve" count them as an
    assembly child does; with "serve" also apply the batches as the serve process does."""
    from railtrace.metrics import Metrics
    from railtrace.scheduling import workers
    from railtrace.scheduling.workers import RecordedMetrics
    from railtrace_tracing import semconv

    # Code before 2026-12-01 replayed recorded updates through `workers.replay`.
    apply = getattr(workers, "replay", None) or Metrics.merge

    seen = pickle.loads(Path(path).read_bytes())
    if phase == "load":
        return len(seen)
    recorded, sent = RecordedMetrics(), []
    for start in range(0, len(seen), batch):
        for new, old in seen[start : start + batch]:
            recorded.request_assembled(new, old)
            recorded[semconv.M_ASSEMBLY_LAG].observe(2.05)
        sent.append(pickle.dumps(recorded.take()))  # what the queue's feeder thread does
    if phase == "serve":
        serving = Metrics()
        for data in sent:
            apply(serving, pickle.loads(data))
    return len(seen)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=16, help="requests counted per relay interval")
    ap.add_argument("--run", nargs=2, metavar=("PATH", "PHASE"), help=argparse.SUPPRESS)  # counted child
    args = ap.parse_args()
    if args.run:
        print(run(args.run[0], args.run[1], args.batch))
        return 0
    with tempfile.TemporaryDirectory(prefix="railtrace-relay-") as tmp:
        folder = Path(tmp)
        path = summaries(args.requests, folder)
        counts = {}
        for phase in ("load", "child", "serve"):
            child = ["--run", str(path), phase, "--batch", str(args.batch)]
            counts[phase] = instructions(child, folder / f"callgrind.{phase}")
    n = args.requests
    print(f"assembly child, per request: {(counts['child'] - counts['load']) / n:,.0f} instructions")
    print(f"serve process, per request: {(counts['serve'] - counts['child']) / n:,.0f} instructions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
