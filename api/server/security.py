"""Access and privacy at the service's edges: bearer tokens, TLS, CORS, exposure warnings,
and the content-attribute filter applied to every export before it is parsed into rows.

Tokens are optional and separate: one for OTLP ingest (`POST /v1/traces`, gRPC `Export`),
one for the query API (`/api/...`). Liveness, readiness, `/metrics` and the OpenAPI
description stay open so probes and Prometheus work without secrets. Tokens are compared
in constant time.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any

import grpc
import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from railtrace.otlp.content import KeyScan
from railtrace.otlp.decode import DEFAULT_DROP, parse_json, parse_protobuf
from railtrace_tracing import semconv

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

INGEST_PATHS = ("/v1/traces",)
API_PREFIX = "/api/"

# Attribute keys dropped at ingest besides the registry's content attributes. A trailing `*`
# matches by prefix: OpenLLMetry and OpenInference flatten messages into indexed keys such as
# `gen_ai.prompt.0.content` and `llm.input_messages.0.message.content`.
DEFAULT_DROP_ATTRIBUTES: tuple[str, ...] = (
    *semconv.CONTENT_ATTRIBUTES,
    "gen_ai.prompt.*",
    "gen_ai.completion.*",
    "llm.prompts.*",
    "llm.input_messages.*",
    "llm.output_messages.*",
    "gen_ai.content.*",
)


def token_ok(header: str | None, token: str | None) -> bool:
    """No token configured: open. Otherwise `Authorization: Bearer <token>` must match."""
    if not token:
        return True
    if not header or header[:7].lower() != "bearer ":
        return False
    return hmac.compare_digest(header[7:].strip().encode(), token.encode())


class AccessMiddleware:
    """ASGI middleware: 401 for ingest or API calls without the right bearer token."""

    def __init__(self, app: ASGIApp, ingest_token: str | None, api_token: str | None) -> None:
        self.app = app
        self.ingest_token = ingest_token or None
        self.api_token = api_token or None

    def _token_for(self, path: str) -> str | None:
        if path in INGEST_PATHS:
            return self.ingest_token
        if path.startswith(API_PREFIX):
            return self.api_token
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


class ContentFilter:
    """Drops configured attribute keys (exact, or prefix with a trailing `*`) from resources,
    spans, span events and span links of an export, before anything is stored.

    A byte scan rules out the usual export that carries none of them, so only exports that
    may hold content pay for a parse here (the store parses the returned message, not the
    bytes, so there is still one parse per export)."""

    def __init__(self, keys: Iterable[str]) -> None:
        exact: set[str] = set()
        prefixes: list[str] = []
        for key in keys:
            key = key.strip()
            if not key:
                continue
            if key.endswith("*"):
                prefixes.append(key[:-1])
            else:
                exact.add(key)
        self.exact = frozenset(exact)
        self.prefixes = tuple(prefixes)
        self.needles = tuple(sorted({k.encode() for k in (*self.exact, *self.prefixes) if k}))
        self._scan = KeyScan(self.needles)
        # Whether what passes this filter is free of every content attribute the store knows,
        # so that the row builder need not search the call again.
        self.covers_content = all(self.drops(k) for k in DEFAULT_DROP)

    def __bool__(self) -> bool:
        return bool(self.needles)

    def drops(self, key: str) -> bool:
        return key in self.exact or (bool(self.prefixes) and key.startswith(self.prefixes))

    def may_match(self, raw: bytes, media: str = "application/x-protobuf") -> bool:
        if media == "application/json" and b"\\u" in raw:
            return True  # a key spelled with JSON escapes would slip past the byte scan
        return self._scan(raw)

    def _strip(self, container: Any) -> int:
        dropped = 0
        for i in range(len(container) - 1, -1, -1):
            if self.drops(container[i].key):
                del container[i]
                dropped += 1
        return dropped

    def strip(self, request: ExportTraceServiceRequest) -> int:
        """Remove matching attributes in place; returns how many were dropped."""
        dropped = 0
        for rs in request.resource_spans:
            dropped += self._strip(rs.resource.attributes)
            for ss in rs.scope_spans:
                dropped += self._strip(ss.scope.attributes)
                for s in ss.spans:
                    dropped += self._strip(s.attributes)
                    for e in s.events:
                        dropped += self._strip(e.attributes)
                    for link in s.links:
                        dropped += self._strip(link.attributes)
        return dropped

    def apply(self, raw: bytes, media: str) -> bytes | ExportTraceServiceRequest:
        """The body unchanged when it cannot hold a matching key, else the parsed, stripped
        request (raises `PayloadError` for a body that is not an export request)."""
        if not self.needles or not self.may_match(raw, media):
            return raw
        request = parse_json(raw) if media == "application/json" else parse_protobuf(raw)
        self.strip(request)
        return request


def content_filter(keys: Sequence[str] | None) -> ContentFilter:
    """The configured keys (default: `DEFAULT_DROP_ATTRIBUTES`); the registry's content
    attributes are dropped whatever the configuration says."""
    return ContentFilter([*semconv.CONTENT_ATTRIBUTES, *(DEFAULT_DROP_ATTRIBUTES if keys is None else keys)])
