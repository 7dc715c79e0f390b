"""Scale benchmark: query latency through HTTP over a large history, storage per span, memory.

    .venv/bin/python benchmarks/scale/run.py --db sqlite --requests 25000
    .venv/bin/python benchmarks/scale/run.py --db postgresql --requests 1250000   # ~10M spans

Load: the simulator's default traffic mix (every scenario, its injected faults, the real
shims and OTel SDK) is captured once for `--base` requests, then replayed as many times as
`--requests` asks. Each copy gets its own trace ids, span ids and request ids (same lengths,
so the protobuf stays valid) and is shifted in time so the whole history spans one day
ending now. Every copy goes through the real ingest path: OTLP/HTTP protobuf into `railtrace
serve` (its own process), group commit, then assembly and verdicts against the simulated
fleet's topology. The clock for queries starts once every request is assembled.

Queries (HTTP, one client, keep-alive), each repeated `--queries` times on random requests:
request detail, trace, the flagged list filtered by flag + node + a one-hour window (first
page of 100, and page `--depth` reached by following cursors), stats by flag over one hour
and over one day. Reported: p50, p99 and max per query. Also storage bytes per span (SQLite
file with its WAL; PostgreSQL relation sizes with indexes and TOAST) and the server's peak
RSS. Not a test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from sqlalchemy import create_engine, func, select, text

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "ingest"))
from harness import post_all, rss_mb, serve_process  # noqa: E402
from run import Database  # noqa: E402

from railtrace.simulator import Emitter, Processes, build_fleet, resolve, simulate  # noqa: E402
from railtrace.store.schema import requests as requests_table  # noqa: E402
from railtrace.store.schema import traces as traces_table  # noqa: E402

DAY_NS = 86_400 * 10**9
HOUR_NS = 3_600 * 10**9
SPANS_PER_CALL = 512


class _Capture(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.lock:
            self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def capture(topo_dir: Path, base: int, seed: int) -> tuple[list[bytes], list[str], int]:
    """The base traffic as export calls of up to 512 spans, its request ids, and its length in ns."""
    scenarios = resolve(None)
    fleet = build_fleet("a3-ultra", scenarios, seed)
    fleet.write(topo_dir)
    runs = simulate(fleet, scenarios, base, seed)
    sink = _Capture()
    procs = Processes(lambda: sink, seed)
    length_ns = int((max(r.end for r in runs) + 1.0) * 1e9)
    emitter = Emitter(fleet, procs, "current", 0)
    for r in runs:
        emitter.emit(r)
    procs.flush()
    procs.shutdown()
    spans = sink.spans
    calls = [
        encode_spans(spans[i : i + SPANS_PER_CALL]).SerializeToString() for i in range(0, len(spans), 512)
    ]
    return calls, [r.request_id for r in runs], length_ns


def copy_calls(calls: list[bytes], rids: list[str], k: int, shift_ns: int) -> list[bytes]:
    """Copy k of the base calls: ids made unique to the copy, times shifted by `shift_ns`."""
    salt = ((k + 1) * 0x9E3779B97F4A7C15) & (2**64 - 1)
    tag = f"{k:08x}"
    out = []
    for raw in calls:
        req = ExportTraceServiceRequest.FromString(raw)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    s.trace_id = (int.from_bytes(s.trace_id, "big") ^ (salt << 64)).to_bytes(16, "big")
                    s.span_id = (int.from_bytes(s.span_id, "big") ^ salt).to_bytes(8, "big")
                    if s.parent_span_id:
                        s.parent_span_id = (int.from_bytes(s.parent_span_id, "big") ^ salt).to_bytes(8, "big")
                    s.start_time_unix_nano += shift_ns
                    s.end_time_unix_nano += shift_ns
                    for e in s.events:
                        e.time_unix_nano += shift_ns
                    for kv in s.attributes:
                        v = kv.value
                        if v.HasField("string_value"):
                            v.string_value = _retag(v.string_value, rids, tag)
                        elif v.HasField("array_value"):
                            for item in v.array_value.values:
                                if item.HasField("string_value"):
                                    item.string_value = _retag(item.string_value, rids, tag)
        out.append(req.SerializeToString())
    return out


def _retag(value: str, rids: Sequence[str], tag: str) -> str:
    """Request ids (UUIDs) inside a value get the copy's tag as their first 8 hex digits."""
    if len(value) < 36 or "-" not in value:
        return value
    for rid in _rid_index(rids).get(_probe(value), ()):
        if rid in value:
            return value.replace(rid, tag + rid[8:])
    return value


_RID_INDEX: dict[int, dict[str, list[str]]] = {}


def _rid_index(rids: Sequence[str]) -> dict[str, list[str]]:
    index = _RID_INDEX.get(id(rids))
    if index is None:
        index = {}
        for rid in rids:
            index.setdefault(rid[9:13], []).append(rid)
        _RID_INDEX[id(rids)] = index
    return index


def _probe(value: str) -> str:
    """The UUID's second group, found wherever the id sits in the value."""
    at = value.find("-")
    while at >= 0:
        if at >= 8 and len(value) >= at + 28 and value[at + 5] == "-":
            return value[at + 1 : at + 5]
        at = value.find("-", at + 1)
    return ""


def percentiles(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "p50_ms": statistics.median(s) * 1e3,
        "p99_ms": s[min(len(s) - 1, int(len(s) * 0.99))] * 1e3,
        "max_ms": s[-1] * 1e3,
        "n": float(len(s)),
    }


def timed(client: httpx.Client, url: str, params: dict[str, Any] | None = None) -> tuple[float, Any]:
    t = time.perf_counter()
    r = client.get(url, params=params)
    elapsed = time.perf_counter() - t
    r.raise_for_status()
    return elapsed, r.json()


def storage(db: Database, spans: int) -> dict[str, float]:
    if db.kind == "sqlite":
        files = list(db.tmp.glob("bench.db*"))
        total = sum(f.stat().st_size for f in files)
    else:
        engine = create_engine(db.url)
        with engine.connect() as conn:
            total = conn.execute(
                text(
                    "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = 'public' AND c.relkind = 'r'"
                )
            ).scalar_one()
        engine.dispose()
    return {"bytes_total": float(total), "bytes_per_span": float(total) / spans}


def run(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    database = Database(kind)
    topo = database.tmp / "topology"
    calls, rids, length_ns = capture(topo, args.base, args.seed)
    base_spans = sum(
        len(s.spans)
        for c in calls
        for rs in ExportTraceServiceRequest.FromString(c).resource_spans
        for s in rs.scope_spans
    )
    copies = max(1, round(args.requests / args.base))
    now = time.time_ns()
    start = now - DAY_NS
    step = max(length_ns, (DAY_NS - length_ns) // copies)
    out: dict[str, Any] = {"db": kind, "requests": copies * args.base, "spans": copies * base_spans}
    try:
        env = {"RAILTRACE_TOPOLOGY": json.dumps([str(topo)])}
        with serve_process(database.url, database.tmp, args.quiet_period, env) as (proc, base_url):
            t0 = time.perf_counter()
            sent = 0
            for k in range(copies):
                batch = copy_calls(calls, rids, k, start + k * step)
                post_all(base_url, batch, args.clients)
                sent += len(batch)
                if (k + 1) % max(1, copies // 20) == 0:
                    print(
                        f"  {kind}: {k + 1}/{copies} copies sent ({(k + 1) * base_spans:,} spans, "
                        f"{time.perf_counter() - t0:.0f} s, RSS {rss_mb(proc.pid):.0f} MB)",
                        flush=True,
                    )
            out["ingest_s"] = time.perf_counter() - t0
            engine = create_engine(database.url)
            while True:
                with engine.connect() as conn:
                    dirty = conn.execute(
                        select(func.count()).select_from(traces_table).where(traces_table.c.dirty.is_(True))
                    ).scalar_one()
                if dirty == 0:
                    break
                time.sleep(1)
            out["assembled_s"] = time.perf_counter() - t0
            with engine.connect() as conn:
                ids = [r[0] for r in conn.execute(select(requests_table.c.trace_id))]
                flag_node = conn.execute(
                    text(
                        "SELECT f.flag, r.decode_node, count(*) FROM request_flags f JOIN requests r "
                        "ON r.trace_id = f.trace_id WHERE r.decode_node IS NOT NULL "
                        "GROUP BY f.flag, r.decode_node ORDER BY count(*) DESC LIMIT 1"
                    )
                ).first()
                flagged = conn.execute(
                    text("SELECT count(DISTINCT trace_id) FROM request_flags")
                ).scalar_one()
            engine.dispose()
            out["requests_stored"] = len(ids)
            if len(ids) < out["requests"]:
                print(f"  warning: {len(ids)} request rows for {out['requests']} requests sent", flush=True)
            out["flagged_share"] = flagged / max(1, len(ids))
            out["peak_rss_mb"] = rss_mb(proc.pid, peak=True)
            out["storage"] = storage(database, out["spans"])
            out["queries"] = queries(base_url, ids, flag_node, now, args)
    finally:
        database.drop()
    return out


def queries(base: str, ids: list[str], flag_node: Any, now: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    res: dict[str, list[float]] = {}
    flag, node = (flag_node[0], flag_node[1]) if flag_node else (None, None)
    iso = lambda ns: datetime.fromtimestamp(ns / 1e9, UTC).isoformat()  # noqa: E731
    with httpx.Client(base_url=base, timeout=60) as client:
        for _ in range(args.queries):
            tid = rng.choice(ids)
            res.setdefault("request detail", []).append(timed(client, f"/api/v1/requests/{tid}")[0])
            res.setdefault("trace", []).append(timed(client, f"/api/v1/traces/{tid}")[0])
            if flag:
                hour_end = now - rng.randrange(0, 23) * HOUR_NS
                params = {
                    "flag": flag,
                    "node": node,
                    "since": iso(hour_end - HOUR_NS),
                    "until": iso(hour_end),
                    "limit": 100,
                }
                el, page = timed(client, "/api/v1/requests", params)
                res.setdefault("flag+node+1h list, first page", []).append(el)
                depth = 0
                while page.get("next_cursor") and depth < args.depth:
                    el, page = timed(client, "/api/v1/requests", {**params, "cursor": page["next_cursor"]})
                    depth += 1
                if depth:
                    res.setdefault(f"flag+node+1h list, deep page (up to {args.depth})", []).append(el)
        for _ in range(max(5, args.queries // 10)):
            res.setdefault("stats by flag, 1 hour", []).append(
                timed(client, "/api/v1/stats", {"group_by": "flag", "since": iso(now - HOUR_NS)})[0]
            )
            res.setdefault("stats by flag, 1 day", []).append(
                timed(client, "/api/v1/stats", {"group_by": "flag", "since": iso(now - DAY_NS)})[0]
            )
    return {k: percentiles(v) for k, v in res.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    ap.add_argument("--requests", type=int, default=25_000)
    ap.add_argument("--base", type=int, default=500, help="simulated requests captured once and replayed")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--depth", type=int, default=10, help="pages followed for the deep-page figure")
    ap.add_argument("--quiet-period", type=float, default=2.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    kinds = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    results = []
    for kind in kinds:
        r = run(args, kind)
        results.append(r)
        print(json.dumps(r, indent=2), flush=True)
    meta = {"python": platform.python_version(), "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    for r in results:
        print(
            f"\n{r['db']}: {r['requests']:,} requests, {r['spans']:,} spans, "
            f"{r['storage']['bytes_per_span']:.0f} bytes/span, peak RSS {r['peak_rss_mb']:.0f} MB"
        )
        print("| query | p50 ms | p99 ms | max ms |\n|---|---:|---:|---:|")
        for q, p in r["queries"].items():
            print(f"| {q} | {p['p50_ms']:.1f} | {p['p99_ms']:.1f} | {p['max_ms']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
