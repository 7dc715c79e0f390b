"""Security headers on every answer of the HTTP app (UI pages and assets, API answers, OTLP
errors, 401s, 404s, 500s), and FastAPI's CDN-loading `/docs` and `/redoc` off unless
`api_docs` is set, with `/openapi.json` served either way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from railtrace.server.runner import Service
from railtrace.server.security import CONTENT_SECURITY_POLICY
from tests.service_helpers import settings_for

EXPECTED = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "content-security-policy": CONTENT_SECURITY_POLICY,
}


def assert_secured(r: httpx.Response, csp: str = CONTENT_SECURITY_POLICY) -> None:
    for name, value in {**EXPECTED, "content-security-policy": csp}.items():
        assert r.headers.get(name) == value, (r.request.method, r.request.url.path, r.status_code, name)
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]


@pytest.fixture
def service(tmp_path: Path) -> Any:
    settings = settings_for(f"sqlite:///{tmp_path / 'railtrace.db'}", api_token="api-secret")
    with Service(settings) as svc:
        yield svc


def test_every_kind_of_answer_has_the_headers(service: Service) -> None:
    auth = {"authorization": "Bearer api-secret"}
    with httpx.Client(base_url=service.http_url) as client:
        answers = [
            (client.get("/"), 200),
            (client.get("/requests/abc"), 200),
            (client.get("/topology"), 200),
            (client.get("/ui/static/app.js"), 200),
            (client.get("/ui/static/style.css"), 200),
            (client.get("/ui/static/nope.js"), 404),
            (client.get("/api/v1/requests", headers=auth), 200),
            (client.get("/api/v1/requests", headers=auth, params={"limit": 0}), 422),
            (client.get(f"/api/v1/requests/{'0' * 32}", headers=auth), 404),
            (client.get("/api/v1/requests"), 401),  # no token
            (client.get("/no/such/page"), 404),
            (client.post("/v1/traces", content=b"x", headers={"content-type": "text/plain"}), 415),
            (client.get("/metrics"), 200),
            (client.get("/healthz"), 200),
            (client.get("/openapi.json"), 200),
            (client.head("/"), 200),
        ]
    for r, status in answers:
        assert r.status_code == status, (r.request.url.path, r.status_code, r.text[:200])
        assert_secured(r)


def test_an_unhandled_error_has_the_headers(service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(accept: str | None) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(service.runtime.metrics, "render", broken)
    r = httpx.get(service.http_url + "/metrics")
    assert r.status_code == 500
    assert_secured(r)


def test_docs_are_off_by_default(service: Service) -> None:
    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        r = httpx.get(service.http_url + path)
        assert r.status_code == 404, path
        assert "cdn.jsdelivr.net" not in r.text
    assert httpx.get(service.http_url + "/openapi.json").json()["info"]["title"] == "railtrace"


def test_docs_when_asked_for(tmp_path: Path) -> None:
    with Service(settings_for(f"sqlite:///{tmp_path / 'railtrace.db'}", api_docs=True)) as svc:
        for path in ("/docs", "/redoc"):
            r = httpx.get(svc.http_url + path)
            assert r.status_code == 200 and "cdn.jsdelivr.net" in r.text, path
            csp = r.headers["content-security-policy"]
            assert "https://cdn.jsdelivr.net" in csp and "frame-ancestors 'none'" in csp
            assert r.headers["x-frame-options"] == "DENY"
        assert_secured(httpx.get(svc.http_url + "/"))  # the UI keeps its strict policy
        assert httpx.get(svc.http_url + "/openapi.json").status_code == 200


def test_headers_an_answer_sets_itself_are_kept_and_tls_adds_hsts() -> None:
    import asyncio

    from railtrace.server.security import SecurityHeaders

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"X-Frame-Options", b"SAMEORIGIN")]}
        )
        await send({"type": "http.response.body", "body": b""})

    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request"}

    asyncio.run(SecurityHeaders(app, tls=True)({"type": "http", "path": "/"}, receive, send))
    headers = dict(sent[0]["headers"])
    assert headers[b"X-Frame-Options"] == b"SAMEORIGIN" and b"x-frame-options" not in headers
    assert headers[b"strict-transport-security"].startswith(b"max-age=")
    assert headers[b"content-security-policy"] == CONTENT_SECURITY_POLICY.encode()
