"""One huge trace id against a real `railtrace serve` (SQLite, default settings) on 127.0.0.1.

    .venv/bin/python -m benchmarks.reliability.big_trace [--busy-seconds 30]

1. Three 16 MiB export calls whose spans all share one trace id (~250,000 spans each): the
   answers (partial success, spans dropped by `max_spans_per_trace`) and the time taken.
2. A trace filled to the cap by 1,000-span calls, then `GET /api/v1/traces/{id}` three at once
   (a page of 10,000 and the paged read): latency and the service's peak RSS.
3. Two traces of `--busy-fill` spans (just under the cap, so each new span is taken and the
   trace assembled again) receiving one span a second each for `--busy-seconds`, while
   normal requests (official exporter, 3-span P/D traces) are sent: each normal request's
   verdict latency (export to `GET /api/v1/requests/{trace}` answering 200).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from benchmarks.reliability.edge_attacks import Sampler
from tests.reliability.crash_harness import Server, key, pd_batch

T0 = time.time_ns()
PROTOBUF = {"content-type": "application/x-protobuf"}


def one_trace(trace: int, first: int, n: int) -> bytes:
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    tid = trace.to_bytes(16, "big")
    for i in range(first, first + n):
        s = ss.spans.add()
        s.trace_id = tid
        s.span_id = (i + 1).to_bytes(8, "big")
        s.parent_span_id = b"\0\0\0\0\0\0\0\1"
        s.name = "x"
        s.start_time_unix_nano = T0 + i
        s.end_time_unix_nano = T0 + i + 1
    return req.SerializeToString()


def huge_calls(server: Server) -> dict[str, object]:
    n = 1
    while len(one_trace(1, 0, n * 2)) < 16_000_000:
        n *= 2
    bodies = [one_trace(1, k * n, n) for k in range(3)]
    t = time.monotonic()
    answers = []
    with httpx.Client(base_url=server.url, timeout=120) as c:
        for b in bodies:
            r = c.post("/v1/traces", content=b, headers=PROTOBUF)
            ps = (
                ExportTraceServiceResponse.FromString(r.content).partial_success
                if r.status_code == 200
                else None
            )
            answers.append(
                {"status": r.status_code, "spans": n, "dropped": ps.rejected_spans if ps else None}
            )
    return {"calls": answers, "body_mb": round(len(bodies[0]) / 1e6, 1), "s": round(time.monotonic() - t, 1)}


def fill(server: Server, trace: int, total: int) -> int:
    stored = 0
    with httpx.Client(base_url=server.url, timeout=120) as c:
        for first in range(0, total, 1000):
            n = min(1000, total - first)
            r = c.post("/v1/traces", content=one_trace(trace, first, n), headers=PROTOBUF)
            ps = ExportTraceServiceResponse.FromString(r.content).partial_success
            stored += n - ps.rejected_spans
    return stored


def reads(server: Server, trace: int) -> dict[str, object]:
    tid = format(trace, "032x")
    lat: list[float] = []

    def one() -> None:
        t = time.monotonic()
        httpx.get(f"{server.url}/api/v1/traces/{tid}", timeout=120).raise_for_status()
        lat.append(time.monotonic() - t)

    with Sampler(server.proc.pid) as rss:
        before = rss.peak
        threads = [threading.Thread(target=one) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    pages, cursor, t = 0, None, time.monotonic()
    while True:
        params: dict[str, object] = {"limit": 1000}
        if cursor:
            params["cursor"] = cursor
        body = httpx.get(f"{server.url}/api/v1/traces/{tid}", params=params, timeout=120).json()
        pages += 1
        cursor = body["next_cursor"]
        if not cursor:
            break
    return {
        "three_reads_s": [round(x, 2) for x in sorted(lat)],
        "rss_before_mb": round(before / 2**20),
        "rss_peak_mb": round(rss.peak / 2**20),
        "paged_1000": {"pages": pages, "s": round(time.monotonic() - t, 2)},
    }


def busy(server: Server, seconds: float) -> dict[str, object]:
    """Two capped traces getting a span a second; normal requests' verdict latency meanwhile."""
    stop = threading.Event()

    def poke() -> None:
        i = 10_000_000
        with httpx.Client(base_url=server.url, timeout=60) as c:
            while not stop.is_set():
                for trace in (2, 3):
                    c.post("/v1/traces", content=one_trace(trace, i, 1), headers=PROTOBUF)
                i += 1
                stop.wait(1)

    latencies: list[float] = []
    exporter = OTLPSpanExporter(endpoint=server.url + "/v1/traces", timeout=10)
    poker = threading.Thread(target=poke, daemon=True)
    poker.start()
    end = time.monotonic() + seconds
    with httpx.Client(base_url=server.url, timeout=60) as c:
        while time.monotonic() < end:
            spans = pd_batch(1)
            tid = key(spans[0])[0]
            t = time.monotonic()
            exporter.export(spans)
            while c.get(f"/api/v1/requests/{tid}").status_code != 200 and time.monotonic() - t < 120:
                time.sleep(0.05)
            latencies.append(time.monotonic() - t)
    stop.set()
    poker.join(10)
    exporter.shutdown()
    return {
        "normal_requests": len(latencies),
        "verdict_latency_median_s": round(statistics.median(latencies), 2),
        "verdict_latency_max_s": round(max(latencies), 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--busy-seconds", type=float, default=30)
    ap.add_argument("--busy-fill", type=int, default=9_970, help="spans in each busy trace at the start")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # Default quiet period (2 s), as deployed.
        server = Server(f"sqlite:///{Path(tmp) / 'big.db'}", Path(tmp), "--quiet-period", "2")
        server.wait_ready()
        try:
            print(json.dumps({"phase": "huge_calls", **huge_calls(server)}), flush=True)
            stored = fill(server, 4, 12_000)
            print(json.dumps({"phase": "fill", "offered": 12_000, "stored": stored}), flush=True)
            print(json.dumps({"phase": "reads", **reads(server, 4)}), flush=True)
            baseline = busy(server, min(10.0, args.busy_seconds))
            print(json.dumps({"phase": "normal_only", **baseline}), flush=True)
            for trace in (2, 3):  # just under the cap: each span a second is taken, and re-assembled
                fill(server, trace, args.busy_fill)
            print(json.dumps({"phase": "busy_big_traces", **busy(server, args.busy_seconds)}), flush=True)
        finally:
            server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
