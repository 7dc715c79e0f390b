"""Long overload run: twice the sustainable ingest rate for minutes against `railtrace serve`.

    .venv/bin/python benchmarks/reliability/overload.py --minutes 3 [--db URL] [--threads 8]

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

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "reliability"))

import httpx
from crash_harness import Ledger, Server, pd_batch, stored
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from overload_harness import drive, throttled


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--probe", type=float, default=30.0, help="seconds to measure the sustainable rate")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--db", help="database URL (default: a fresh SQLite file)")
    args = ap.parse_args()
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
