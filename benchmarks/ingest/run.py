"""Ingest benchmark: OTLP/HTTP protobuf spans per second until durable and queryable.

    .venv/bin/python -m benchmarks.ingest.run [--spans 200000] [--db sqlite|postgresql|both]

Runs `railtrace serve` as its own process (one process, default settings but the given
database), sends pre-built 512-span export calls from client threads, and stops the clock
when the last call is acknowledged -- railtrace acknowledges only after commit, so every
acknowledged span is durable -- then checks that every span is there to query. Also measures
the ceilings in this process: protobuf parse alone, decode to spans, decode + normalise +
row building, and the database insert alone. Not a test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from sqlalchemy import create_engine

from benchmarks.common.databases import Database
from benchmarks.common.harness import PROTOBUF, cpu_seconds, free_port, post_all, serve_process
from benchmarks.common.payload import export_calls
from railtrace.otlp import accelerators, decode
from railtrace.otlp.decode import parse_protobuf
from railtrace.otlp.export import prepare
from railtrace.otlp.rows import rows_from_request
from railtrace.store import Store, make_engine, migrate

HERE = Path(__file__).resolve().parent


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


def ceilings(calls: list[bytes], db: str, with_cpu: bool = True) -> dict[str, float]:
    """Rates of each stage alone in this process: wall clock and per CPU-second."""
    n = 512 * len(calls)
    out: dict[str, float] = {}

    def record(label: str, fn) -> None:
        wall, cpu = cpu_rate(fn, n)
        out[f"{label}, wall clock"] = wall
        out[f"{label}, per CPU-second"] = cpu

    if with_cpu:
        record("ceiling: protobuf parse alone", lambda: [parse_protobuf(c) for c in calls])
        record(
            "ceiling: decode every attribute to Span objects", lambda: [decode(c, PROTOBUF) for c in calls]
        )
        record(
            "ceiling: railtrace row building from the call's bytes (ingest path)",
            lambda: [prepare(c) for c in calls],
        )
        if accelerators.wirescan is not None:
            record(
                "ceiling: the same, accelerator off (protobuf parse + Python rows)",
                lambda: [rows_from_request(parse_protobuf(c), c) for c in calls],
            )
    batches = [prepare(c) for c in calls]
    database = Database(db)
    try:
        engine = make_engine(database.url)
        migrate(engine)
        store = Store(engine)

        def insert() -> None:
            for i in range(0, len(batches), 8):  # 8 x 512 = the writer's 4096-span group commit
                store.insert_batches(batches[i : i + 8])

        record(f"ceiling: {db} insert alone (4096 spans/commit)", insert)
        engine.dispose()
    finally:
        database.drop()
    return out


def end_to_end(
    calls: list[bytes],
    db: str,
    clients: int,
    quiet_period: float | None,
    serve_env: dict[str, str] | None = None,
) -> dict[str, float]:
    database = Database(db)
    n_spans = 512 * len(calls)
    try:
        with serve_process(database.url, database.tmp, quiet_period, serve_env) as (proc, base):
            cpu0 = cpu_seconds(proc.pid)
            t = time.perf_counter()
            elapsed, retries = post_all(base, calls, clients)
            server_cpu = cpu_seconds(proc.pid) - cpu0
            engine = create_engine(database.url)
            store = Store(engine)
            stored = store.count_spans()
            if stored != n_spans:
                raise RuntimeError(f"{stored} spans stored, {n_spans} acknowledged")
            assembled_rate = None
            if not (quiet_period and quiet_period > 60):  # wait for every request summary
                deadline = time.monotonic() + 1800
                while time.monotonic() < deadline:
                    if store.count_dirty() == 0:
                        assembled_rate = rate(n_spans, time.perf_counter() - t)
                        break
                    time.sleep(0.2)
            engine.dispose()
            rss = _peak_rss_mb(proc.pid)
    finally:
        database.drop()
    label = f"{db} end to end" + (" (assembly deferred)" if quiet_period and quiet_period > 60 else "")
    label += "".join(f" ({k}={v})" for k, v in (serve_env or {}).items())
    return {
        f"{label}, durable and queryable, wall clock": rate(n_spans, elapsed),
        f"{label}, per server CPU-second": rate(n_spans, server_cpu),
        **({f"{db} until every request is assembled, wall clock": assembled_rate} if assembled_rate else {}),
        f"{db} server peak RSS MB": rss,
        f"{db} 429/503 retries": float(retries),
    }


def phoenix(calls: list[bytes], executable: str, clients: int) -> dict[str, float]:
    """Arize Phoenix (its own venv, SQLite) on the same payload: spans/s until its database
    holds every span. Phoenix answers 200 before it stores, so the clock stops at the count."""
    import sqlite3

    workdir = Path(tempfile.mkdtemp(prefix="phoenix-bench-"))
    port, grpc_port = free_port(), free_port()
    env = dict(
        os.environ,
        PHOENIX_WORKING_DIR=str(workdir),
        PHOENIX_PORT=str(port),
        PHOENIX_GRPC_PORT=str(grpc_port),
        PHOENIX_HOST="127.0.0.1",
    )
    proc = subprocess.Popen(
        [executable, "serve"], env=env, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("Phoenix did not start")
            time.sleep(0.5)
        n_spans = 512 * len(calls)
        queue = list(range(len(calls)))
        lock = threading.Lock()

        def worker() -> None:
            with httpx.Client(base_url=base, timeout=300, headers={"content-type": PROTOBUF}) as client:
                while True:
                    with lock:
                        if not queue:
                            return
                        i = queue.pop()
                    r = client.post("/v1/traces", content=calls[i])
                    r.raise_for_status()

        threads = [threading.Thread(target=worker) for _ in range(clients)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        accepted = time.perf_counter() - t
        db = sqlite3.connect(workdir / "phoenix.db")
        deadline = time.monotonic() + 3600
        while time.monotonic() < deadline:
            if db.execute("SELECT count(*) FROM spans").fetchone()[0] >= n_spans:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError("Phoenix did not store every span within an hour")
        stored = time.perf_counter() - t
        db.close()
        return {
            "phoenix (SQLite) accepted, wall clock": rate(n_spans, accepted),
            "phoenix (SQLite) durable and queryable, wall clock": rate(n_spans, stored),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)


def cpu_rate(fn, n: int) -> tuple[float, float]:
    """(wall-clock rate, rate per CPU-second of this process) of fn() handling n spans."""
    t, c = time.perf_counter(), time.process_time()
    fn()
    return rate(n, time.perf_counter() - t), rate(n, time.process_time() - c)


def _peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spans", type=int, default=200_000)
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    ap.add_argument("--clients", type=int, default=4, help="concurrent exporting connections")
    ap.add_argument(
        "--quiet-period", type=float, default=None, help="service quiet period (default: settings)"
    )
    ap.add_argument(
        "--also-deferred", action="store_true", help="also run with assembly deferred (ingest only)"
    )
    ap.add_argument("--phoenix", help="path of `phoenix` in its own venv: run it side by side (SQLite)")
    ap.add_argument(
        "--phoenix-spans",
        type=int,
        default=40960,
        help="spans sent to Phoenix, then to railtrace (about 5 minutes for Phoenix; fewer make"
        " railtrace's run too short to time: 10,240 spans take it a third of a second)",
    )
    ap.add_argument(
        "--compare-rounds",
        type=int,
        default=0,
        help="then run end to end this many times each with and without --compare-env, alternately",
    )
    ap.add_argument(
        "--compare-env",
        default=f"{accelerators.PURE_PYTHON_ENV}=1",
        help="KEY=VALUE for the service in the compared runs (default: the C accelerator off)",
    )
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    calls = export_calls(args.spans)
    dbs = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    results: dict[str, float] = {}
    for i, db in enumerate(dbs):
        results.update(ceilings(calls, db, with_cpu=i == 0))
        results.update(end_to_end(calls, db, args.clients, args.quiet_period))
        if args.also_deferred:
            results.update(end_to_end(calls, db, args.clients, 3600.0))
    key, _, value = args.compare_env.partition("=")
    for k in range(1, args.compare_rounds + 1):
        for env in ({key: value}, None):
            for label, figure in end_to_end(calls, dbs[0], args.clients, args.quiet_period, env).items():
                results[f"{label}, round {k}"] = figure
    if args.phoenix:
        phoenix_calls = calls[: max(1, args.phoenix_spans // 512)]
        results.update(phoenix(phoenix_calls, args.phoenix, args.clients))
        # The same first calls through railtrace, back to back, for a like-for-like ratio.
        same = end_to_end(phoenix_calls, "sqlite", args.clients, args.quiet_period)
        ours = next(v for k, v in same.items() if "durable and queryable" in k)
        results["railtrace (SQLite) on the Phoenix payload, durable and queryable, wall clock"] = ours
        results["ratio railtrace / phoenix, durable and queryable"] = (
            ours / results["phoenix (SQLite) durable and queryable, wall clock"]
        )
    meta = {
        "spans": 512 * len(calls),
        "spans_per_call": 512,
        "clients": args.clients,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(f"railtrace ingest benchmark: {meta}")
    print("| measurement | spans/s (or as named) |\n|---|---:|")
    for k, v in results.items():
        print(f"| {k} | {v:,.1f} |" if k.startswith("ratio") else f"| {k} | {v:,.0f} |")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
