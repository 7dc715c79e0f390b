"""The OTLP sender's address is recorded on each resource (`railtrace.otlp.peer`): the HTTP or
gRPC peer, or -- only from a trusted proxy -- the client it forwards for; never what a sender
claims itself, never a loopback address."""

from __future__ import annotations

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from railtrace.server.runner import Service
from railtrace.server.senders import grpc_peer_host, sender_address, trusted_networks
from railtrace.settings import Settings
from tests.service_helpers import settings_for

PEER = "railtrace.otlp.peer"


@pytest.mark.parametrize(
    ("peer", "forwarded", "trusted", "want"),
    [
        ("10.0.1.5", [], [], "10.0.1.5"),
        ("127.0.0.1", [], [], None),  # loopback: no pod has it
        ("::1", [], [], None),
        ("::ffff:10.0.1.5", [], [], "10.0.1.5"),
        ("10.0.1.5", ["10.9.9.9"], [], "10.0.1.5"),  # not a trusted proxy: header ignored
        ("10.0.0.2", ["10.0.1.7"], ["10.0.0.0/30"], "10.0.1.7"),
        ("10.0.0.2", ["6.6.6.6, 10.0.1.7, 10.0.0.1"], ["10.0.0.0/30"], "10.0.1.7"),  # right-most untrusted
        ("10.0.0.2", ["garbage"], ["10.0.0.0/30"], "10.0.0.2"),
        (None, [], [], None),
        ("not-an-ip", [], [], None),
    ],
)
def test_sender_address(peer: str | None, forwarded: list[str], trusted: list[str], want: str | None) -> None:
    assert sender_address(peer, forwarded, trusted_networks(trusted)) == want


def test_grpc_peer_forms() -> None:
    assert grpc_peer_host("ipv4:10.0.1.5:51234") == "10.0.1.5"
    assert grpc_peer_host("ipv6:[fd00::1]:51234") == "fd00::1"
    assert grpc_peer_host("unix:/tmp/sock") is None
    assert grpc_peer_host("") is None


def test_bad_trusted_proxy_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="trusted_proxies"):
        Settings(trusted_proxies=["10.0.0.0/33"])


def test_trusted_proxies_from_the_command_line() -> None:
    from railtrace.cli import build_parser
    from railtrace.server.runner import settings_from_args

    args = build_parser().parse_args(["serve", "--trusted-proxy", "10.0.0.0/8", "--trusted-proxy", "fd00::1"])
    assert settings_from_args(args).trusted_proxies == ["10.0.0.0/8", "fd00::1"]


def _spans(claimed_peer: str | None = None) -> list:
    memory = InMemorySpanExporter()
    attrs = {"service.name": "vllm-decode"}
    if claimed_peer:
        attrs[PEER] = claimed_peer
    provider = TracerProvider(resource=Resource.create(attrs))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("vllm.tracing.otel").start_as_current_span("llm_request"):
        pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def _resource(svc: Service, spans: list) -> dict:
    tid = format(spans[0].context.trace_id, "032x")
    return httpx.get(f"{svc.http_url}/api/v1/traces/{tid}").json()["spans"][0]["resource"]


def test_http_and_grpc_senders_recorded_from_trusted_proxy_only(db_url: str) -> None:
    with Service(settings_for(db_url, trusted_proxies=["127.0.0.1/32"])) as svc:
        over_http, over_grpc, spoofed = _spans(), _spans(), _spans(claimed_peer="10.6.6.6")
        http = HttpExporter(endpoint=svc.http_url + "/v1/traces", headers={"x-forwarded-for": "10.0.1.5"})
        grpc = GrpcExporter(
            endpoint=svc.grpc_endpoint, insecure=True, headers={"x-forwarded-for": "10.0.1.6"}
        )
        plain = HttpExporter(endpoint=svc.http_url + "/v1/traces")
        try:
            assert http.export(over_http) == SpanExportResult.SUCCESS
            assert grpc.export(over_grpc) == SpanExportResult.SUCCESS
            assert plain.export(spoofed) == SpanExportResult.SUCCESS
        finally:
            for exporter in (http, grpc, plain):
                exporter.shutdown()
        assert _resource(svc, over_http)[PEER] == "10.0.1.5"
        assert _resource(svc, over_grpc)[PEER] == "10.0.1.6"
        assert PEER not in _resource(svc, spoofed)  # a sender's own claim is dropped; loopback not kept
    with Service(settings_for(db_url)) as svc:  # no trusted proxies: the header means nothing
        spans = _spans()
        http = HttpExporter(endpoint=svc.http_url + "/v1/traces", headers={"x-forwarded-for": "10.0.1.5"})
        try:
            assert http.export(spans) == SpanExportResult.SUCCESS
        finally:
            http.shutdown()
        assert PEER not in _resource(svc, spans)
