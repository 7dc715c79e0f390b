"""Gateway shim: ASGI middleware for Python gateways and proxies, and its instrumentor."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import wrapt
from opentelemetry.instrumentation.utils import unwrap

from railtrace_tracing._common import GatedInstrumentor, logger
from railtrace_tracing.gateway.middleware import (
    RailtraceASGIMiddleware,
    emit_gateway_request,
    upstream_headers,
)

__all__ = ["GatewayInstrumentor", "RailtraceASGIMiddleware", "emit_gateway_request", "upstream_headers"]


class GatewayInstrumentor(GatedInstrumentor):
    """Wraps every Starlette/FastAPI app's middleware stack in `RailtraceASGIMiddleware`
    (entry point `railtrace_gateway`). `instrument(tracer_provider=None, span_name=…, excluded_paths=…)`.
    Apps built before `uninstrument()` keep the middleware but it passes requests through."""

    shim_name = "gateway"
    _active = False

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("starlette >= 0.27",)

    def _instrument(self, **kwargs: Any) -> None:
        opts = {k: kwargs[k] for k in ("tracer_provider", "span_name", "excluded_paths") if k in kwargs}
        GatewayInstrumentor._active = True

        def build(wrapped: Any, instance: Any, args: Any, kw: Any) -> Any:
            app = wrapped(*args, **kw)
            if _is_vllm_server(instance):
                return app  # an engine's own API server is not a gateway (RAILTRACE_SHIMS=all in vLLM)
            try:
                return RailtraceASGIMiddleware(app, is_enabled=lambda: GatewayInstrumentor._active, **opts)
            except Exception:
                logger.debug("railtrace gateway: middleware not added", exc_info=True)
                return app

        self._wrapped = []
        for cls in _app_classes():
            if "build_middleware_stack" in vars(cls):  # FastAPI overrides Starlette's
                wrapt.wrap_function_wrapper(cls, "build_middleware_stack", build)
                self._wrapped.append(cls)

    def _uninstrument(self, **kwargs: Any) -> None:
        GatewayInstrumentor._active = False
        for cls in getattr(self, "_wrapped", []):
            unwrap(cls, "build_middleware_stack")
        self._wrapped = []


def _is_vllm_server(app: Any) -> bool:
    """True for vLLM's OpenAI-compatible server: its routes are defined in `vllm.*` modules."""
    try:
        for route in getattr(app, "routes", ()):
            module = getattr(getattr(route, "endpoint", None), "__module__", "") or ""
            if module == "vllm" or module.startswith("vllm."):
                return True
    except Exception:
        logger.debug("railtrace gateway: routes unreadable", exc_info=True)
    return False


def _app_classes() -> list[type]:
    import starlette.applications

    classes: list[type] = [starlette.applications.Starlette]
    try:
        import fastapi

        classes.append(fastapi.FastAPI)
    except ImportError:
        pass
    return classes
