"""Scale-out benchmark: aggregate durable-ingest throughput of 1, 2 and 4 `railtrace serve`
replicas sharing one PostgreSQL, fed by the collector's traceID partitioning.

    .venv/bin/python -m benchmarks.scaleout.run [--replicas 1 2 4] [--spans 204800] [--repeat 3]

Each replica is its own process (as in production, one per pod). The ingest benchmark's
payload (realistic 8-span P/D requests, 512 spans per call) is re-cut the way the
`loadbalancing` exporter does it: every trace goes to the replica the traceID ring picks
(`tests/scaleout/ring.py`), in calls of at most 512 spans. Clients (`--clients` threads per
replica) post until every call is acknowledged -- i.e. committed -- and the clock stops at
the last acknowledgement. Assembly runs as it does in production (default quiet period),
so its claims and the ingest share the database. Not a test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sqlalchemy import create_engine

from benchmarks.common.databases import Database
from benchmarks.common.harness import cpu_seconds, post_all, serve_process
from benchmarks.common.payload import export_calls
from railtrace.store import Store
from tests.scaleout.ring import TraceIdRing

ROOT = Path(__file__).resolve().parents[2]


def partition(calls: list[bytes], replicas: int) -> tuple[list[bytes], list[int]]:
    """Re-cut export calls per replica by traceID, as the loadbalancing exporter does."""
    ring = TraceIdRing([f"railtrace-{i}.railtrace:4317" for i in range(replicas)])
    index = {f"railtrace-{i}.railtrace:4317": i for i in range(replicas)}
    out: list[bytes] = []
    route: list[int] = []
    for raw in calls:
        req = ExportTraceServiceRequest.FromString(raw)
        parts: dict[int, ExportTraceServiceRequest] = {}
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    target = index[ring.endpoint_for(s.trace_id)]
                    part = parts.setdefault(target, ExportTraceServiceRequest())
                    if not part.resource_spans or part.resource_spans[-1].resource != rs.resource:
                        prs = part.resource_spans.add()
                        prs.resource.CopyFrom(rs.resource)
                        prs.scope_spans.add().scope.CopyFrom(ss.scope)
                    part.resource_spans[-1].scope_spans[-1].spans.add().CopyFrom(s)
        for target, part in sorted(parts.items()):
            out.append(part.SerializeToString())
            route.append(target)
    return out, route


def one_run(calls: list[bytes], replicas: int, clients: int, n_spans: int) -> dict[str, float]:
    database = Database("postgresql")
    cut, route = partition(calls, replicas)
    try:
        stack = []
        bases = []
        pids = []
        for _ in range(replicas):
            cm = serve_process(database.url, database.tmp)
            proc, base = cm.__enter__()
            stack.append(cm)
            bases.append(base)
            pids.append(proc.pid)
        try:
            cpu0 = sum(cpu_seconds(p) for p in pids)
            elapsed, retries = post_all(bases, cut, clients, route)
            cpu = sum(cpu_seconds(p) for p in pids) - cpu0
        finally:
            for cm in reversed(stack):
                cm.__exit__(None, None, None)
        engine = create_engine(database.url)
        stored = Store(engine).count_spans()
        engine.dispose()
        if stored != n_spans:
            raise RuntimeError(f"{stored} spans stored, {n_spans} acknowledged")
        return {"spans_per_s": n_spans / elapsed, "cpu_s": cpu, "retries": float(retries)}
    finally:
        database.drop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--spans", type=int, default=204_800)
    ap.add_argument("--clients", type=int, default=2, help="client threads per replica")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    calls = export_calls(args.spans)
    n_spans = 512 * len(calls)
    results: dict[str, dict[str, float | list[float]]] = {}
    for rep in range(args.repeat):
        for n in args.replicas:
            r = one_run(calls, n, args.clients, n_spans)
            print(
                f"run {rep + 1}: {n} replica(s): {r['spans_per_s']:,.0f} spans/s, "
                f"{r['cpu_s']:.1f} replica CPU-s, {r['retries']:.0f} retries",
                flush=True,
            )
            entry = results.setdefault(str(n), {"runs": []})
            entry["runs"].append(r["spans_per_s"])  # type: ignore[union-attr]
    meta = {
        "spans": n_spans,
        "python": platform.python_version(),
        "cpus": __import__("os").cpu_count(),
        "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    print(f"\nscale-out benchmark: {meta}")
    print("| replicas | median spans/s | min | max |\n|---:|---:|---:|---:|")
    for n, entry in results.items():
        runs = entry["runs"]
        print(f"| {n} | {statistics.median(runs):,.0f} | {min(runs):,.0f} | {max(runs):,.0f} |")  # type: ignore[arg-type]
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
