"""Access at the service's edges: bearer tokens, TLS, CORS and exposure warnings. (What an
export may carry is the OTLP codec's concern: `railtrace.otlp.content`.)

Every HTTP answer carries security headers (`SecurityHeaders`): a Content-Security-Policy
that lets pages run only this origin's own scripts and styles (the web UI has no inline ones),
no framing, no MIME sniffing, no referrer. FastAPI's `/docs` and `/redoc` load their scripts
from a public CDN without integrity checks, so they are off unless `api_docs` is set.

Tokens are optional and separate: one for OTLP ingest (`POST /v1/traces`, gRPC `Export`),
one for the query API (`/api/...`), one for Prometheus (`/metrics`; unset by default, so an
existing scrape keeps working). Liveness, readiness and the OpenAPI description stay open so
probes work without secrets. Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import grpc
import orjson

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

INGEST_PATHS = ("/v1/traces",)
API_PREFIX = "/api/"
# Paths the API token and the read gate cover: railtrace's own and Tempo's API, and Jaeger's
# query API under /jaeger (server/routers/jaeger.py).
API_PREFIXES = (API_PREFIX, "/jaeger/api/")
METRICS_PATH = "/metrics"


# The web UI (server/ui/static) is this origin's own script and stylesheet, no inline code; it
# reads /api/v1 and /readyz of the same origin. Nothing may frame a page.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
# FastAPI's Swagger UI and ReDoc pages (only with `api_docs`): their scripts, styles and fonts
# from the CDNs FastAPI names, and their inline start-up script and styles.
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc"})
DOCS_CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; "
    "style-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net https://fonts.googleapis.com; "
    "font-src https://fonts.gstatic.com; img-src 'self' data: https://fastapi.tiangolo.com "
    "https://cdn.redoc.ly; connect-src 'self'; worker-src blob:; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
)
HSTS = (b"strict-transport-security", b"max-age=31536000")


class SecurityHeaders:
    """ASGI middleware: the security headers on every HTTP answer (pages, API, OTLP, errors,
    404s), unless the answer set the header itself. Wrap the whole app (outside Starlette's
    error middleware too, so a 500 has them)."""

    def __init__(self, app: ASGIApp, *, docs: bool = False, tls: bool = False) -> None:
        self.app = app
        self.docs = docs
        common = SECURITY_HEADERS + ((HSTS,) if tls else ())
        self._page = (*common, (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()))
        self._docs_page = (*common, (b"content-security-policy", DOCS_CONTENT_SECURITY_POLICY.encode()))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = self._docs_page if self.docs and scope.get("path") in DOCS_PATHS else self._page

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or ())
                present = {name.lower() for name, _ in headers}
                headers.extend(h for h in extra if h[0] not in present)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def token_ok(header: str | None, token: str | None) -> bool:
    """No token configured: open. Otherwise `Authorization: Bearer <token>` must match."""
    if not token:
        return True
    if not header or header[:7].lower() != "bearer ":
        return False
    return hmac.compare_digest(header[7:].strip().encode(), token.encode())


class AccessMiddleware:
    """ASGI middleware: 401 for ingest, API or metrics calls without the right bearer token."""

    def __init__(
        self, app: ASGIApp, ingest_token: str | None, api_token: str | None, metrics_token: str | None = None
    ) -> None:
        self.app = app
        self.ingest_token = ingest_token or None
        self.api_token = api_token or None
        self.metrics_token = metrics_token or None

    def _token_for(self, path: str) -> str | None:
        if path in INGEST_PATHS:
            return self.ingest_token
        if path.startswith(API_PREFIXES):
            return self.api_token
        if path == METRICS_PATH:
            return self.metrics_token
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = self._token_for(scope.get("path", ""))
        if token is None:
            await self.app(scope, receive, send)
            return
        header = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        if token_ok(header, token):
            await self.app(scope, receive, send)
            return
        body = orjson.dumps({"detail": "missing or wrong bearer token"})
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="railtrace"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class TokenInterceptor(grpc.ServerInterceptor):
    """gRPC: UNAUTHENTICATED for calls without `authorization: Bearer <ingest token>`."""

    def __init__(self, token: str) -> None:
        self.token = token

        def deny(_request: Any, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        self._deny = grpc.unary_unary_rpc_method_handler(deny, request_deserializer=None)

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        header = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                header = value if isinstance(value, str) else value.decode("latin-1")
        if token_ok(header, self.token):
            return continuation(handler_call_details)
        return self._deny


def grpc_credentials(cert_file: str, key_file: str) -> grpc.ServerCredentials:
    """TLS for the gRPC listener from PEM files (the same pair as the HTTP listener)."""
    with open(cert_file, "rb") as f:
        cert = f.read()
    with open(key_file, "rb") as f:
        key = f.read()
    return grpc.ssl_server_credentials([(key, cert)])


def is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def exposure_warnings(host: str, ingest_token: str | None, api_token: str | None, tls: bool) -> list[str]:
    """What an operator should hear when the service listens beyond this machine."""
    if is_loopback(host):
        return []
    warnings = []
    if not ingest_token:
        warnings.append(
            f"listening on {host} without an ingest token: anyone who can reach it can send spans "
            "(set RAILTRACE_INGEST_TOKEN or --ingest-token)"
        )
    if not api_token:
        warnings.append(
            f"listening on {host} without an API token: anyone who can reach it can read traces "
            "(set RAILTRACE_API_TOKEN or --api-token)"
        )
    if (ingest_token or api_token) and not tls:
        warnings.append("bearer tokens travel in clear text without TLS (set --tls-cert and --tls-key)")
    return warnings
