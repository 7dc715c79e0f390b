"""Clean edges: every malformed cursor is a 400, and an oversized body is answered 413 in a way
ordinary clients (requests, httpx, the official OTLP/HTTP exporter) read before the connection
closes, not as a reset connection."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import pytest
import requests
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from railtrace.server.runner import Service
from railtrace.settings import Settings
from tests.reliability.reliability_helpers import PROTOBUF

LIMIT = 1_000_000


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    db = tmp_path_factory.mktemp("edges") / "e.db"
    s = Settings(db=f"sqlite:///{db}", port=0, grpc_port=0, topology=[], max_body_bytes=LIMIT)
    with Service(s) as service:
        yield service


def _cursor(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    "raw",
    [
        b'[9223372036854775808,"a"]',  # 2^63: past the signed 64-bit column
        b'[-9223372036854775809,"a"]',
        b'[99999999999999999999999999999,"a"]',
        b'[true,"a"]',
        b'[false,"a"]',
        b'[1.5,"a"]',
        b'[null,"a"]',
        b"[1,2]",
        b'[1,"a",3]',
        b"[1]",
        b'{"a":1,"b":"c"}',
        b'"ab"',
        b"[]",
        b'[1,"' + b"a" * 100 + b'"]',
        b'[1,"a\\u0000"]',
        b"\xff\xfe",
        b"",
    ],
)
def test_every_malformed_cursor_is_a_400(svc: Service, raw: bytes) -> None:
    r = httpx.get(svc.http_url + "/api/v1/requests", params={"cursor": _cursor(raw) or "!"}, timeout=30)
    assert r.status_code == 400, (raw, r.status_code, r.text)


def test_a_cursor_at_the_edges_of_the_column_is_served(svc: Service) -> None:
    for raw in (b'[9223372036854775807,"a"]', b'[-9223372036854775808,"a"]'):
        r = httpx.get(svc.http_url + "/api/v1/requests", params={"cursor": _cursor(raw)}, timeout=30)
        assert r.status_code == 200, (raw, r.text)


def _too_large_count(svc: Service) -> float:
    for line in httpx.get(svc.http_url + "/metrics", timeout=30).text.splitlines():
        if line.startswith('llm_d_tracing_export_requests_total{outcome="too_large",protocol="http"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("size", [LIMIT + 1, 4 * LIMIT, 20 * LIMIT])
def test_requests_reads_the_413_of_an_oversized_body(svc: Service, size: int) -> None:
    """`requests` (the transport of the OTLP/HTTP exporter) sends the whole body without
    `Expect: 100-continue` and only then reads: each of several calls must get the 413."""
    with requests.Session() as session:
        for _ in range(5):
            r = session.post(
                svc.http_url + "/v1/traces", data=b"\0" * size, headers={"content-type": PROTOBUF}, timeout=30
            )
            assert r.status_code == 413


def test_httpx_reads_the_413_of_an_oversized_body_declared_or_chunked(svc: Service) -> None:
    body = b"\0" * (8 * LIMIT)

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 65536):
            yield body[i : i + 65536]

    with httpx.Client(base_url=svc.http_url, timeout=30) as client:
        for _ in range(5):
            r = client.post("/v1/traces", content=body, headers={"content-type": PROTOBUF})
            assert r.status_code == 413
            r = client.post("/v1/traces", content=chunks(), headers={"content-type": PROTOBUF})
            assert r.status_code == 413
        assert client.get("/healthz").status_code == 200  # the same keep-alive connection still serves


def test_the_otlp_exporter_reads_the_413_and_does_not_retry(svc: Service) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "big"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("edges")
    for i in range(40):
        with tracer.start_as_current_span(f"s{i}", attributes={"blob": "x" * 50_000}):
            pass
    provider.shutdown()
    spans = list(memory.get_finished_spans())
    before = _too_large_count(svc)
    exporter = OTLPSpanExporter(endpoint=svc.http_url + "/v1/traces", timeout=10)
    try:
        assert exporter.export(spans) == SpanExportResult.FAILURE
    finally:
        exporter.shutdown()
    # One attempt: a reset connection would have made the exporter retry until its timeout.
    assert _too_large_count(svc) - before == 1
