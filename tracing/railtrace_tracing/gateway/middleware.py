"""ASGI middleware: the gateway's SERVER span, shaped like llm-d's `gateway.request`.

It extracts W3C `traceparent`/`tracestate` from the incoming request, opens the server span
with HTTP semantic-convention attributes, makes it current (so instrumented HTTP clients
inject it) and rewrites the request's own trace headers to the gateway span, so a proxy that
forwards incoming headers verbatim still hands the right parent to the next hop.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from railtrace_tracing import semconv as sc
from railtrace_tracing._common import extract_context, get_tracer, inject_context, inject_span, logger

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

TRACER_NAME = "railtrace_tracing.gateway"
DEFAULT_EXCLUDED = ("/healthz", "/readyz", "/livez", "/metrics")
_TRACE_HEADERS = {b"traceparent", b"tracestate"}
_READ_HEADERS = {b"traceparent", b"tracestate", b"user-agent", b"x-request-id"}


class RailtraceASGIMiddleware:
    """`app = RailtraceASGIMiddleware(app, tracer_provider=None, span_name="gateway.request")`."""

    def __init__(
        self,
        app: ASGIApp,
        tracer_provider: trace.TracerProvider | None = None,
        span_name: str = sc.SPAN_GATEWAY_REQUEST,
        excluded_paths: tuple[str, ...] = DEFAULT_EXCLUDED,
        rewrite_trace_headers: bool = True,
        is_enabled: Callable[[], bool] | None = None,
    ) -> None:
        self.app = app
        self.tracer = get_tracer(TRACER_NAME, tracer_provider)
        self.span_name = span_name
        self.excluded = excluded_paths
        self.rewrite = rewrite_trace_headers
        self.is_enabled = is_enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or (self.is_enabled is not None and not self.is_enabled()):
            await self.app(scope, receive, send)
            return
        started = self._start(scope)
        if started is None:  # shim failure: serve the request untraced
            await self.app(scope, receive, send)
            return
        span, token, scope = started
        status: int | None = None

        async def send_wrapper(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message.get("type") == "http.response.start":
                status = int(message.get("status", 0))
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except BaseException as exc:
            self._end(span, token, status, exc)
            raise
        self._end(span, token, status, None)

    def _start(self, scope: Scope) -> tuple[trace.Span, object, Scope] | None:
        try:
            path = scope.get("path", "")
            if path in self.excluded:
                return None
            headers: dict[str, str] = {}
            for k, v in scope.get("headers") or ():  # decode only the headers the span uses
                k = k.lower()
                if k in _READ_HEADERS:
                    headers[k.decode("latin-1")] = v.decode("latin-1")
            parent = extract_context(headers)
            attrs: dict[str, Any] = {
                sc.HTTP_REQUEST_METHOD: scope.get("method", ""),
                sc.URL_PATH: path,
                sc.URL_SCHEME: scope.get("scheme", "http"),
            }
            server = scope.get("server")
            if server:
                attrs[sc.SERVER_ADDRESS] = str(server[0])
                if server[1] is not None:
                    attrs[sc.SERVER_PORT] = int(server[1])
            client = scope.get("client")
            if client:
                attrs[sc.CLIENT_ADDRESS] = str(client[0])
            if "user-agent" in headers:
                attrs[sc.USER_AGENT] = headers["user-agent"]
            if scope.get("http_version"):
                attrs[sc.NETWORK_PROTOCOL_VERSION] = str(scope["http_version"])
            if "x-request-id" in headers:
                attrs[sc.HTTP_REQUEST_ID_HEADER] = [headers["x-request-id"]]
            route = scope.get("route")
            if route is not None and getattr(route, "path", None):
                attrs[sc.HTTP_ROUTE] = route.path
            span = self.tracer.start_span(
                self.span_name,
                context=parent,
                kind=SpanKind.SERVER,
                attributes=attrs,
                start_time=time.time_ns(),
            )
            token = otel_context.attach(trace.set_span_in_context(span, parent))
            carrier: dict[str, str] = {}
            if self.rewrite:
                inject_span(carrier, span)
            if carrier:  # nothing to inject (non-recording span): keep the caller's headers
                new_headers = [
                    (k, v) for k, v in scope.get("headers") or () if k.lower() not in _TRACE_HEADERS
                ]
                new_headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in carrier.items()]
                scope = dict(scope)
                scope["headers"] = new_headers
            return span, token, scope
        except Exception:
            logger.debug("railtrace gateway: span not started", exc_info=True)
            return None

    @staticmethod
    def _end(span: trace.Span, token: object, status: int | None, exc: BaseException | None) -> None:
        try:
            if exc is not None:
                span.record_exception(exc)
                if status is not None:
                    span.set_attribute(sc.HTTP_RESPONSE_STATUS, status)
                span.set_attribute(sc.ERROR_TYPE, type(exc).__qualname__)
                span.set_status(Status(StatusCode.ERROR, str(exc) or type(exc).__qualname__))
            elif status is not None and status >= 500:
                span.set_attributes({sc.HTTP_RESPONSE_STATUS: status, sc.ERROR_TYPE: str(status)})
                span.set_status(Status(StatusCode.ERROR))
            elif status is not None:
                span.set_attribute(sc.HTTP_RESPONSE_STATUS, status)
            span.end()
        except Exception:
            logger.debug("railtrace gateway: span not ended", exc_info=True)
        try:
            otel_context.detach(token)  # type: ignore[arg-type]
        except Exception:
            logger.debug("railtrace gateway: context not detached", exc_info=True)


def upstream_headers(headers: MutableMapping[str, str] | None = None) -> MutableMapping[str, str]:
    """Headers for a call to the next hop, carrying the current span's `traceparent`/`tracestate`."""
    out: MutableMapping[str, str] = {} if headers is None else headers
    try:
        carrier: dict[str, str] = {}
        inject_context(carrier)
        if carrier:
            for key in [k for k in out if k.lower() in ("traceparent", "tracestate")]:
                del out[key]
            out.update(carrier)
    except Exception:
        logger.debug("railtrace gateway: inject failed", exc_info=True)
    return out


def emit_gateway_request(
    *,
    tracer_provider: trace.TracerProvider | None = None,
    method: str = "POST",
    path: str = "/v1/chat/completions",
    status_code: int | None = 200,
    start_time_ns: int,
    end_time_ns: int,
    headers: Mapping[str, str] | None = None,
    parent: otel_context.Context | None = None,
    request_id: str | None = None,
    server_address: str | None = None,
    error_type: str | None = None,
) -> trace.Span | None:
    """A finished `gateway.request` span with given times (simulators, replays); the returned span
    can parent children via `trace.set_span_in_context(span)`. Never raises."""
    try:
        attrs: dict[str, Any] = {sc.HTTP_REQUEST_METHOD: method, sc.URL_PATH: path, sc.URL_SCHEME: "http"}
        if status_code is not None:
            attrs[sc.HTTP_RESPONSE_STATUS] = int(status_code)
        if request_id:
            attrs[sc.HTTP_REQUEST_ID_HEADER] = [request_id]
        if server_address:
            attrs[sc.SERVER_ADDRESS] = server_address
        ctx = parent if parent is not None else extract_context(headers or {})
        span = get_tracer(TRACER_NAME, tracer_provider).start_span(
            sc.SPAN_GATEWAY_REQUEST,
            context=ctx,
            kind=SpanKind.SERVER,
            attributes=attrs,
            start_time=start_time_ns,
        )
        err = error_type or (str(status_code) if status_code is not None and status_code >= 500 else None)
        if err:
            span.set_attribute(sc.ERROR_TYPE, err)
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=end_time_ns)
        return span
    except Exception:
        logger.debug("railtrace gateway: span not emitted", exc_info=True)
        return None
