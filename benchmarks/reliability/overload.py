"""Long overload run: twice the sustainable ingest rate for minutes against `railtrace serve`.

    .venv/bin/python -m benchmarks.reliability.overload --minutes 3 [--db URL] [--threads 8]
    .venv/bin/python -m benchmarks.reliability.overload --raw --minutes 3

Official Python exporters cannot outrun the service on a small machine (span creation and
encoding cost more than ingest), so `--raw` offers the load from pre-encoded export calls
(the ingest benchmark's realistic payloads, trace ids renewed for every send) posted by
clients that honour `Retry-After` as the exporters do, with two official exporters
alongside. Assembly is held back (long quiet period) so the figures are about ingest.

1. Measures the sustainable rate: official exporters flat out for `--probe` seconds with the
   default pending limit; the accepted spans per second is the rate.
2. Offers twice that rate (paced senders, a quarter of them gRPC) for `--minutes`, sampling the
   service's resident memory every half second.
3. Stops the load and waits for /readyz, then proves a fresh export succeeds.
Prints JSON: offered, accepted, rejected (exporter gave up after its retries), throttled
answers the exporters retried, spans lost (acknowledged but not stored: must be 0), peak RSS.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from tests.reliability.crash_harness import Ledger, Server, pd_batch, stored
from tests.reliability.overload_harness import drive, throttled
from tests.reliability.reliability_helpers import rss_bytes


def raw_pool(spans: int) -> list[tuple[bytes, list[bytes]]]:
    """Export calls and the trace ids in each (for renewing them on every send)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from benchmarks.common.payload import export_calls

    pool = []
    for body in export_calls(spans):
        req = ExportTraceServiceRequest.FromString(body)
        tids = sorted({s.trace_id for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans})
        pool.append((body, tids))
    return pool


def raw_drive(
    server: Server,
    pool: list[tuple[bytes, list[bytes]]],
    spans_per_s: float | None,
    seconds: float,
    threads: int,
    start_round: int,
) -> dict[str, float]:
    """Paced raw senders; each send renews the trace ids; 429/503 wait `Retry-After` and resend."""
    import itertools
    import threading

    counter = itertools.count(start_round * len(pool))
    stop = threading.Event()
    lock = threading.Lock()
    fig = {"offered_spans": 0, "accepted_spans": 0, "throttled_answers": 0, "retried_sends": 0, "rounds": 0}
    peak = [0.0]
    samples: list[float] = []

    def renew(n: int) -> bytes:
        body, tids = pool[n % len(pool)]
        salt = (n // len(pool) + 1).to_bytes(4, "big")
        for t in tids:
            body = body.replace(t, t[:8] + salt + t[12:])
        return body

    def sender() -> None:
        interval = 512 * threads / spans_per_s if spans_per_s else 0.0
        next_at = time.monotonic()
        with httpx.Client(base_url=server.url, timeout=120) as client:
            while not stop.is_set():
                body = renew(next(counter))
                with lock:
                    fig["offered_spans"] += 512
                while True:
                    r = client.post(
                        "/v1/traces", content=body, headers={"content-type": "application/x-protobuf"}
                    )
                    if r.status_code in (429, 503):
                        with lock:
                            fig["throttled_answers"] += 1
                            fig["retried_sends"] += 1
                        stop.wait(float(r.headers.get("retry-after", "1")))
                        continue
                    if r.status_code == 200:
                        with lock:
                            fig["accepted_spans"] += 512
                    break
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    stop.wait(delay)

    workers = [threading.Thread(target=sender, daemon=True) for _ in range(threads)]
    t0 = time.monotonic()
    for w in workers:
        w.start()
    while time.monotonic() - t0 < seconds:
        rss = rss_bytes(server.proc.pid) / 2**20
        samples.append(rss)
        peak[0] = max(peak[0], rss)
        time.sleep(0.5)
    stop.set()
    for w in workers:
        w.join(300)
    fig["seconds"] = time.monotonic() - t0
    fig["peak_rss_mb"] = round(peak[0], 1)
    fig["median_rss_mb"] = round(sorted(samples)[len(samples) // 2], 1) if samples else 0.0
    fig["rounds"] = next(counter)
    return fig


def main_raw(args: argparse.Namespace) -> int:
    from sqlalchemy import create_engine

    from railtrace.store import Store

    pool = raw_pool(args.pool_spans)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        db = args.db or f"sqlite:///{work / 'overload.db'}"
        env = {"RAILTRACE_QUIET_PERIOD_S": "3600"}
        if args.max_pending:
            env["RAILTRACE_MAX_PENDING_SPANS"] = str(args.max_pending)
        server = Server(db, work, env=env)
        try:
            server.wait_ready()
            probe = raw_drive(server, pool, None, args.probe, 4, 0)
            rate = probe["accepted_spans"] / probe["seconds"]
            ledger = Ledger()
            import threading

            official: dict[str, object] = {}
            official_thread = threading.Thread(
                target=lambda: official.update(
                    drive(server, ledger, None, args.minutes * 60, threads=2).as_dict()
                ),
                daemon=True,
            )
            official_thread.start()
            load = raw_drive(server, pool, 2 * rate, args.minutes * 60, args.threads, 10_000)
            official_thread.join(600)
            t0 = time.monotonic()
            while httpx.get(server.url + "/readyz", timeout=30).status_code != 200:
                time.sleep(0.2)
            recovered_s = time.monotonic() - t0
            engine = create_engine(db)
            stored_count = Store(engine).count_spans()
            engine.dispose()
            lost_official = len(ledger.acked - stored(db))
            acked_raw = probe["accepted_spans"] + load["accepted_spans"]
            print(
                json.dumps(
                    {
                        "mode": "raw",
                        "max_pending_spans": args.max_pending or "default",
                        "sender_threads": args.threads,
                        "db": db.split(":", 1)[0],
                        "sustainable_spans_per_s": round(rate),
                        "probe": probe,
                        "overload": load,
                        "overload_offered_spans_per_s": round(load["offered_spans"] / load["seconds"]),
                        "overload_accepted_spans_per_s": round(load["accepted_spans"] / load["seconds"]),
                        "official_exporters": official,
                        "official_lost_spans": lost_official,
                        "stored_spans": stored_count,
                        "acked_spans": acked_raw + len(ledger.acked),
                        "lost_spans": max(0, acked_raw + len(ledger.acked) - stored_count) + lost_official,
                        "ready_again_after_s": round(recovered_s, 1),
                        "throttled_total": throttled(server),
                    }
                ),
                flush=True,
            )
            return 0
        finally:
            server.terminate()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--probe", type=float, default=30.0, help="seconds to measure the sustainable rate")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--db", help="database URL (default: a fresh SQLite file)")
    ap.add_argument("--raw", action="store_true", help="pre-encoded load that can outrun the service")
    ap.add_argument("--max-pending", type=int, help="--raw: the service's max_pending_spans for the run")
    ap.add_argument("--pool-spans", type=int, default=51_200, help="--raw: distinct spans encoded up front")
    args = ap.parse_args()
    if args.raw:
        return main_raw(args)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        db = args.db or f"sqlite:///{work / 'overload.db'}"
        server = Server(db, work)
        try:
            server.wait_ready()
            ledger = Ledger()
            probe = drive(server, ledger, None, args.probe, threads=args.threads)
            sustainable = probe.accepted_spans / probe.seconds
            before = throttled(server)
            figures = drive(server, ledger, 2 * sustainable, args.minutes * 60, threads=args.threads * 2)
            figures.throttled_answers -= before
            t0 = time.monotonic()
            while httpx.get(server.url + "/readyz", timeout=30).status_code != 200:
                time.sleep(0.2)
            recovered_s = time.monotonic() - t0
            exporter = OTLPSpanExporter(endpoint=server.url + "/v1/traces")
            fresh_ok = exporter.export(pd_batch(2)) == SpanExportResult.SUCCESS
            exporter.shutdown()
            lost = len(ledger.acked - stored(db))
            rss = sorted(figures.rss_samples)
            print(
                json.dumps(
                    {
                        "db": db.split(":", 1)[0],
                        "sustainable_spans_per_s": round(sustainable),
                        "probe": probe.as_dict(),
                        "overload": figures.as_dict(),
                        "median_rss_mb": round(rss[len(rss) // 2], 1) if rss else None,
                        "lost_spans": lost,
                        "ready_again_after_s": round(recovered_s, 1),
                        "fresh_export_ok": fresh_ok,
                    }
                ),
                flush=True,
            )
            return 0 if lost == 0 and fresh_ok else 1
        finally:
            server.terminate()


if __name__ == "__main__":
    sys.exit(main())
