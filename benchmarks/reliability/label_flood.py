"""A sender choosing label values: every request names its own model, pods and nodes. What does
it do to `/metrics`? Against a real `railtrace serve` on 127.0.0.1 (SQLite in a temporary
folder, no topology, so no value is known in advance).

    .venv/bin/python -m benchmarks.reliability.label_flood [--requests 20000] [--batch 200]

Sends `--requests` P/D requests (the eight spans of `tests.service_helpers.pd_spans`) over
OTLP/HTTP, each with its own `gen_ai.request.model` and its own prefill and decode pod and
node, waits until all are counted in `llm_d_tracing_requests_total`, then prints one JSON
line: `/metrics` bytes (text and OpenMetrics), series lines, scrape seconds, the service's
resident memory before and after, and the requests counted (which must equal those sent).
Extra arguments after `--` go to `railtrace serve`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.reliability.crash_harness import Server
from tests.reliability.reliability_helpers import rss_bytes
from tests.service_helpers import flood_export

OPENMETRICS = "application/openmetrics-text"


def requests_counted(body: str) -> float:
    """The sum of `llm_d_tracing_requests_total` over its series."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("llm_d_tracing_requests_total{")
    )


def series_lines(body: str) -> int:
    return sum(1 for line in body.splitlines() if line and not line.startswith("#"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=900.0, help="longest wait for assembly")
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    with tempfile.TemporaryDirectory(prefix="railtrace-label-flood-") as tmp:
        work = Path(tmp)
        server = Server(f"sqlite:///{work / 'flood.db'}", work, *extra)
        try:
            server.wait_ready()
            with httpx.Client(base_url=server.url, timeout=60) as client:
                rss_before = rss_bytes(server.proc.pid)
                empty = client.get("/metrics").text
                started = time.monotonic()
                for first in range(0, args.requests, args.batch):
                    body = flood_export(first, min(args.batch, args.requests - first)).SerializeToString()
                    r = client.post(
                        "/v1/traces", content=body, headers={"content-type": "application/x-protobuf"}
                    )
                    r.raise_for_status()
                sent_s = time.monotonic() - started
                deadline = time.monotonic() + args.timeout
                counted = 0.0
                while time.monotonic() < deadline:
                    counted = requests_counted(client.get("/metrics").text)
                    if counted >= args.requests:
                        break
                    time.sleep(1.0)
                time.sleep(1.0)  # the children's last deltas
                t0 = time.monotonic()
                text = client.get("/metrics").text
                scrape_s = time.monotonic() - t0
                openmetrics = client.get("/metrics", headers={"accept": OPENMETRICS}).content
                print(
                    json.dumps(
                        {
                            "requests_sent": args.requests,
                            "requests_counted": requests_counted(text),
                            "metrics_bytes_empty": len(empty.encode()),
                            "metrics_bytes": len(text.encode()),
                            "openmetrics_bytes": len(openmetrics),
                            "series_lines_empty": series_lines(empty),
                            "series_lines": series_lines(text),
                            "scrape_s": round(scrape_s, 3),
                            "rss_before_mb": round(rss_before / 2**20, 1),
                            "rss_after_mb": round(rss_bytes(server.proc.pid) / 2**20, 1),
                            "send_s": round(sent_s, 1),
                            "total_s": round(time.monotonic() - started, 1),
                        }
                    ),
                    flush=True,
                )
        finally:
            server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
