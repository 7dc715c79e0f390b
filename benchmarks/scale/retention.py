"""Retention under load: does deleting old history in bounded batches stall ingest?

    .venv/bin/python -m benchmarks.scale.retention --db both --history-requests 20000
    .venv/bin/python -m benchmarks.scale.retention --db-url URL --topology DIR   # a kept database

History: the simulator's traffic mix loaded with the scale benchmark's bulk path (ingest and
assembly, so every trace has its spans, keys, request row and flags), or an existing database
(`run.py --keep-db`). Its oldest `--expire-share` of traces is then aged: their arrival times
(`traces.first_arrival_ns`/`last_arrival_ns`, which retention reads) are moved back 72 hours,
as if that part had been received three days ago; the next `--expire-share` is moved back 36
hours. Nothing else changes.

Three phases of `--seconds` each, every one with `--clients` OTLP/HTTP clients posting the
ingest benchmark's 512-span export calls (`benchmarks/common/payload.py`) on a fixed schedule
at `--rate` spans/s into `railtrace serve`:

1. baseline: retention off;
2. server retention: `RAILTRACE_RETENTION_HOURS=48`, so the service's own assembler loop runs
   `apply_retention` at start and deletes the 72-hour-old part batch after batch
   (`Store.delete_older_than`, 500 traces per transaction) while the clients ingest; the
   benchmark counts what is left every few seconds;
3. timed batches: retention off in the server; this process calls the same
   `Store.delete_older_than` on the 36-hour-old part in a loop, timing every batch, while the
   clients ingest.

Reported per phase: export-call latency p50/p99/max, acknowledged spans per second, 429s, and
that every acknowledged span is stored; for phases 2 and 3 the traces deleted, the delete
batch size and per-batch duration.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from benchmarks.common.databases import Database
from benchmarks.common.harness import PROTOBUF, export, latency_ms, serve_process, uptime
from benchmarks.common.payload import export_calls
from benchmarks.scale.bulk import BulkLoad, CopyPlan, dirty_count
from benchmarks.scale.traffic import _retag, capture
from railtrace.store import Store, make_engine

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

HOUR_NS = 3_600 * 10**9
DELETE_BATCH = 500  # Store.delete_older_than's default, which apply_retention uses


def paced_post(base: str, calls: list[bytes], rate_spans: float, clients: int) -> dict[str, Any]:
    """Post `calls` on a fixed schedule (open loop: call i is due at i / calls-per-second);
    each call's latency runs from its send to its acknowledgement, 429/503 retried."""
    per_s = rate_spans / 512
    nxt = [0]
    lock = threading.Lock()
    latencies: list[float] = []
    lateness: list[float] = []
    throttled = [0]
    errors: list[str] = []
    t0 = time.perf_counter() + 0.5

    def worker() -> None:
        with httpx.Client(base_url=base, timeout=300, headers={"content-type": PROTOBUF}) as client:
            while True:
                with lock:
                    i = nxt[0]
                    if i >= len(calls):
                        return
                    nxt[0] += 1
                due = t0 + i / per_s
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                sent = time.perf_counter()
                try:
                    n = export(client, calls[i])
                except RuntimeError as exc:
                    errors.append(str(exc))
                    return
                done = time.perf_counter()
                with lock:
                    throttled[0] += n
                    latencies.append(done - sent)
                    lateness.append(max(0.0, sent - due))

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"export failed: {errors[:3]}")
    return {
        "calls": len(calls),
        "spans": 512 * len(calls),
        "seconds": elapsed,
        "acked_spans_per_s": 512 * len(latencies) / elapsed,
        "throttled": throttled[0],
        "export_latency": latency_ms(latencies),
        "send_behind_schedule_max_s": max(lateness, default=0.0),
    }


def stored(url: str, calls: list[bytes]) -> int:
    """Spans of these calls found in the database."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    ids = sorted(
        {
            s.trace_id.hex()
            for c in calls
            for rs in ExportTraceServiceRequest.FromString(c).resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
        }
    )
    engine = make_engine(url)
    n = 0
    with engine.connect() as conn:
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            marks = ", ".join(f"'{t}'" for t in chunk)
            sql = f"SELECT sum(span_count) FROM span_chunks WHERE trace_id IN ({marks})"
            n += conn.execute(text(sql)).scalar_one() or 0
    engine.dispose()
    return n


def older_than(url: str, cutoff_ns: int) -> int:
    engine = make_engine(url)
    with engine.connect() as conn:
        n = conn.execute(
            text("SELECT count(*) FROM traces WHERE last_arrival_ns < :c"), {"c": cutoff_ns}
        ).scalar_one()
    engine.dispose()
    return int(n)


def counts(url: str) -> dict[str, int]:
    engine = make_engine(url)
    with engine.connect() as conn:
        out = {
            t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one())
            for t in ("spans", "traces", "requests", "request_flags", "trace_keys")
        }
    engine.dispose()
    return out


def age(url: str, share: float) -> dict[str, int]:
    """Move the oldest `share` of traces back 72 h and the next `share` back 36 h."""
    engine = make_engine(url)
    with engine.begin() as conn:
        total = conn.execute(text("SELECT count(*) FROM traces")).scalar_one()
        n = int(total * share)
        ids = [
            r[0] for r in conn.execute(text("SELECT trace_id FROM traces ORDER BY last_arrival_ns, trace_id"))
        ]
        for hours, part in ((72, ids[:n]), (36, ids[n : 2 * n])):
            shift = hours * HOUR_NS
            for i in range(0, len(part), 1000):
                conn.execute(
                    text(
                        "UPDATE traces SET first_arrival_ns = first_arrival_ns - :s,"
                        " last_arrival_ns = last_arrival_ns - :s WHERE trace_id = :t"
                    ),
                    [{"s": shift, "t": t} for t in part[i : i + 1000]],
                )
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM (ANALYZE) traces")
    engine.dispose()
    return {"traces": int(total), "aged_72h": n, "aged_36h": min(n, int(total) - n)}


def build_history(db: Database, topo: Path, requests: int, base: int, seed: int) -> dict[str, Any]:
    calls, rids, length_ns = capture(topo, base, seed)
    plan = CopyPlan(calls, lambda value, tag: _retag(value, rids, tag))
    copies = max(1, round(requests / base))
    now = time.time_ns()
    step = max(length_ns, (24 * HOUR_NS - length_ns) // copies)
    loader = BulkLoad(db.url, topo, plan, workers=1, assemblers=2, quiet_period_s=2.0)
    t0 = time.perf_counter()
    try:
        loader.load([(k, now - 24 * HOUR_NS + k * step) for k in range(copies)], copies, f"{db.kind} history")
    finally:
        loader.close()
    return {"copies": copies, "spans": copies * plan.spans, "load_s": time.perf_counter() - t0}


def phase(
    label: str,
    url: str,
    cwd: Path,
    env: dict[str, str],
    calls: list[bytes],
    args: argparse.Namespace,
    during: Any = None,
) -> dict[str, Any]:
    print(f"  {label}: {len(calls) * 512:,} spans at {args.rate:,.0f}/s; {uptime()}", flush=True)
    out: dict[str, Any] = {
        "phase": label,
        "utc": time.strftime("%H:%M:%S", time.gmtime()),
        "uptime": uptime(),
    }
    with serve_process(url, cwd, 2.0, env) as (_, base):
        side: dict[str, Any] = {}
        stop = threading.Event()
        th = threading.Thread(target=during, args=(stop, side)) if during else None
        if th:
            th.start()
        try:
            out["ingest"] = paced_post(base, calls, args.rate, args.clients)
            # Retention runs in the assembler's loop: a backlog here means assembly waited for it.
            engine = make_engine(url)
            out["waiting_for_assembly_at_end"] = dirty_count(engine)
            engine.dispose()
        finally:
            stop.set()
            if th:
                th.join()
        out.update(side)
    out["acked_spans_stored"] = stored(url, calls)
    out["every_acked_span_stored"] = out["acked_spans_stored"] == len(calls) * 512
    ing = out["ingest"]
    lat = ing["export_latency"]
    print(
        f"    {ing['acked_spans_per_s']:,.0f} spans/s acknowledged, "
        f"export latency p50 {lat['p50_ms']:.0f} ms "
        f"p99 {lat['p99_ms']:.0f} ms max {lat['max_ms']:.0f} ms, {ing['throttled']} throttled, "
        f"all acknowledged spans stored: {out['every_acked_span_stored']}, "
        f"{out['waiting_for_assembly_at_end']:,} traces waiting for assembly at the end",
        flush=True,
    )
    return out


def run(args: argparse.Namespace, kind: str | None) -> dict[str, Any]:
    db: Database | None = None
    if args.db_url:
        url, cwd, topo = args.db_url, Path(args.workdir), Path(args.topology) if args.topology else None
        cwd.mkdir(parents=True, exist_ok=True)
        history: dict[str, Any] = {"given": True}
    else:
        db = Database(kind or "sqlite")
        url, cwd, topo = db.url, db.tmp, db.tmp / "topology"
        history = build_history(db, topo, args.history_requests, args.base, args.seed)
    out: dict[str, Any] = {"db": url.split(":", 1)[0], "history": history, "phases": []}
    try:
        out["history"]["before"] = counts(url)
        out["aged"] = "before this run" if args.already_aged else age(url, args.expire_share)
        env = {"RAILTRACE_TOPOLOGY": json.dumps([str(topo)])} if topo else {}
        n_calls = max(1, int(args.rate * args.seconds / 512))
        calls = export_calls(n_calls * 512 * 3, 512, seed=args.seed)
        parts = [calls[i * n_calls : (i + 1) * n_calls] for i in range(3)]

        out["phases"].append(
            phase(
                "baseline, retention off", url, cwd, {**env, "RAILTRACE_RETENTION_HOURS": "0"}, parts[0], args
            )
        )

        cutoff72 = time.time_ns() - 48 * HOUR_NS

        def watch(stop: threading.Event, side: dict[str, Any]) -> None:
            t0 = time.perf_counter()
            first = older_than(url, cutoff72)
            samples = [(0.0, first)]
            while not stop.wait(2):
                samples.append((time.perf_counter() - t0, older_than(url, cutoff72)))
            samples.append((time.perf_counter() - t0, older_than(url, cutoff72)))
            gone = first - samples[-1][1]
            busy = next((t for t, n in samples if n == 0), samples[-1][0])
            side["retention"] = {
                "expired_traces_at_start": first,
                "deleted_traces": gone,
                "batch_traces": DELETE_BATCH,
                "deleting_s": busy,
                "mean_batch_s": busy / max(1, gone / DELETE_BATCH) if gone else None,
                "remaining_samples": samples,
            }

        out["phases"].append(
            phase(
                "server retention deleting (48 h)",
                url,
                cwd,
                {**env, "RAILTRACE_RETENTION_HOURS": "48"},
                parts[1],
                args,
                watch,
            )
        )

        def timed_deletes(stop: threading.Event, side: dict[str, Any]) -> None:
            engine = make_engine(url)
            store = Store(engine)
            cutoff = time.time_ns() - 24 * HOUR_NS
            times: list[float] = []
            deleted = 0
            while not stop.is_set():
                t = time.perf_counter()
                n = store.delete_older_than(cutoff)
                if n == 0:
                    break
                times.append(time.perf_counter() - t)
                deleted += n
            engine.dispose()
            side["retention"] = {
                "deleted_traces": deleted,
                "batch_traces": DELETE_BATCH,
                "batches": len(times),
                "batch_duration": latency_ms(times),
                "deleting_s": sum(times),
            }

        out["phases"].append(
            phase(
                "timed delete batches (24 h), retention off in the server",
                url,
                cwd,
                {**env, "RAILTRACE_RETENTION_HOURS": "0"},
                parts[2],
                args,
                timed_deletes,
            )
        )
        out["history"]["after"] = counts(url)
    finally:
        if db is not None:
            db.drop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    ap.add_argument("--db-url", help="use this database (history already in it) instead of building one")
    ap.add_argument("--topology", help="with --db-url: the topology folder its history was judged against")
    ap.add_argument("--workdir", default=".", help="with --db-url: where the server's log goes")
    ap.add_argument("--history-requests", type=int, default=20_000)
    ap.add_argument("--base", type=int, default=500)
    ap.add_argument("--expire-share", type=float, default=0.4, help="share aged 72 h (and again 36 h)")
    ap.add_argument("--already-aged", action="store_true", help="the history was aged by an earlier run")
    ap.add_argument("--rate", type=float, default=1500.0, help="ingest rate, spans per second")
    ap.add_argument("--seconds", type=float, default=60.0, help="ingest per phase")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    kinds: list[str | None] = (
        [None] if args.db_url else (["sqlite", "postgresql"] if args.db == "both" else [args.db])
    )
    results = []
    for kind in kinds:
        results.append(run(args, kind))
        if args.json:
            args.json.write_text(json.dumps({"command": sys.argv, "results": results}, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
