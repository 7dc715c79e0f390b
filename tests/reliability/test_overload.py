"""Overload: more than the service can commit, from official exporters, on a real process.

The service answers 429 (HTTP) / RESOURCE_EXHAUSTED (gRPC) with a retry delay, the exporters
retry, memory stays bounded by the pending-span limit, every span an exporter was told was
accepted is stored, and the service is ready again by itself once the load stops. This is
the short version; `benchmarks/reliability/overload.py` runs twice the sustainable rate for
minutes and reports the figures.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from tests.reliability.crash_harness import Ledger, Server, pd_batch, stored
from tests.reliability.overload_harness import drive
from tests.reliability.reliability_helpers import EXPORT_PATH

# The documented bound for the service process under overload with the default limits
# (docs/reliability.md); this test uses a far smaller pending limit, so it has ample margin.
RSS_BOUND_MB = 600


def test_overload_throttles_keeps_memory_bounded_loses_nothing_and_recovers(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'overload.db'}"
    server = Server(db, tmp_path, env={"RAILTRACE_MAX_PENDING_SPANS": "300", "RAILTRACE_RETRY_AFTER_S": "1"})
    try:
        server.wait_ready()
        ledger = Ledger()
        figures = drive(server, ledger, spans_per_s=None, seconds=10, threads=8)
        assert figures.throttled_answers > 0, figures.as_dict()  # the service did push back
        assert figures.peak_rss_mb < RSS_BOUND_MB, figures.as_dict()
        assert figures.accepted_spans + figures.rejected_spans == figures.offered_spans
        assert not ledger.acked - stored(db)  # accepted means stored
        # Recovers by itself: ready again, and a fresh export succeeds.
        deadline = time.monotonic() + 120
        while httpx.get(server.url + "/readyz", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "service did not recover"
            time.sleep(0.2)
        exporter = HttpExporter(endpoint=server.url + "/v1/traces")
        assert exporter.export(pd_batch(2)) == SpanExportResult.SUCCESS
        exporter.shutdown()
    finally:
        assert server.terminate() == 0


def test_grpc_throttling_carries_the_retry_delay_the_exporter_reads(tmp_path: Path) -> None:
    """The Python OTLP gRPC exporter reads the delay from `google.rpc.retryinfo-bin` trailing
    metadata; the HTTP exporter reads `Retry-After`."""
    from google.rpc import error_details_pb2

    db = f"sqlite:///{tmp_path / 't.db'}"
    server = Server(db, tmp_path, env={"RAILTRACE_MAX_PENDING_SPANS": "0", "RAILTRACE_RETRY_AFTER_S": "7"})
    try:
        server.wait_ready(path="/healthz")  # never "ready": every export is over the limit
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        body = encode_spans(pd_batch(1)).SerializeToString()
        r = httpx.post(
            server.url + "/v1/traces", content=body, headers={"content-type": "application/x-protobuf"}
        )
        assert r.status_code == 429 and r.headers["retry-after"] == "7"
        with grpc.insecure_channel(server.grpc_endpoint) as channel:
            try:
                channel.unary_unary(EXPORT_PATH)(body, timeout=30)
                raise AssertionError("expected RESOURCE_EXHAUSTED")
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                info = dict(err.trailing_metadata()).get("google.rpc.retryinfo-bin")
        assert info is not None, "gRPC exporters would fall back to their own backoff"
        assert error_details_pb2.RetryInfo.FromString(info).retry_delay.seconds == 7
    finally:
        assert server.terminate() == 0
