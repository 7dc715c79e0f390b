"""Access: separate bearer tokens for ingest and the query API (HTTP and gRPC, official
exporters as clients), TLS on both listeners with a certificate made here, loopback by
default with a warning when exposed without tokens, CORS off unless origins are listed,
and bounded query parameters."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from railtrace.cli import build_parser
from railtrace.server.runner import Service, settings_from_args
from railtrace.server.security import exposure_warnings
from railtrace.settings import Settings
from tests.reliability.crash_harness import pd_batch

INGEST, API = "ingest-secret-1", "api-secret-2"


def settings(tmp_path: Path, **kw: object) -> Settings:
    return Settings(db=f"sqlite:///{tmp_path / 'a.db'}", port=0, grpc_port=0, topology=[], **kw)


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Service]:
    with Service(settings(tmp_path, ingest_token=INGEST, api_token=API)) as svc:
        yield svc


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_tokens_are_separate_for_ingest_and_api(guarded: Service) -> None:
    url = guarded.http_url
    spans = pd_batch(1)
    assert HttpExporter(endpoint=url + "/v1/traces").export(spans) == SpanExportResult.FAILURE
    wrong = HttpExporter(endpoint=url + "/v1/traces", headers=bearer(API))
    assert wrong.export(spans) == SpanExportResult.FAILURE  # the API token does not open ingest
    right = HttpExporter(endpoint=url + "/v1/traces", headers=bearer(INGEST))
    assert right.export(spans) == SpanExportResult.SUCCESS
    r = httpx.post(url + "/v1/traces", content=b"", headers={"content-type": "application/x-protobuf"})
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    tid = format(spans[0].context.trace_id, "032x")
    assert httpx.get(f"{url}/api/v1/traces/{tid}").status_code == 401
    assert httpx.get(f"{url}/api/v1/traces/{tid}", headers=bearer(INGEST)).status_code == 401
    assert httpx.get(f"{url}/api/v1/traces/{tid}", headers=bearer(API)).status_code == 200
    # Probes, Prometheus and the API description stay open.
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert httpx.get(url + path).status_code == 200, path


def test_grpc_ingest_needs_the_ingest_token(guarded: Service) -> None:
    spans = pd_batch(1)
    bare = GrpcExporter(endpoint=guarded.grpc_endpoint, insecure=True, timeout=5)
    assert bare.export(spans) == SpanExportResult.FAILURE
    ok = GrpcExporter(endpoint=guarded.grpc_endpoint, insecure=True, headers=bearer(INGEST), timeout=10)
    assert ok.export(spans) == SpanExportResult.SUCCESS
    with grpc.insecure_channel(guarded.grpc_endpoint) as ch, pytest.raises(grpc.RpcError) as err:
        ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")(b"", timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    bare.shutdown()
    ok.shutdown()


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_tls_on_both_listeners(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # requests prefers these environment bundles over the exporter's own certificate_file.
    for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)
    cert, key = self_signed(tmp_path)
    with Service(settings(tmp_path, tls_cert=str(cert), tls_key=str(key))) as svc:
        assert svc.http_url.startswith("https://")
        spans = pd_batch(1)
        http = HttpExporter(endpoint=svc.http_url + "/v1/traces", certificate_file=str(cert))
        assert http.export(spans) == SpanExportResult.SUCCESS
        creds = grpc.ssl_channel_credentials(cert.read_bytes())
        over_grpc = GrpcExporter(endpoint=svc.grpc_endpoint, credentials=creds, insecure=False, timeout=10)
        assert over_grpc.export(pd_batch(1)) == SpanExportResult.SUCCESS
        over_grpc.shutdown()
        tid = format(spans[0].context.trace_id, "032x")
        assert (
            httpx.get(
                f"{svc.http_url}/api/v1/traces/{tid}", verify=ssl.create_default_context(cafile=str(cert))
            ).status_code
            == 200
        )
        with pytest.raises(httpx.HTTPError):  # clear text is refused
            httpx.get(svc.http_url.replace("https://", "http://") + "/healthz", timeout=5)
        with pytest.raises(httpx.HTTPError):  # and an unknown certificate is not trusted
            httpx.get(svc.http_url + "/healthz", timeout=5)


def test_tls_needs_cert_and_key_together(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="certificate and its key"):
        settings(tmp_path, tls_cert=str(tmp_path / "c.pem"))


def test_loopback_by_default_and_warnings_when_exposed(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RAILTRACE_HOST", "RAILTRACE_INGEST_TOKEN", "RAILTRACE_API_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    assert Settings().host == "127.0.0.1"
    assert exposure_warnings("127.0.0.1", None, None, False) == []
    assert exposure_warnings("::1", None, None, False) == []
    warned = exposure_warnings("0.0.0.0", None, None, False)
    assert len(warned) == 2 and "ingest token" in warned[0] and "API token" in warned[1]
    assert exposure_warnings("10.0.0.5", "a", "b", True) == []
    assert "clear text" in exposure_warnings("10.0.0.5", "a", "b", False)[0]


def test_serve_options_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAILTRACE_API_TOKEN", "from-env")
    monkeypatch.setenv("RAILTRACE_DROP_ATTRIBUTES", '["user.email", "app.secret.*"]')
    args = build_parser().parse_args(
        [
            "serve",
            "--ingest-token",
            "t1",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--cors-origin",
            "https://grafana.example",
            "--cors-origin",
            "https://b.example",
        ]
    )
    s = settings_from_args(args)
    assert s.ingest_token == "t1" and s.api_token == "from-env"
    assert (s.tls_cert, s.tls_key) == ("c.pem", "k.pem")
    assert s.cors_origins == ["https://grafana.example", "https://b.example"]
    assert s.drop_attributes == ["user.email", "app.secret.*"]


def test_cors_off_by_default_and_allow_list(tmp_path: Path) -> None:
    preflight = {"origin": "https://evil.example", "access-control-request-method": "GET"}
    with Service(settings(tmp_path)) as svc:
        r = httpx.options(svc.http_url + "/api/v1/requests", headers=preflight)
        assert "access-control-allow-origin" not in r.headers
        r = httpx.get(svc.http_url + "/api/v1/requests", headers={"origin": "https://evil.example"})
        assert "access-control-allow-origin" not in r.headers
    with Service(settings(tmp_path, cors_origins=["https://grafana.example"])) as svc:
        r = httpx.options(
            svc.http_url + "/api/v1/requests", headers={**preflight, "origin": "https://grafana.example"}
        )
        assert r.headers["access-control-allow-origin"] == "https://grafana.example"
        r = httpx.get(svc.http_url + "/api/v1/requests", headers={"origin": "https://evil.example"})
        assert "access-control-allow-origin" not in r.headers


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with Service(settings(tmp_path_factory.mktemp("plain"))) as svc:
        yield svc


BAD_PARAMS = [
    {"limit": 0},
    {"limit": 1001},
    {"limit": "many"},
    {"since": "yesterday"},
    {"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
    {"since": "3187-01-27T05:45:29Z"},
    {"cursor": "x" * 600},
    {"cursor": "bm90IG91cnM"},
    {"node": "n" * 300},
    {"flag": "made_up"},
    {"path_class": "carrier_pigeon"},
]


def test_query_parameters_are_validated_and_bounded(plain: Service) -> None:
    for params in BAD_PARAMS:
        r = httpx.get(plain.http_url + "/api/v1/requests", params=params)
        assert r.status_code in (400, 422), (params, r.status_code, r.text[:200])
    r = httpx.get(plain.http_url + "/api/v1/stats", params={"since": "3187-01-27T05:45:29Z"})
    assert r.status_code == 400  # was a server error: nanoseconds past the 64-bit column
