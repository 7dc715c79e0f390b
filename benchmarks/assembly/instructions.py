"""Instructions per assembled request, counted by callgrind: a cost figure that other work
on a shared machine cannot disturb, unlike wall-clock or CPU-time rates.

    .venv/bin/python -m benchmarks.assembly.instructions --requests 128 640 [--db postgresql]

For each request count N, the ingest benchmark's 8-span P/D requests are stored in a SQLite
file the way the service's writer stores them (`prepare` + `Store.insert_batches`, in this
process, not counted), then a child process run under `valgrind --tool=callgrind` assembles
them all with the real assembler (`Assembler.run_once`, default pipeline, until nothing is
left). (instructions(N2) - instructions(N1)) / (N2 - N1) cancels interpreter start-up and
imports, leaving the cost of one more request. `--child-gc` assembles with the
garbage-collector settings of an assembly process (`railtrace serve --assembly-processes N`).
`--db postgresql` stores them in a throwaway PostgreSQL database instead (`RAILTRACE_BENCH_PG`)
and counts this process's share, the driver included; the server's own work is not counted.

    .venv/bin/python -m benchmarks.assembly.instructions --per-span

Instructions to read one stored span of the benchmark payload back into a `Span`, through upb
and `span_from_pb` and through the C reader: its encodings read three times against once.

    .venv/bin/python -m benchmarks.assembly.instructions --pipeline

Instructions of the pipeline alone per request (request keys, `assemble`, `judge`; no store,
no metrics): 256 stored requests are loaded three times over, then assembled once or three
times; the difference is two passes of the pipeline.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common.databases import Database
from benchmarks.common.payload import SPANS_PER_TRACE, export_calls

HERE = Path(__file__).resolve().parent

FLEET = HERE.parents[1] / "tests" / "verdicts" / "fleet.yaml"
READ_SPANS = 4096  # spans of the benchmark payload read by --per-span


def store(url: str, requests: int) -> None:
    from railtrace.otlp.export import prepare
    from railtrace.store import Store, make_engine, migrate

    engine = make_engine(url)
    migrate(engine)
    s = Store(engine)
    for call in export_calls(requests * SPANS_PER_TRACE):
        s.insert_batches([prepare(call)])
    engine.dispose()


def assemble(url: str, child_gc: bool = False) -> int:
    """Assemble everything stored; returns how many requests were stored as summaries.
    `child_gc`: with the garbage-collector settings of an assembly process (`_child_main`)."""
    import gc
    import time

    from railtrace.metrics import Metrics
    from railtrace.scheduling.assembler import Assembler, default_pipeline
    from railtrace.scheduling.workers import ASSEMBLY_GC_THRESHOLD
    from railtrace.settings import Settings
    from railtrace.store import Store, make_engine
    from railtrace.topology import TopologyHolder

    engine = make_engine(url)
    s = Store(engine)
    settings = Settings(db=url, quiet_period_s=0.0)
    assembler = Assembler(
        s, settings, Metrics(), default_pipeline(settings, TopologyHolder([str(FLEET)]).get)
    )
    if child_gc:
        gc.freeze()
        gc.set_threshold(ASSEMBLY_GC_THRESHOLD, 50, 100)
    later = time.time_ns() + 3600 * 10**9
    while assembler.run_once(now_ns=later, limit=500):
        pass
    return sum(r["requests"] for r in s.stats("path_class", None, None))


def read_spans(path: str, passes: int) -> int:
    """Read the benchmark's stored span encodings `passes` times, as `Store.load_spans` reads
    them: through upb and `span_from_pb` ("upb") or through the C reader ("c")."""
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

    from railtrace.otlp.export import prepare
    from railtrace.otlp.rows import chunk_records, span_from_pb

    records = [
        (chunk[0], encoding)
        for call in export_calls(READ_SPANS)
        for chunk in prepare(call).chunks
        for _rid, encoding in chunk_records(chunk[4])
    ]
    resource = {"resource": {"service.name": "vllm-decode"}, "scope": "vllm"}
    if path == "c":
        from railtrace.otlp.spans import span_reader

        read = span_reader(accelerated=True)
    else:

        def read(tid: str, encoding: bytes, resource: dict) -> object:
            return span_from_pb(tid, PbSpan.FromString(encoding), resource, False)

    for _ in range(passes):
        for tid, encoding in records:
            read(tid, encoding, resource)
    return len(records)


PIPELINE_REQUESTS = 256  # requests assembled per pass by --pipeline


def pipeline_passes(url: str, passes: int) -> int:
    """Load the stored requests three times, run the pipeline over `passes` of the copies."""
    from railtrace.scheduling.assembler import default_pipeline
    from railtrace.settings import Settings
    from railtrace.store import Store, make_engine
    from railtrace.topology import TopologyHolder

    engine = make_engine(url)
    s = Store(engine)
    ids = [t.trace_id for t in s.dirty_traces(2**62, 2**62, limit=10**6)]
    pipe = default_pipeline(Settings(db=url), TopologyHolder([str(FLEET)]).get)
    copies = []
    for _ in range(3):
        by_trace: dict[str, list] = {}
        for span in s.load_spans(ids, normalize=False):
            by_trace.setdefault(span.trace_id, []).append(span)
        copies.append(by_trace)
    judged = 0
    for by_trace in copies[:passes]:
        for members in by_trace.values():
            for span in members:
                pipe.request_keys(span)
            judged += len([pipe.judge(f) for f in pipe.assemble(members)])
    return judged


def pipeline(folder: Path) -> None:
    url = f"sqlite:///{folder / 'pipeline.db'}"
    store(url, PIPELINE_REQUESTS)
    counts = []
    for passes in (1, 3):
        count, judged = instructions(["--passes", url, str(passes)], folder / f"callgrind.pipeline.{passes}")
        if int(judged) != passes * PIPELINE_REQUESTS:
            raise RuntimeError(f"judged {judged} requests, not {passes * PIPELINE_REQUESTS}")
        counts.append(count)
    print(f"pipeline per request: {(counts[1] - counts[0]) / (2 * PIPELINE_REQUESTS):,.0f} instructions")


def instructions(child: list[str], out: Path) -> tuple[int, str]:
    """Instructions of this script run with `child` arguments under callgrind, and its output."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, __file__, *child],
        check=True,
        capture_output=True,
        text=True,
    )
    totals = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.M)
    if totals is None:
        raise RuntimeError(f"no instruction total in {out}")
    return int(totals.group(1)), done.stdout.strip()


def per_span(folder: Path) -> None:
    for path in ("upb", "c"):
        counts = []
        for passes in (1, 3):
            out = folder / f"callgrind.read.{path}.{passes}"
            count, spans = instructions(["--read", path, str(passes)], out)
            counts.append(count)
        per = (counts[1] - counts[0]) / (2 * int(spans))
        print(f"reading a stored span, {path}: {per:,.0f} instructions")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, nargs=2, default=[128, 640], metavar=("N1", "N2"))
    ap.add_argument("--assemble", metavar="URL", help=argparse.SUPPRESS)  # the counted child
    ap.add_argument(
        "--child-gc", action="store_true", help="with the garbage-collector settings of an assembly process"
    )
    ap.add_argument("--keep", help="write the callgrind files into this folder")
    ap.add_argument(
        "--db",
        choices=["sqlite", "postgresql"],
        default="sqlite",
        help="the store assembled from (PostgreSQL: the server's own work is not counted)",
    )
    ap.add_argument("--per-span", action="store_true", help="instead: instructions to read one stored span")
    ap.add_argument("--read", nargs=2, metavar=("PATH", "PASSES"), help=argparse.SUPPRESS)  # counted child
    ap.add_argument("--pipeline", action="store_true", help="instead: the pipeline alone, per request")
    ap.add_argument("--passes", nargs=2, metavar=("URL", "PASSES"), help=argparse.SUPPRESS)  # counted child
    args = ap.parse_args()
    if args.passes:
        print(pipeline_passes(args.passes[0], int(args.passes[1])))
        return 0
    if args.assemble:
        print(assemble(args.assemble, args.child_gc))
        return 0
    if args.read:
        print(read_spans(args.read[0], int(args.read[1])))
        return 0
    counts = []
    with tempfile.TemporaryDirectory(prefix="railtrace-instr-") as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if args.per_span:
            per_span(folder)
            return 0
        if args.pipeline:
            pipeline(folder)
            return 0
        for n in args.requests:
            database = Database(args.db)
            try:
                store(database.url, n)
                child = ["--assemble", database.url, *(["--child-gc"] if args.child_gc else [])]
                count, assembled = instructions(child, folder / f"callgrind.out.{n}")
            finally:
                database.drop()
            if int(assembled) != n:
                raise RuntimeError(f"assembled {assembled} requests, not {n}")
            counts.append(count)
            print(f"{n} requests: {count:,} instructions", flush=True)
    (n1, n2), (c1, c2) = args.requests, counts
    print(f"per request: {(c2 - c1) / (n2 - n1):,.0f} instructions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
