"""Scale benchmark: query latency through HTTP over a large history, storage per span, memory.

    .venv/bin/python -m benchmarks.scale.run --db both --requests 10000                 # ~250k spans, HTTP
    .venv/bin/python -m benchmarks.scale.run --db both --requests 400000 --load bulk    # ~10M spans

Load: the simulator's default traffic mix (every scenario, its injected faults, the real
shims and OTel SDK) is captured once for `--base` requests, then replayed as many times as
`--requests` asks. Each copy gets its own trace ids, span ids and request ids (same lengths,
so the protobuf stays valid) and is shifted in time so the whole history spans one day
ending now. `--load http` sends every copy through OTLP/HTTP protobuf into `railtrace serve`
(its own process): group commit, then assembly and verdicts against the simulated fleet's
topology. `--load bulk` puts the same export-call bytes through the same code without HTTP
(`bulk.py`: the receiver's `prepare` and the writer's `Store.insert_batches` in worker
processes, the real `Assembler.run_once` in `--assemblers` processes), which builds the same
database (`tests/scale/test_bulk_load.py`) several times faster.

At each `--checkpoints` share of the load (once every trace is assembled) it measures storage
and the queries through HTTP against `railtrace serve` on the database (one client,
keep-alive): request detail and trace on random requests, the flagged list filtered by flag +
node + one hour at several page depths (keyset cursors followed from page 1, then each depth's
page fetched again), stats by flag over one hour and one day. Reported: p50, p99 and max per
query, bytes per span (SQLite file with its WAL; PostgreSQL relation sizes with indexes and
TOAST) and peak RSS. Not a test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from benchmarks.common.databases import Database
from benchmarks.common.harness import latency_ms, post_all, rss_mb, serve_process, uptime
from benchmarks.scale.bulk import BulkLoad, CopyPlan, dirty_count
from benchmarks.scale.traffic import _retag, capture, copy_calls
from railtrace.store import Store, make_engine
from railtrace.store.schema import requests as requests_table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

DAY_NS = 86_400 * 10**9
HOUR_NS = 3_600 * 10**9
PAGE = 100


def timed(client: httpx.Client, url: str, params: dict[str, Any] | None = None) -> tuple[float, Any]:
    t = time.perf_counter()
    r = client.get(url, params=params)
    elapsed = time.perf_counter() - t
    r.raise_for_status()
    return elapsed, r.json()


def storage(url: str, spans: int) -> dict[str, Any]:
    """Bytes on disk per span. SQLite: the files (with and without the WAL) and the database's
    own size (`page_count`, which counts pages still in the WAL: with a 64 MB checkpoint
    threshold the file alone lags by up to that much). PostgreSQL: every table with its
    indexes and TOAST, and per table."""
    engine = create_engine(url)
    if url.startswith("sqlite"):
        main = Path(make_url(url).database or "")
        files = [main, main.with_name(main.name + "-wal"), main.with_name(main.name + "-shm")]
        total = sum(f.stat().st_size for f in files if f.exists())
        main_size = main.stat().st_size
        with engine.connect() as conn:
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
            free = conn.exec_driver_sql("PRAGMA freelist_count").scalar_one()
            page_size = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
        logical = (pages - free) * page_size
        tables: dict[str, int] = {}
    else:
        with engine.connect() as conn:
            tables = {
                name: int(size)
                for name, size in conn.execute(
                    text(
                        "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
                        "JOIN pg_namespace n ON n.oid = c.relnamespace "
                        "WHERE n.nspname = 'public' AND c.relkind = 'r'"
                    )
                )
            }
        total = main_size = logical = sum(tables.values())
    engine.dispose()
    return {
        "bytes_total": float(total),
        "bytes_per_span": float(total) / spans,
        "bytes_per_span_without_wal": float(main_size) / spans,
        "bytes_per_span_logical": float(logical) / spans,
        "bytes_per_table": tables,
    }


def versions(db_url: str) -> dict[str, str]:
    out = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    out["railtrace_commit"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    changed = subprocess.run(
        ["git", "status", "--short", "--", "api"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    out["uncommitted_service_files"] = ", ".join(changed[1::2])
    if db_url.startswith("postgresql"):
        engine = create_engine(db_url)
        with engine.connect() as conn:
            out["postgresql"] = str(conn.execute(text("SHOW server_version")).scalar_one())
        engine.dispose()
    return out


def run(args: argparse.Namespace, kind: str, save: Any = lambda out: None) -> dict[str, Any]:
    database = Database(kind)
    topo = database.tmp / "topology"
    calls, rids, length_ns = capture(topo, args.base, args.seed)
    plan = CopyPlan(calls, lambda value, tag: _retag(value, rids, tag))
    for k in (0, 1):  # the byte-patched copies are the replay's copies, exactly
        if plan.copy(k, k * 10**9) != copy_calls(calls, rids, k, k * 10**9):
            raise AssertionError("CopyPlan differs from copy_calls")
    copies = max(1, round(args.requests / args.base))
    now = time.time_ns()
    start = now - DAY_NS
    step = max(length_ns, (DAY_NS - length_ns) // copies)
    shifts = [start + k * step for k in range(copies)]

    def end(loaded: int) -> int:
        return shifts[loaded - 1] + length_ns

    marks = sorted({max(1, round(copies * p / 100)) for p in args.checkpoints} | {copies})
    out: dict[str, Any] = {
        "db": kind,
        "load": args.load,
        "requests": copies * args.base,
        "spans": copies * plan.spans,
        "versions": versions(database.url),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "uptime_at_start": uptime(),
        "checkpoints": [],
    }
    print(
        f"{kind}: {copies} copies of {plan.spans:,} spans, checkpoints at {marks} copies; "
        f"database {database.url}, topology {topo}",
        flush=True,
    )
    env = {"RAILTRACE_TOPOLOGY": json.dumps([str(topo)])}
    t0 = time.perf_counter()
    try:
        if args.load == "http":
            with serve_process(database.url, database.tmp, args.quiet_period, env) as (proc, base_url):
                engine = make_engine(database.url)
                done = 0
                for mark in marks:
                    for k in range(done, mark):
                        post_all(base_url, plan.copy(k, shifts[k]), args.clients)
                        if (k + 1) % max(1, copies // 20) == 0:
                            el = time.perf_counter() - t0
                            print(
                                f"  {kind}: {k + 1}/{copies} copies sent ({(k + 1) * plan.spans:,} spans, "
                                f"{el:.0f} s, ETA {el / (k + 1) * (copies - k - 1):.0f} s, "
                                f"RSS {rss_mb(proc.pid):.0f} MB, load {os.getloadavg()[0]:.1f})",
                                flush=True,
                            )
                    done = mark
                    while dirty_count(engine) > 0:
                        time.sleep(1)
                    cp = checkpoint(args, database.url, base_url, mark, plan.spans, args.base, end(mark), t0)
                    cp["peak_rss_mb"] = rss_mb(proc.pid, peak=True)
                    out["checkpoints"].append(cp)
                    save(out)
                engine.dispose()
        else:
            loader = BulkLoad(
                database.url,
                topo,
                plan,
                workers=args.workers,
                assemblers=args.assemblers,
                quiet_period_s=args.quiet_period,
            )
            try:
                done = 0
                for mark in marks:
                    jobs = [(k, shifts[k]) for k in range(done, mark)]
                    complete = loader.load(jobs, copies, kind, deadline=args.deadline)
                    done = loader.copies
                    load_s = time.perf_counter() - t0
                    with serve_process(database.url, database.tmp, args.quiet_period, env) as served:
                        proc, base_url = served
                        cp = checkpoint(
                            args, database.url, base_url, done, plan.spans, args.base, end(done), t0
                        )
                        cp["server_peak_rss_mb"] = rss_mb(proc.pid, peak=True)
                    cp["load_s"] = load_s
                    cp["load_peak_rss_mb"] = loader.peak_rss_mb
                    cp["duplicates"] = loader.duplicates
                    cp["vacuum_analyze_runs"] = loader.vacuums
                    out["checkpoints"].append(cp)
                    save(out)
                    if not complete:
                        break
            finally:
                loader.close()
    finally:
        if args.keep_db:
            print(f"  kept: {database.url}", flush=True)
        else:
            database.drop()
    out["finished_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    return out


def measure_only(args: argparse.Namespace) -> dict[str, Any]:
    """Storage and queries on an existing database (`--db-url`, e.g. one kept by `--keep-db`)."""
    engine = create_engine(args.db_url)
    with engine.connect() as conn:
        end_ns = int(conn.execute(text("SELECT max(start_ns) FROM requests")).scalar_one()) + 1
    engine.dispose()
    env = {"RAILTRACE_TOPOLOGY": json.dumps([args.topology])} if args.topology else {}
    workdir = Path(tempfile.mkdtemp(prefix="railtrace-scale-"))
    out: dict[str, Any] = {"db": args.db_url.split(":", 1)[0], "load": "none (existing database)"}
    out["versions"] = versions(args.db_url)
    with serve_process(args.db_url, workdir, args.quiet_period, env) as (proc, base_url):
        out["checkpoints"] = [checkpoint(args, args.db_url, base_url, 0, 0, 0, end_ns, time.perf_counter())]
        out["checkpoints"][0]["server_peak_rss_mb"] = rss_mb(proc.pid, peak=True)
    return out


def checkpoint(
    args: argparse.Namespace,
    db_url: str,
    base_url: str,
    copies: int,
    spans_per_copy: int,
    requests_per_copy: int,
    now: int,
    t0: float,
) -> dict[str, Any]:
    """Storage and queries over the history loaded so far; `now` is the end of that history
    (one-hour and one-day windows end there)."""
    spans = copies * spans_per_copy
    engine = create_engine(db_url)
    stored_spans = Store(engine).count_spans()
    with engine.connect() as conn:
        # Real requests only: rows added by inflate.py ("x" ids) have no spans.
        ids = [
            r[0]
            for r in conn.execute(
                select(requests_table.c.trace_id).where(requests_table.c.trace_id.not_like("x%"))
            )
        ]
        flagged = conn.execute(text("SELECT count(DISTINCT trace_id) FROM request_flags")).scalar_one()
        rows = conn.execute(
            text(
                "SELECT f.flag, f.start_ns, r.prefill_node, r.decode_node FROM request_flags f "
                "JOIN requests r ON r.trace_id = f.trace_id"
            )
        ).all()
    engine.dispose()
    cp: dict[str, Any] = {
        "copies": copies,
        "spans": spans,
        "spans_stored": stored_spans,
        "requests_sent": copies * requests_per_copy,
        "requests_stored": len(ids),
        "flagged_share": flagged / max(1, len(ids)),
        "elapsed_s": time.perf_counter() - t0,
        "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "uptime": uptime(),
        "storage": storage(db_url, stored_spans),
    }
    if spans and stored_spans != spans:
        print(f"  warning: {stored_spans} spans stored for {spans} sent", flush=True)
    # The flag + node filter: the pair with the most requests in a one-hour window (node matches
    # either side, as the API's `node` filter does), windows aligned on `now`.
    per_hour: Counter[tuple[str, str, int]] = Counter()
    for flag, start_ns, pnode, dnode in rows:
        hour = (now - start_ns) // HOUR_NS
        for node in {pnode, dnode} - {None}:
            per_hour[(flag, node, hour)] += 1
    cp["queries"] = queries(base_url, ids, per_hour, now, args)
    size = cp["storage"]
    print(
        f"  checkpoint {copies} copies ({stored_spans:,} spans, {len(ids):,} requests): "
        f"{size['bytes_per_span_logical']:.0f} bytes/span ({size['bytes_per_span']:.0f} on disk "
        f"with any WAL), {cp['uptime']}",
        flush=True,
    )
    for q, p in cp["queries"].items():
        if isinstance(p, dict) and "p50_ms" in p:
            print(f"    {q}: p50 {p['p50_ms']:.1f} ms, p99 {p['p99_ms']:.1f} ms, max {p['max_ms']:.1f} ms")
    return cp


def iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat()


def with_cursor(params: dict[str, Any], cursor: str | None) -> dict[str, Any]:
    return {**params, "cursor": cursor} if cursor else params


def queries(
    base: str, ids: list[str], per_hour: Counter[tuple[str, str, int]], now: int, args: argparse.Namespace
) -> dict[str, Any]:
    rng = random.Random(args.seed)
    res: dict[str, list[float]] = {}
    out: dict[str, Any] = {}
    with httpx.Client(base_url=base, timeout=120) as client:
        timed(client, "/api/v1/stats", {"group_by": "flag", "since": iso(now - HOUR_NS)})  # warm the route
        for _ in range(args.queries):
            tid = rng.choice(ids)
            res.setdefault("request detail", []).append(timed(client, f"/api/v1/requests/{tid}")[0])
            res.setdefault("trace", []).append(timed(client, f"/api/v1/traces/{tid}")[0])
        if per_hour:
            pairs: Counter[tuple[str, str]] = Counter()
            for (flag, node, _), n in per_hour.items():
                pairs[(flag, node)] = max(pairs[(flag, node)], n)
            (flag, node), _ = pairs.most_common(1)[0]
            hours = sorted(
                (h for (f, n, h), c in per_hour.items() if (f, n) == (flag, node) and 0 <= h < 24),
                key=lambda h: -per_hour[(flag, node, h)],
            )[: args.list_hours]
            out["list filter"] = {
                "flag": flag,
                "node": node,
                "requests_in_hours": [per_hour[(flag, node, h)] for h in hours],
            }
            # Walk each hour's pages once, keeping the cursor of every depth asked for.
            cursors: dict[int, list[tuple[dict[str, Any], str | None]]] = {}
            for h in hours:
                params = {
                    "flag": flag,
                    "node": node,
                    "since": iso(now - (h + 1) * HOUR_NS),
                    "until": iso(now - h * HOUR_NS),
                    "limit": PAGE,
                }
                cursor: str | None = None
                depth = 1
                ended = False
                while depth <= max(args.depths):
                    if depth in args.depths:
                        cursors.setdefault(depth, []).append((params, cursor))
                    _, page = timed(client, "/api/v1/requests", with_cursor(params, cursor))
                    if not page.get("next_cursor"):
                        ended = True
                        break
                    cursor = page["next_cursor"]
                    depth += 1
                if ended and h == hours[0] and depth not in cursors:  # the deepest page the data allows
                    cursors[depth] = [(params, cursor)]
            for depth in sorted(cursors):
                got = cursors[depth]
                for i in range(args.list_queries):
                    params, cursor = got[i % len(got)]
                    el, page = timed(client, "/api/v1/requests", with_cursor(params, cursor))
                    res.setdefault(f"flag+node+1h list, page {depth}", []).append(el)
                    if not page.get("items"):
                        raise AssertionError(f"page {depth} is empty")
            out["list filter"]["deepest_page"] = max(cursors) if cursors else 0
        for _ in range(args.stats_queries):
            res.setdefault("stats by flag, 1 hour", []).append(
                timed(
                    client,
                    "/api/v1/stats",
                    {"group_by": "flag", "since": iso(now - HOUR_NS), "until": iso(now)},
                )[0]
            )
            res.setdefault("stats by flag, 1 day", []).append(
                timed(
                    client,
                    "/api/v1/stats",
                    {"group_by": "flag", "since": iso(now - DAY_NS), "until": iso(now)},
                )[0]
            )
    out.update({k: latency_ms(v) for k, v in res.items()})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    ap.add_argument("--load", choices=["http", "bulk"], default="http")
    ap.add_argument("--requests", type=int, default=25_000)
    ap.add_argument("--base", type=int, default=500, help="simulated requests captured once and replayed")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--clients", type=int, default=4, help="--load http: client threads")
    ap.add_argument("--workers", type=int, default=1, help="--load bulk: insert processes")
    ap.add_argument("--assemblers", type=int, default=2, help="--load bulk: assembler processes")
    ap.add_argument("--checkpoints", default="100", help="percent of the load after which to measure")
    ap.add_argument("--queries", type=int, default=300, help="detail and trace queries per checkpoint")
    ap.add_argument("--depths", default="1,10,50,100", help="list pages measured (as deep as data allows)")
    ap.add_argument("--list-hours", type=int, default=6, help="one-hour windows the list queries use")
    ap.add_argument("--list-queries", type=int, default=200, help="list queries per depth")
    ap.add_argument("--stats-queries", type=int, default=30)
    ap.add_argument("--quiet-period", type=float, default=2.0)
    ap.add_argument("--keep-db", action="store_true", help="do not drop the database at the end")
    ap.add_argument("--deadline", help="HH:MM UTC: load no further copies after this, measure what is loaded")
    ap.add_argument("--db-url", help="only measure this existing database (no load)")
    ap.add_argument("--topology", help="with --db-url: the topology folder for the server")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.checkpoints = [float(p) for p in args.checkpoints.split(",")]
    args.depths = sorted({int(d) for d in args.depths.split(",")})
    if args.deadline:
        hh, mm = (int(x) for x in args.deadline.split(":"))
        today = datetime.now(UTC).replace(hour=hh, minute=mm, second=0, microsecond=0)
        args.deadline = today.timestamp()
    kinds = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    results: list[dict[str, Any]] = []
    if args.db_url:
        kinds = []
        results.append(measure_only(args))
    for kind in kinds:

        def save(out: dict[str, Any]) -> None:
            if args.json:
                args.json.write_text(json.dumps({"command": sys.argv, "results": [*results, out]}, indent=2))

        results.append(run(args, kind, save))
    if args.json:
        args.json.write_text(json.dumps({"command": sys.argv, "results": results}, indent=2))
    for r in results:
        print(f"\n{r['db']} ({r['load']}): {r.get('spans', 0):,} spans planned, {r['versions']}")
        for cp in r["checkpoints"]:
            print(
                f"\n{cp['spans_stored']:,} spans ({cp['requests_stored']:,} requests stored), "
                f"{cp['storage']['bytes_per_span_logical']:.0f} bytes/span, "
                f"at {cp['utc']} UTC; {cp['uptime']}"
            )
            print("| query | p50 ms | p99 ms | max ms | n |\n|---|---:|---:|---:|---:|")
            for q, p in cp["queries"].items():
                if isinstance(p, dict) and "p50_ms" in p:
                    cells = f"{p['p50_ms']:.1f} | {p['p99_ms']:.1f} | {p['max_ms']:.1f} | {p['n']:.0f}"
                    print(f"| {q} | {cells} |")
            if "list filter" in cp["queries"]:
                print(f"list filter: {cp['queries']['list filter']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
