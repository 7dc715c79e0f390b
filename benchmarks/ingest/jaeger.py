"""railtrace beside Jaeger v2: ingest and trace by id, same payload, same load generator.

    .venv/bin/python -m benchmarks.ingest.jaeger [--spans 51200] [--rounds 2] [--queries 300] \
        [--stores jaeger-memory,jaeger-badger,jaeger-badger-sync,sqlite,postgresql]

Each round runs every store once, one after the other on the same machine (the order rotates
from round to round, so no store always runs first or last): a fresh server in its own process
(`railtrace serve` with default settings on a throwaway SQLite file or PostgreSQL database, or
Jaeger v2 from scripts/build-jaeger with the store named, benchmarks/common/jaeger.py); the
ingest benchmark's export calls (benchmarks/common/payload.py: 8-span llm-d P/D requests, 512
spans per OTLP/HTTP protobuf call) posted by `post_all` from `--clients` keep-alive threads;
then `--queries` random trace ids fetched by one keep-alive client, each answer checked (all 8
spans of the asked trace).

Figures per run: spans/s until the last call is acknowledged; spans/s until the store holds
them all (railtrace: the same moment, it answers after commit; Jaeger: when its storage
exporter's own counter reaches the total); server CPU-seconds and peak RSS; trace-by-id p50/p99.
railtrace is asked for the trace both ways (`/api/v1/traces/{id}`, its own JSON with the request
summary, and `/jaeger/api/traces/{id}`, Jaeger's JSON); Jaeger at `/api/traces/{id}`. Before the
queries railtrace's assembler is let finish, so both answer from a settled store.

When Jaeger cannot be had (no Go to build it), its stores are skipped with a message and
railtrace's still run. Not a test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sqlalchemy import create_engine

from benchmarks.common.databases import Database
from benchmarks.common.harness import cpu_seconds, latency_ms, post_all, rss_mb, serve_process, uptime
from benchmarks.common.jaeger import RELEASE, Jaeger, JaegerUnavailable, jaeger_binary
from benchmarks.common.payload import SPANS_PER_TRACE, export_calls
from railtrace.store import Store

ROOT = Path(__file__).resolve().parents[2]
STORES = ("jaeger-memory", "jaeger-badger", "jaeger-badger-sync", "sqlite", "postgresql")
WARMUP = 20


def trace_ids_of(call: bytes) -> list[str]:
    seen: dict[str, None] = {}
    for rs in ExportTraceServiceRequest.FromString(call).resource_spans:
        for ss in rs.scope_spans:
            for s in ss.spans:
                seen.setdefault(s.trace_id.hex(), None)
    return list(seen)


def _fetches(store: str, tid: str) -> list[tuple[str, str, Callable[[dict[str, Any]], int]]]:
    """(label, path, span count of the answer) of the trace-by-id calls for one store."""
    jaeger_spans: Callable[[dict[str, Any]], int] = lambda b: sum(len(t["spans"]) for t in b["data"])  # noqa: E731
    if store.startswith("jaeger"):
        return [("Jaeger GET /api/traces/{id}", f"/api/traces/{tid}", jaeger_spans)]
    return [
        ("railtrace GET /api/v1/traces/{id}", f"/api/v1/traces/{tid}", lambda b: len(b["spans"])),
        ("railtrace GET /jaeger/api/traces/{id}", f"/jaeger/api/traces/{tid}", jaeger_spans),
    ]


def query(store: str, base: str, tids: Sequence[str], queries: int, seed: int) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {}
    with httpx.Client(base_url=base, timeout=60) as client:
        for i in range(WARMUP + queries):
            tid = rng.choice(tids)
            for label, path, count in _fetches(store, tid):
                t = time.perf_counter()
                r = client.get(path)
                r.raise_for_status()
                n = count(r.json())
                elapsed = time.perf_counter() - t
                if n != SPANS_PER_TRACE:
                    raise RuntimeError(f"{label} for {tid}: {n} spans, {SPANS_PER_TRACE} sent")
                if i >= WARMUP:
                    samples.setdefault(label, []).append(elapsed)
    return {k: latency_ms(v) for k, v in samples.items()}


def run_jaeger(
    binary: Path, store: str, calls: Sequence[bytes], args: argparse.Namespace, tids: list[str]
) -> dict[str, Any]:
    n = 512 * len(calls)
    jaeger = Jaeger(binary, store.removeprefix("jaeger-"))
    try:
        cpu0 = cpu_seconds(jaeger.proc.pid)
        t = time.perf_counter()
        acked, retries = post_all(jaeger.otlp_http, calls, args.clients)
        jaeger.wait_stored(n)
        stored = time.perf_counter() - t
        cpu = cpu_seconds(jaeger.proc.pid) - cpu0
        out: dict[str, Any] = {
            "acknowledged_spans_per_s": n / acked,
            "stored_spans_per_s": n / stored,
            "spans_per_server_cpu_s": n / cpu,
            "retries": retries,
        }
        out["queries"] = query(store, jaeger.query, tids, args.queries, args.seed)
        out["peak_rss_mb"] = rss_mb(jaeger.proc.pid, peak=True)
        return out
    finally:
        jaeger.stop()


def run_railtrace(
    db: str, calls: Sequence[bytes], args: argparse.Namespace, tids: list[str]
) -> dict[str, Any]:
    n = 512 * len(calls)
    database = Database(db)
    try:
        with serve_process(database.url, database.tmp) as (proc, base):
            cpu0, tree0 = cpu_seconds(proc.pid), tree_cpu_seconds(proc.pid)
            t = time.perf_counter()
            acked, retries = post_all(base, calls, args.clients)
            cpu = cpu_seconds(proc.pid) - cpu0
            engine = create_engine(database.url)
            try:
                store = Store(engine)
                if (stored := store.count_spans()) != n:
                    raise RuntimeError(f"railtrace ({db}) holds {stored} spans, {n} acknowledged")
                deadline = time.monotonic() + 1800
                while store.count_dirty() and time.monotonic() < deadline:
                    time.sleep(0.2)
                assembled = time.perf_counter() - t
                tree = tree_cpu_seconds(proc.pid) - tree0
            finally:
                engine.dispose()
            out: dict[str, Any] = {
                "acknowledged_spans_per_s": n / acked,
                "stored_spans_per_s": n / acked,  # acknowledged only once committed
                "spans_per_server_cpu_s": n / cpu,
                "assembled_spans_per_s": n / assembled,
                "spans_per_cpu_s_with_assembly": n / tree,
                "retries": retries,
            }
            out["queries"] = query(db, base, tids, args.queries, args.seed)
            out["peak_rss_mb"] = rss_mb(proc.pid, peak=True)
            return out
    finally:
        database.drop()


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its live descendants (railtrace's assembly processes)."""
    total = cpu_seconds(pid)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        total += sum(tree_cpu_seconds(int(c)) for c in children if Path(f"/proc/{c}").exists())
    return total


def git_commit() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return out.stdout.strip() or "unknown"


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _p50(runs: list[dict[str, Any]], path: str) -> float:
    """Median over the runs of the p50 of the trace-by-id call at `path`."""
    return statistics.median(
        next(v["p50_ms"] for k, v in r["queries"].items() if k.endswith(path + "{id}")) for r in runs
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spans", type=int, default=51_200)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--queries", type=int, default=300, help="random traces fetched per run")
    ap.add_argument("--clients", type=int, default=4, help="concurrent exporting connections")
    ap.add_argument("--stores", default=",".join(STORES), help=f"comma list of {', '.join(STORES)}")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if unknown := set(stores) - set(STORES):
        ap.error(f"unknown stores {sorted(unknown)}; known: {', '.join(STORES)}")
    binary: Path | None = None
    if any(s.startswith("jaeger") for s in stores):
        try:
            binary = jaeger_binary()
        except JaegerUnavailable as exc:
            print(f"Jaeger skipped: {exc}", file=sys.stderr)
            stores = [s for s in stores if not s.startswith("jaeger")]
    calls = export_calls(args.spans)
    tids = [t for c in calls for t in trace_ids_of(c)]
    meta = {
        "spans": 512 * len(calls),
        "clients": args.clients,
        "queries": args.queries,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "railtrace": git_commit(),
        "jaeger": f"github.com/jaegertracing/jaeger {RELEASE} (Jaeger v2)" if binary else "skipped",
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(f"railtrace beside Jaeger: {meta}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in stores}
    for k in range(args.rounds):
        order = stores[k % len(stores) :] + stores[: k % len(stores)]
        for store in order:
            load = uptime()
            if store.startswith("jaeger"):
                assert binary is not None
                result = run_jaeger(binary, store, calls, args, tids)
            else:
                result = run_railtrace(store, calls, args, tids)
            result |= {"round": k + 1, "load_before": load}
            runs[store].append(result)
            print(json.dumps({store: result}), flush=True)

    print(f"\nrailtrace beside Jaeger: {meta}")
    print(
        "| store | acknowledged spans/s | stored spans/s | spans per server CPU-s | peak RSS MB "
        "| trace by id p50 / p99 ms |\n|---|---:|---:|---:|---:|---|"
    )
    for store, rs in runs.items():
        lat: dict[str, list[dict[str, float]]] = {}
        for r in rs:
            for label, v in r["queries"].items():
                lat.setdefault(label, []).append(v)
        shown = "; ".join(
            f"{label.split(' GET ')[-1]}: {statistics.median(v['p50_ms'] for v in vs):.1f} / "
            f"{statistics.median(v['p99_ms'] for v in vs):.1f}"
            for label, vs in lat.items()
        )
        print(
            f"| {store} | {_median(rs, 'acknowledged_spans_per_s'):,.0f} "
            f"| {_median(rs, 'stored_spans_per_s'):,.0f} "
            f"| {_median(rs, 'spans_per_server_cpu_s'):,.0f} | {_median(rs, 'peak_rss_mb'):,.0f} | {shown} |"
        )
    ours = [s for s in stores if not s.startswith("jaeger")]
    theirs = [s for s in stores if s.startswith("jaeger")]
    if ours:
        print("\nrailtrace with its assembler: until every request has its verdict, all its processes")
        print("| store | assembled spans/s | spans per CPU-s, ingest and assembly |\n|---|---:|---:|")
        for o in ours:
            print(
                f"| {o} | {_median(runs[o], 'assembled_spans_per_s'):,.0f} "
                f"| {_median(runs[o], 'spans_per_cpu_s_with_assembly'):,.0f} |"
            )
    if ours and theirs:
        print("\nratios railtrace / Jaeger (medians; above 1: railtrace faster)")
        print("| railtrace | Jaeger | stored spans/s | per CPU-s | trace by id p50 (Jaeger JSON) |")
        print("|---|---|---:|---:|---:|")
        for o in ours:
            for t in theirs:
                stored = _median(runs[o], "stored_spans_per_s") / _median(runs[t], "stored_spans_per_s")
                cpu = _median(runs[o], "spans_per_server_cpu_s") / _median(runs[t], "spans_per_server_cpu_s")
                p50 = _p50(runs[t], "/api/traces/") / _p50(runs[o], "/jaeger/api/traces/")
                print(f"| {o} | {t} | {stored:.2f} | {cpu:.2f} | {p50:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
