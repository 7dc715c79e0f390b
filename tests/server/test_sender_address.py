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
from railtrace.server.senders import Sender, grpc_peer_host, sender_address, sender_of, trusted_networks
from railtrace.settings import Settings
from tests.service_helpers import settings_for

PEER = "railtrace.otlp.peer"
CLAIMS = "railtrace.otlp.claims"


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


@pytest.mark.parametrize(
    ("peer", "forwarded", "proxies", "collectors", "want"),
    [
        ("10.8.0.4", [], [], ["10.8.0.0/24"], Sender("10.8.0.4", "collector")),
        ("10.0.1.5", [], [], ["10.8.0.0/24"], Sender("10.0.1.5", "sender")),
        # Through a trusted proxy, the client it names is the sender whose claims are judged.
        ("10.0.0.2", ["10.8.0.4"], ["10.0.0.0/30"], ["10.8.0.0/24"], Sender("10.8.0.4", "collector")),
        ("10.0.0.2", ["10.9.9.9"], ["10.0.0.0/30"], ["10.8.0.0/24"], Sender("10.9.9.9", "sender")),
        # A header from an untrusted peer names nobody: a forger cannot pass for the collector.
        ("10.9.9.9", ["10.8.0.4"], ["10.0.0.0/30"], ["10.8.0.0/24"], Sender("10.9.9.9", "sender")),
        # A collector beside the service: loopback is believed, though not recorded as an address.
        ("127.0.0.1", [], [], ["127.0.0.1/32"], Sender(None, "collector")),
        ("127.0.0.1", [], [], [], Sender(None, "sender")),
        (None, [], [], ["0.0.0.0/0"], Sender(None, "sender")),
    ],
)
def test_sender_claims(
    peer: str | None, forwarded: list[str], proxies: list[str], collectors: list[str], want: Sender
) -> None:
    assert sender_of(peer, forwarded, trusted_networks(proxies), trusted_networks(collectors)) == want


def test_trusted_collectors_from_the_command_line_and_checked() -> None:
    from railtrace.cli import build_parser
    from railtrace.server.runner import settings_from_args

    args = build_parser().parse_args(["serve", "--trusted-collector", "10.8.0.0/24"])
    assert settings_from_args(args).trusted_collectors == ["10.8.0.0/24"]
    with pytest.raises(ValueError, match="trusted_collectors"):
        Settings(trusted_collectors=["collector.local"])


def test_loopback_is_a_trusted_collector_unless_the_list_is_given() -> None:
    """A collector in the service's own pod or host vouches by default; a given list replaces that."""
    default = trusted_networks(Settings().trusted_collectors)
    assert sender_of("127.0.0.1", [], (), default) == Sender(None, "collector")
    assert sender_of("::1", [], (), default) == Sender(None, "collector")
    assert sender_of("10.0.0.9", [], (), default) == Sender("10.0.0.9", "sender")
    given = trusted_networks(Settings(trusted_collectors=["10.8.0.0/24"]).trusted_collectors)
    assert sender_of("127.0.0.1", [], (), given) == Sender(None, "sender")
    assert Settings(trusted_collectors=[]).trusted_collectors == []


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


def _spans(claimed_peer: str | None = None, claims: str | None = None) -> list:
    memory = InMemorySpanExporter()
    attrs = {"service.name": "vllm-decode", "k8s.pod.name": "vllm-decode-0"}
    if claimed_peer:
        attrs[PEER] = claimed_peer
    if claims:
        attrs[CLAIMS] = claims
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


def test_who_vouches_for_k8s_claims_is_recorded_over_http_and_grpc(db_url: str) -> None:
    """A trusted collector's claims are marked `collector`, anyone else's `sender` -- also when
    the sender writes `collector` itself."""
    settings = settings_for(db_url, trusted_proxies=["127.0.0.1/32"], trusted_collectors=["10.8.0.0/24"])
    with Service(settings) as svc:
        cases = [
            ("http", "10.8.0.4", None, "collector"),
            ("grpc", "10.8.0.4", None, "collector"),
            ("http", "10.0.1.5", "collector", "sender"),
            ("grpc", "10.0.1.5", "collector", "sender"),
        ]
        for transport, sender, claimed, want in cases:
            spans = _spans(claims=claimed)
            headers = {"x-forwarded-for": sender}
            exporter = (
                HttpExporter(endpoint=svc.http_url + "/v1/traces", headers=headers)
                if transport == "http"
                else GrpcExporter(endpoint=svc.grpc_endpoint, insecure=True, headers=headers)
            )
            try:
                assert exporter.export(spans) == SpanExportResult.SUCCESS
            finally:
                exporter.shutdown()
            resource = _resource(svc, spans)
            assert (resource[PEER], resource[CLAIMS]) == (sender, want), (transport, sender, claimed)
            assert resource["k8s.pod.name"] == "vllm-decode-0"  # the claim is kept, as a claim
