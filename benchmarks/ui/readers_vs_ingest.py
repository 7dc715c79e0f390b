"""Ingest with and without concurrent web UI readers: what readers take from ingest.

    .venv/bin/python -m benchmarks.ui.readers_vs_ingest [--db sqlite|postgresql|both]
        [--readers 200] [--spans 102400] [--rounds 3] [--serve-env KEY=VALUE ...]

`railtrace serve` runs as its own process on 127.0.0.1 and free ports, on a throwaway
database that is first seeded (`--seed-spans`, assembled into request summaries so that every
page has data), then restarted with assembly deferred so that the runs measure ingest alone,
like `benchmarks/ingest`. Each round posts fresh export calls (512 spans each, 4 client
threads, retries after `Retry-After`) twice: alone, then while `--readers` readers, in a
process of their own (one asyncio loop, httpx), visit the UI's pages the way the browser does:
the page shell, then the page's `/api/v1` calls at once (overview: the stats; request list;
one request: its summary and its trace). A reader answered 429/503 waits `Retry-After` before
its next visit. The table gives each run's ingest rate, the ratio of the with-readers rate to
the solo rate of the same round, and what the readers got (answers per status, latency).
Loopback only; each run is bounded by its span count and `--reader-seconds`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import ssl
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine

from benchmarks.common.databases import Database
from benchmarks.common.harness import cpu_seconds, latency_ms, post_all, serve_process, uptime
from benchmarks.common.payload import export_calls
from railtrace.store import Store

SPANS_PER_CALL = 512

# The UI's pages and the API calls each makes (api/railtrace/server/ui/static/js/*.js), weighted
# by how often a user looking into slow requests opens them.
PAGES: tuple[tuple[str, float], ...] = (("overview", 0.2), ("list", 0.4), ("request", 0.4))


def page_calls(page: str, ids: list[str], rng: random.Random) -> tuple[str, list[str]]:
    """(page shell path, API paths fetched at once) of one visit."""
    if page == "overview":
        since = int(time.time()) - 3600
        return "/", [f"/api/v1/stats?group_by={g}" for g in ("path_class", "flag", "pair")] + [
            "/api/v1/stats/ttft",
            f"/api/v1/stats/timeseries?since={since}&buckets=60",
            "/readyz",
        ]
    if page == "list":
        query = rng.choice(("limit=50", "limit=50&order=ttft", "limit=50&path_class=unknown", "limit=200"))
        return "/requests", [f"/api/v1/requests?{query}", "/api/v1/stats?group_by=path_class"]
    tid = rng.choice(ids)
    return f"/requests/{tid}", [f"/api/v1/requests/{tid}", f"/api/v1/traces/{tid}"]


async def _reader(
    client: httpx.AsyncClient, ids: list[str], seed: int, stop: asyncio.Event, out: dict[str, Any]
) -> None:
    """One browser tab until `stop`."""
    rng = random.Random(seed)
    names, weights = zip(*PAGES, strict=True)
    async with client:
        while not stop.is_set():
            shell, calls = page_calls(rng.choices(names, weights)[0], ids, rng)
            wait = 0.0
            for batch in ([shell], calls):
                t0 = time.perf_counter()
                try:
                    answers = await asyncio.gather(*(client.get(p) for p in batch))
                except httpx.HTTPError as exc:
                    out["errors"][type(exc).__name__] = out["errors"].get(type(exc).__name__, 0) + 1
                    wait = 1.0
                    break
                took = time.perf_counter() - t0
                for r in answers:
                    out["status"][str(r.status_code)] = out["status"].get(str(r.status_code), 0) + 1
                    out["answered_at"].append(time.time())
                    if r.status_code in (429, 503):
                        wait = max(wait, float(r.headers.get("retry-after", "1")))
                if batch is calls:
                    out["visit_s"].append(took)
                if wait:
                    break
            if wait:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)


async def _readers(base: str, ids: list[str], n: int, seconds: float) -> dict[str, Any]:
    """`n` readers until a line arrives on stdin (or `seconds`); their answers and latencies."""
    out: dict[str, Any] = {"status": {}, "errors": {}, "visit_s": [], "answered_at": []}
    stop, told = asyncio.Event(), asyncio.Event()
    # A client per reader with as many connections as a page opens at once (one client's pool of
    # 1,000 connections cost the reader process a core by itself), made before the clock starts
    # and sharing one TLS context (each client would build its own: ~50 ms of CPU apiece).
    tls = ssl.create_default_context()
    limits = httpx.Limits(max_connections=6, max_keepalive_connections=6)
    clients = [httpx.AsyncClient(base_url=base, timeout=120, limits=limits, verify=tls) for _ in range(n)]
    tasks = [asyncio.create_task(_reader(c, ids, i, stop, out)) for i, c in enumerate(clients)]
    loop = asyncio.get_running_loop()
    # A daemon thread: a blocked read must not hold up the loop's shutdown.
    threading.Thread(
        target=lambda: (sys.stdin.readline(), loop.call_soon_threadsafe(told.set)), daemon=True
    ).start()
    print("ready", flush=True)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(told.wait(), seconds)
    t_stop = time.perf_counter()
    stop.set()
    await asyncio.wait(tasks, timeout=150)
    out["drain_s"] = time.perf_counter() - t_stop
    return out


def reader_child(args: argparse.Namespace) -> int:
    ids = json.loads(Path(args.ids).read_text())
    out = asyncio.run(_readers(args.base, ids, args.readers, args.reader_seconds))
    visits = out.pop("visit_s")
    out["visits"] = latency_ms(visits)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["reader_cpu_s"] = usage.ru_utime + usage.ru_stime
    print(json.dumps(out), flush=True)
    return 0


class Readers:
    """The reader process: started, ready once its readers run, stopped and read out."""

    def __init__(self, base: str, ids_file: Path, n: int, seconds: float) -> None:
        cmd = [sys.executable, "-m", "benchmarks.ui.readers_vs_ingest", "--reader-child", base]
        cmd += ["--ids", str(ids_file), "--readers", str(n), "--reader-seconds", str(seconds)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.proc.kill()
            raise RuntimeError("reader process did not start")

    def stop(self) -> dict[str, Any]:
        out, _ = self.proc.communicate("stop\n", timeout=300)
        return json.loads(out.strip().splitlines()[-1])


def seed(database: Database, calls: list[bytes], timeout_s: float = 300) -> list[str]:
    """Ingest `calls` with assembly on, wait (bounded) for the summaries; trace ids of requests."""
    with serve_process(database.url, database.tmp, quiet_period=0.5) as (_proc, base):
        post_all(base, calls, 4)
        engine = create_engine(database.url)
        store = Store(engine)
        deadline = time.monotonic() + timeout_s
        while store.count_dirty() and time.monotonic() < deadline:
            time.sleep(0.5)
        engine.dispose()
        page = httpx.get(base + "/api/v1/requests?limit=1000", timeout=60).json()
    ids = [item["trace_id"] for item in page["items"]]
    if not ids:
        raise RuntimeError("seeding assembled no request")
    return ids


def _env(pairs: list[str]) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in pairs)


def run(args: argparse.Namespace, kind: str) -> list[dict[str, Any]]:
    """Alternating solo / with-readers runs; with `--compare-env`, a second service with that
    environment takes its solo / with-readers turn after the first in every round. One row per run."""
    n_calls = max(1, args.spans // SPANS_PER_CALL)
    seed_calls = export_calls(args.seed_spans, seed=1000)
    configs = [("default" if not args.serve_env else " ".join(args.serve_env), _env(args.serve_env))]
    if args.compare_env:
        configs.append((" ".join(args.compare_env), _env(args.compare_env)))
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        services = []
        for label, env in configs:
            database = Database(kind)
            stack.callback(database.drop)
            ids_file = database.tmp / "ids.json"
            ids_file.write_text(json.dumps(seed(database, seed_calls)))
            proc, base = stack.enter_context(
                serve_process(database.url, database.tmp, quiet_period=3600, extra_env=env)
            )
            post_all(base, export_calls(4 * SPANS_PER_CALL, seed=999), 4)  # warm-up
            services.append((label, proc, base, ids_file))
        for r in range(args.rounds):
            for label, proc, base, ids_file in services:
                for with_readers in (False, True):
                    # Fresh trace ids for every run: a body stored already would cost less. Made
                    # before the run's clock starts, the same calls for every service.
                    calls = export_calls(n_calls * SPANS_PER_CALL, seed=1 + 2 * r + with_readers)
                    row = _one_run(args, kind, label, r + 1, proc, base, ids_file, calls, with_readers)
                    if with_readers:
                        row["ratio"] = row["spans_per_s"] / rows[-1]["spans_per_s"]
                    rows.append(row)
                    print(_line(row), flush=True)
                    time.sleep(args.pause)
    return rows


def _one_run(
    args: argparse.Namespace,
    kind: str,
    label: str,
    round_: int,
    proc: subprocess.Popen[bytes],
    base: str,
    ids_file: Path,
    calls: list[bytes],
    with_readers: bool,
) -> dict[str, Any]:
    readers = Readers(base, ids_file, args.readers, args.reader_seconds) if with_readers else None
    if readers is not None:
        time.sleep(args.reader_warmup)
    cpu0, load = cpu_seconds(proc.pid), uptime().split("load average:")[-1].strip()
    t0 = time.time()
    elapsed, retries = post_all(base, calls, args.clients)
    cpu = cpu_seconds(proc.pid) - cpu0
    got = readers.stop() if readers is not None else {}
    # Reads answered while the exports ran (the readers start `reader_warmup` earlier).
    answered = got.pop("answered_at", [])
    if readers is not None:
        got["reads_per_s_ingesting"] = sum(t0 <= t <= t0 + elapsed for t in answered) / elapsed
    spans = len(calls) * SPANS_PER_CALL
    return {
        "db": kind,
        "service": label,
        "round": round_,
        "mode": "readers" if with_readers else "solo",
        "spans_per_s": spans / elapsed,
        "per_cpu_s": spans / cpu if cpu else 0.0,
        "ingest_retries": retries,
        "load": load,
        **got,
    }


def _line(row: dict[str, Any]) -> str:
    reads = ""
    if row["mode"] == "readers":
        visits = row.get("visits", {})
        status = ", ".join(f"{k}: {v}" for k, v in sorted(row.get("status", {}).items()))
        reads = (
            f" | ratio {row['ratio']:.0%} | reads {status or '-'}"
            f" ({row.get('reads_per_s_ingesting', 0):.0f}/s while ingesting)"
            f"{' errors ' + str(row['errors']) if row.get('errors') else ''}"
            f" | visit p50 {visits.get('p50_ms', 0):.0f} ms p99 {visits.get('p99_ms', 0):.0f} ms"
            f" | readers drained in {row.get('drain_s', 0):.1f} s"
        )
    return (
        f"{row['db']} [{row['service']}] round {row['round']} {row['mode']:<7}"
        f" {row['spans_per_s']:>9,.0f} spans/s"
        f" ({row['per_cpu_s']:,.0f}/server CPU-s, {row['ingest_retries']} retries, load {row['load']}){reads}"
    )


def summary(rows: list[dict[str, Any]]) -> str:
    lines = [
        "",
        "| db | service | round | solo spans/s | with readers spans/s | ratio | reads 200 / 503"
        " | reads/s while ingesting | visit p50 / p99 ms |",
    ]
    lines.append("|---|---|---:|---:|---:|---:|---|---:|---|")
    for solo, with_readers in zip(rows[::2], rows[1::2], strict=True):
        status = with_readers.get("status", {})
        visits = with_readers.get("visits", {})
        lines.append(
            f"| {solo['db']} | {solo['service']} | {solo['round']} | {solo['spans_per_s']:,.0f}"
            f" | {with_readers['spans_per_s']:,.0f} | {with_readers['ratio']:.0%}"
            f" | {status.get('200', 0):,} / {status.get('503', 0):,}"
            f" | {with_readers.get('reads_per_s_ingesting', 0):,.0f}"
            f" | {visits.get('p50_ms', 0):,.0f} / {visits.get('p99_ms', 0):,.0f} |"
        )
    for db, service in dict.fromkeys((r["db"], r["service"]) for r in rows):
        ratios = [
            r["ratio"] for r in rows if r["mode"] == "readers" and (r["db"], r["service"]) == (db, service)
        ]
        lines.append(
            f"{db} [{service}]: ratio median {statistics.median(ratios):.0%},"
            f" range {min(ratios):.0%}-{max(ratios):.0%} over {len(ratios)} rounds"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="sqlite")
    p.add_argument("--readers", type=int, default=200)
    p.add_argument("--spans", type=int, default=102_400, help="spans posted per run")
    p.add_argument("--seed-spans", type=int, default=20_480, help="history the pages read")
    p.add_argument("--rounds", type=int, default=3, help="solo + with-readers pairs per service")
    p.add_argument("--clients", type=int, default=4, help="ingest client threads")
    p.add_argument("--reader-seconds", type=float, default=120, help="longest a reader process runs")
    p.add_argument("--reader-warmup", type=float, default=2.0, help="readers' head start, seconds")
    p.add_argument("--pause", type=float, default=2.0, help="seconds between runs")
    p.add_argument("--serve-env", action="append", default=[], help="KEY=VALUE for the service")
    p.add_argument(
        "--compare-env",
        action="append",
        default=[],
        help="KEY=VALUE for a second service, measured in turn with the first in every round",
    )
    p.add_argument("--json", type=Path)
    p.add_argument("--reader-child", metavar="BASE", help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.reader_child:
        args.base = args.reader_child
        return reader_child(args)
    print(
        f"{uptime()}; {os.cpu_count()} CPUs; {args.readers} readers; {args.spans:,} spans per run", flush=True
    )
    rows: list[dict[str, Any]] = []
    for kind in ("sqlite", "postgresql") if args.db == "both" else (args.db,):
        rows += run(args, kind)
    print(summary(rows))
    print(uptime())
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
