"""Instructions per assembled request, counted by callgrind: a cost figure that other work
on a shared machine cannot disturb, unlike wall-clock or CPU-time rates.

    .venv/bin/python benchmarks/assembly/instructions.py --requests 128 640

For each request count N, the ingest benchmark's 8-span P/D requests are stored in a SQLite
file the way the service's writer stores them (`prepare` + `Store.insert_batches`, in this
process, not counted), then a child process run under `valgrind --tool=callgrind` assembles
them all with the real assembler (`Assembler.run_once`, default pipeline, until nothing is
left). (instructions(N2) - instructions(N1)) / (N2 - N1) cancels interpreter start-up and
imports, leaving the cost of one more request.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "ingest"))
from payload import SPANS_PER_TRACE, export_calls  # noqa: E402

FLEET = HERE.parents[1] / "tests" / "verdicts" / "fleet.yaml"


def store(url: str, requests: int) -> None:
    from railtrace.ingest.writer import prepare
    from railtrace.store import Store, make_engine, migrate

    engine = make_engine(url)
    migrate(engine)
    s = Store(engine)
    for call in export_calls(requests * SPANS_PER_TRACE):
        s.insert_batches([prepare(call)])
    engine.dispose()


def assemble(url: str) -> int:
    """Assemble everything stored; returns how many requests were stored as summaries."""
    import time

    from railtrace.ingest.assembler import Assembler, default_pipeline
    from railtrace.metrics import Metrics
    from railtrace.settings import Settings
    from railtrace.store import Store, make_engine
    from railtrace.topology import TopologyHolder

    engine = make_engine(url)
    s = Store(engine)
    settings = Settings(db=url, quiet_period_s=0.0)
    assembler = Assembler(
        s, settings, Metrics(), default_pipeline(settings, TopologyHolder([str(FLEET)]).get)
    )
    later = time.time_ns() + 3600 * 10**9
    while assembler.run_once(now_ns=later, limit=500):
        pass
    return sum(r["requests"] for r in s.stats("path_class", None, None))


def instructions(url: str, out: Path, requests: int) -> int:
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--assemble",
            url,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    if int(done.stdout.split()[-1]) != requests:
        raise RuntimeError(f"assembled {done.stdout.strip()} requests, not {requests}")
    totals = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.M)
    if totals is None:
        raise RuntimeError(f"no instruction total in {out}")
    return int(totals.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, nargs=2, default=[128, 640], metavar=("N1", "N2"))
    ap.add_argument("--assemble", metavar="URL", help=argparse.SUPPRESS)  # the counted child
    ap.add_argument("--keep", help="write the callgrind files into this folder")
    args = ap.parse_args()
    if args.assemble:
        print(assemble(args.assemble))
        return 0
    counts = []
    with tempfile.TemporaryDirectory(prefix="railtrace-instr-") as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for n in args.requests:
            url = f"sqlite:///{Path(tmp) / f'instr-{n}.db'}"
            store(url, n)
            count = instructions(url, folder / f"callgrind.out.{n}", n)
            counts.append(count)
            print(f"{n} requests: {count:,} instructions", flush=True)
    (n1, n2), (c1, c2) = args.requests, counts
    print(f"per request: {(c2 - c1) / (n2 - n1):,.0f} instructions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
