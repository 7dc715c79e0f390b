"""The app factory: one FastAPI app per `Settings`, its runtime held on `app.state`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from railtrace.server import otlp_http
from railtrace.server.read_gate import ReadAdmission, ReadGate
from railtrace.server.routers import health, jaeger, tempo
from railtrace.server.routers import v1 as api_v1
from railtrace.server.runtime import Runtime
from railtrace.server.security import AccessMiddleware, ASGIApp, SecurityHeaders
from railtrace.server.ui import create_router as ui_router
from railtrace.server.ui import not_found_page
from railtrace.settings import Settings


def _operation_id(route: APIRoute) -> str:
    """Stable OpenAPI operation ids (`{tag}-{name}`) for generated clients."""
    tag = route.tags[0] if route.tags else "default"
    return f"{tag}-{route.name}"


def _error(description: str, *media: str) -> dict[str, Any]:
    return {"description": description, "content": {m: {} for m in media or ("application/json",)}}


OTLP_MEDIA = ("application/x-protobuf", "application/json")
# Every answer the receivers and the API give, so clients (and schema checkers) know them all.
OTLP_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: _error("Accepted and committed; `partial_success` counts rejected spans", *OTLP_MEDIA),
    400: _error("Not an OTLP export request (google.rpc.Status)", *OTLP_MEDIA),
    401: _error("Missing or wrong ingest bearer token"),
    408: _error("Body not received in time", *OTLP_MEDIA),
    413: _error("Body over the size limit, before or after decompression", *OTLP_MEDIA),
    415: _error("Media type or content encoding not supported", *OTLP_MEDIA),
    429: _error("Ingest is behind; retry after `Retry-After` seconds", *OTLP_MEDIA),
    503: _error("Writes are failing or the service is stopping; retry after `Retry-After`", *OTLP_MEDIA),
}
API_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _error("Parameter values the service cannot serve (bad cursor, range, id)"),
    401: _error("Missing or wrong API bearer token"),
    404: _error("Not found (yet: requests are assembled after a quiet period)"),
    503: _error("A part the answer needs is unavailable, or too many reads wait already (`Retry-After`)"),
}


class RailtraceApp(FastAPI):
    """FastAPI with railtrace's security headers on every answer: around the whole middleware
    stack, so the 500s that Starlette's outermost error middleware writes have them too."""

    def __init__(self, *, settings: Settings, **kw: Any) -> None:
        super().__init__(**kw)
        self._security = {"docs": settings.api_docs, "tls": bool(settings.tls_cert)}

    def build_middleware_stack(self) -> ASGIApp:
        return SecurityHeaders(super().build_middleware_stack(), **self._security)


def create_app(settings: Settings, runtime: Runtime | None = None) -> FastAPI:
    """Build the app. Without `runtime` the app owns one and starts/stops it with its lifespan;
    `Service` passes a runtime it shares with the gRPC server."""
    owned = runtime is None
    rt = runtime if runtime is not None else Runtime(settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if owned:
            await run_in_threadpool(rt.start)
        try:
            yield
        finally:
            if owned:
                await run_in_threadpool(rt.stop)

    app = RailtraceApp(
        settings=settings,
        title="railtrace",
        summary="Topology-aware tracing for llm-d prefill/decode serving",
        version="0.1.0",
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
        # Off unless asked for: FastAPI's pages load their scripts from a public CDN.
        docs_url="/docs" if settings.api_docs else None,
        redoc_url="/redoc" if settings.api_docs else None,
    )
    app.state.runtime = rt
    # Innermost of the middlewares: a read refused for its token never takes a turn.
    app.state.reads = ReadAdmission(
        settings.read_concurrency,
        settings.read_queue,
        settings.read_wait_s,
        busy=lambda: rt.writer.pending > 0,
        busy_concurrency=settings.read_concurrency_ingesting,
        busy_share=settings.read_share_ingesting,
    )
    app.add_middleware(ReadGate, admission=app.state.reads, retry_after_s=settings.retry_after_s)
    if settings.cors_origins:  # CORS is off unless origins are listed
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "content-encoding"],
        )
    if settings.ingest_token or settings.api_token or settings.metrics_token:
        app.add_middleware(
            AccessMiddleware,
            ingest_token=settings.ingest_token,
            api_token=settings.api_token,
            metrics_token=settings.metrics_token,
        )
    app.include_router(otlp_http.router, responses=OTLP_RESPONSES)
    app.include_router(health.router)
    app.include_router(api_v1.router, responses=API_RESPONSES)
    app.include_router(tempo.router, responses=API_RESPONSES)  # Grafana's Tempo data source
    app.include_router(jaeger.router)  # Grafana's Jaeger data source, at <base>/jaeger
    app.include_router(
        ui_router(settings.grafana_url, settings.grafana_datasource_uid)
    )  # the read-only web UI at `/`; its data comes from /api/v1
    app.add_exception_handler(StarletteHTTPException, not_found_page)  # HTML 404 outside the APIs
    return app
