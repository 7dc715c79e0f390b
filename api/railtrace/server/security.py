"""Access at the service's edges: bearer tokens, TLS, CORS and exposure warnings. (What an
export may carry is the OTLP codec's concern: `railtrace.otlp.content`.)

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
METRICS_PATH = "/metrics"


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
        if path.startswith(API_PREFIX):
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
