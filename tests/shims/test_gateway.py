"""Gateway ASGI middleware on a real FastAPI app: W3C extract/inject and a `gateway.request` span."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI, Request
from opentelemetry.trace import SpanKind, StatusCode

from railtrace_tracing import semconv as sc
from railtrace_tracing.gateway import GatewayInstrumentor, RailtraceASGIMiddleware, upstream_headers

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def make_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, str]:
        return {
            "seen_traceparent": request.headers.get("traceparent", ""),
            "upstream": upstream_headers({}).get("traceparent", ""),
        }

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("backend down")

    return app


async def _call(app: object, method: str, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://gw.local:8080") as client:
        return await client.request(method, path, headers=headers or {})


@pytest.mark.anyio
async def test_server_span_joins_incoming_trace_and_rewrites_headers(otel) -> None:
    provider, exporter = otel
    app = RailtraceASGIMiddleware(make_app(), tracer_provider=provider)
    resp = await _call(
        app,
        "POST",
        "/v1/chat/completions",
        {"traceparent": PARENT, "tracestate": "vendor=1", "x-request-id": "rid-1"},
    )
    [span] = exporter.get_finished_spans()
    assert span.name == sc.SPAN_GATEWAY_REQUEST and span.kind is SpanKind.SERVER
    assert f"{span.context.trace_id:032x}" == TRACE_ID and span.parent.span_id == 0x00F067AA0BA902B7
    a = span.attributes
    assert a[sc.HTTP_REQUEST_METHOD] == "POST" and a[sc.URL_PATH] == "/v1/chat/completions"
    assert a[sc.HTTP_RESPONSE_STATUS] == 200 and a[sc.HTTP_REQUEST_ID_HEADER] == ("rid-1",)
    body = resp.json()
    own = f"00-{TRACE_ID}-{span.context.span_id:016x}-01"
    assert body["seen_traceparent"] == own  # forwarded headers now name the gateway span
    assert body["upstream"] == own


@pytest.mark.anyio
async def test_app_exception_marks_span_and_still_propagates_as_500(otel) -> None:
    provider, exporter = otel
    app = RailtraceASGIMiddleware(make_app(), tracer_provider=provider)
    resp = await _call(app, "GET", "/boom")
    assert resp.status_code == 500
    [span] = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR and span.attributes[sc.ERROR_TYPE] == "RuntimeError"


@pytest.mark.anyio
async def test_excluded_paths_and_root_without_parent(otel) -> None:
    provider, exporter = otel
    app = RailtraceASGIMiddleware(make_app(), tracer_provider=provider, excluded_paths=("/boom",))
    await _call(app, "GET", "/boom")
    assert exporter.get_finished_spans() == ()
    await _call(app, "POST", "/v1/chat/completions")
    [span] = exporter.get_finished_spans()
    assert span.parent is None


@pytest.mark.anyio
async def test_instrumentor_wraps_new_apps_and_uninstrument_passes_through(otel) -> None:
    provider, exporter = otel
    inst = GatewayInstrumentor()
    inst.instrument(tracer_provider=provider)
    inst.instrument(tracer_provider=provider)  # idempotent
    try:
        app = make_app()
        await _call(app, "POST", "/v1/chat/completions")
        assert len(exporter.get_finished_spans()) == 1
    finally:
        inst.uninstrument()
        inst.uninstrument()
    await _call(app, "POST", "/v1/chat/completions")
    assert len(exporter.get_finished_spans()) == 1
    await _call(make_app(), "POST", "/v1/chat/completions")
    assert len(exporter.get_finished_spans()) == 1


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _BrokenProvider:
    def get_tracer(self, *a: object, **k: object) -> object:
        raise RuntimeError("provider misconfigured")


@pytest.mark.anyio
async def test_broken_tracing_still_serves_the_request() -> None:
    app = RailtraceASGIMiddleware(make_app(), tracer_provider=_BrokenProvider())  # type: ignore[arg-type]
    resp = await _call(app, "POST", "/v1/chat/completions", {"traceparent": PARENT})
    assert resp.status_code == 200
    assert resp.json()["seen_traceparent"] == PARENT  # the caller's context still reaches the app


def test_emit_gateway_request_with_given_times(otel) -> None:
    from railtrace_tracing.gateway import emit_gateway_request

    provider, exporter = otel
    span = emit_gateway_request(
        tracer_provider=provider,
        status_code=503,
        start_time_ns=10,
        end_time_ns=20,
        headers={"traceparent": PARENT},
        request_id="r1",
    )
    assert span is not None
    [done] = exporter.get_finished_spans()
    assert (done.start_time, done.end_time) == (10, 20) and done.kind is SpanKind.SERVER
    assert done.attributes[sc.ERROR_TYPE] == "503" and f"{done.context.trace_id:032x}" == TRACE_ID


@pytest.mark.anyio
async def test_all_shims_in_a_vllm_pod_make_no_gateway_span_from_vllms_server(otel) -> None:
    """RAILTRACE_SHIMS=all in a vLLM pod: vLLM's own FastAPI server (routes defined in `vllm.*`)
    is an engine, not a gateway; a Python router's app in the same process still gets its span."""
    from fastapi import FastAPI

    provider, exporter = otel

    async def create_completion() -> dict[str, str]:
        return {"ok": "yes"}

    create_completion.__module__ = "vllm.entrypoints.openai.api_server"  # where vLLM defines it
    vllm_app = FastAPI()
    vllm_app.post("/v1/completions")(create_completion)
    inst = GatewayInstrumentor()
    inst.instrument(tracer_provider=provider)
    try:
        resp = await _call(vllm_app, "POST", "/v1/completions")
        assert resp.status_code == 200 and exporter.get_finished_spans() == ()
        await _call(make_app(), "POST", "/v1/chat/completions")
        assert [s.name for s in exporter.get_finished_spans()] == ["gateway.request"]
    finally:
        inst.uninstrument()
