"""Overload of a real `railtrace serve` process by official OTLP exporters at a paced rate.

Each sender thread offers its share of the target rate in batches and never waits for the
service beyond what the exporter itself does (it honours 429/503 `Retry-After` and retries).
The figures separate what the exporters were told (SUCCESS: accepted; FAILURE after their
retries: rejected) from what the service counted (throttled answers: retries asked for),
and the memory the service process used while it happened.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from tests.reliability.crash_harness import Ledger, Server, key, pd_batch
from tests.reliability.reliability_helpers import rss_bytes


@dataclass
class Figures:
    offered_spans: int = 0
    accepted_spans: int = 0
    rejected_spans: int = 0
    throttled_answers: int = 0
    peak_rss_mb: float = 0.0
    rss_samples: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "seconds": round(self.seconds, 1),
            "offered_spans": self.offered_spans,
            "offered_spans_per_s": round(self.offered_spans / max(self.seconds, 1e-9)),
            "accepted_spans": self.accepted_spans,
            "accepted_spans_per_s": round(self.accepted_spans / max(self.seconds, 1e-9)),
            "rejected_spans": self.rejected_spans,
            "throttled_answers_retried": self.throttled_answers,
            "peak_rss_mb": round(self.peak_rss_mb, 1),
        }


def throttled(server: Server) -> int:
    total = 0
    for line in httpx.get(server.url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("llm_d_tracing_throttled_exports_total{"):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def drive(
    server: Server,
    ledger: Ledger,
    spans_per_s: float | None,
    seconds: float,
    threads: int = 8,
    traces_per_batch: int = 20,
    grpc_share: float = 0.25,
    exporter_timeout: float = 30,
) -> Figures:
    """Offer `spans_per_s` (None: as fast as the exporters go) for `seconds`."""
    figures = Figures()
    stop = threading.Event()
    lock = threading.Lock()
    spans_per_batch = traces_per_batch * 3
    n_grpc = round(threads * grpc_share)

    def sender(i: int) -> None:
        exporter = (
            GrpcExporter(endpoint=server.grpc_endpoint, insecure=True, timeout=exporter_timeout)
            if i < n_grpc
            else HttpExporter(endpoint=server.url + "/v1/traces", timeout=exporter_timeout)
        )
        interval = spans_per_batch * threads / spans_per_s if spans_per_s else 0.0
        next_at = time.monotonic()
        try:
            while not stop.is_set():
                spans = pd_batch(traces_per_batch)
                with lock:
                    figures.offered_spans += len(spans)
                result = exporter.export(spans)
                ledger.record(spans, result)
                with lock:
                    if result == SpanExportResult.SUCCESS:
                        figures.accepted_spans += len(spans)
                    else:
                        figures.rejected_spans += len(spans)
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    stop.wait(delay)
        finally:
            exporter.shutdown()

    workers = [threading.Thread(target=sender, args=(i,), daemon=True) for i in range(threads)]
    started = time.monotonic()
    for w in workers:
        w.start()
    while time.monotonic() - started < seconds:
        rss = rss_bytes(server.proc.pid) / 2**20
        figures.rss_samples.append(rss)
        figures.peak_rss_mb = max(figures.peak_rss_mb, rss)
        time.sleep(0.5)
    stop.set()
    for w in workers:
        w.join(exporter_timeout + 60)
    figures.seconds = time.monotonic() - started
    figures.throttled_answers = throttled(server)
    return figures


__all__ = ["Figures", "drive", "key", "throttled"]
