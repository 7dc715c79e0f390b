"""Helpers every shim shares: tracer lookup, env switches, and the never-raise guard."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from railtrace_tracing import __version__
from railtrace_tracing.semconv import ENV_ENABLE

logger = logging.getLogger("railtrace_tracing")
_T = TypeVar("_T")
_W3C = TraceContextTextMapPropagator()
SCHEMA_URL = "https://opentelemetry.io/schemas/1.26.0"


_TRACERS: dict[tuple[str, int], tuple[trace.TracerProvider, trace.Tracer]] = {}


def get_tracer(name: str, tracer_provider: trace.TracerProvider | None = None) -> trace.Tracer:
    """A tracer of the shim `name` on the given provider (the global one when None).

    Cached per provider object: creating an SDK tracer costs more than a span.
    """
    if tracer_provider is None:
        tracer_provider = trace.get_tracer_provider()  # a later set_tracer_provider gives a new key
    key = (name, id(tracer_provider))
    hit = _TRACERS.get(key)
    if hit is not None and hit[0] is tracer_provider:
        return hit[1]
    try:
        tracer = trace.get_tracer(name, __version__, tracer_provider, schema_url=SCHEMA_URL)
    except Exception:  # a broken provider costs the spans, never the host
        logger.warning("railtrace: tracer provider failed; %s emits nothing", name, exc_info=True)
        return trace.NoOpTracer()
    if len(_TRACERS) > 256:
        _TRACERS.clear()
    _TRACERS[key] = (tracer_provider, tracer)
    return tracer


def enabled_shims(environ: Mapping[str, str] | None = None) -> set[str]:
    """Shims switched on by `RAILTRACE_SHIMS` (`all` or a comma list); empty when unset."""
    raw = (environ if environ is not None else os.environ).get(ENV_ENABLE, "")
    names = {p.strip().lower() for p in raw.split(",") if p.strip()}
    if names & {"all", "1", "true", "yes"}:
        return {"nixl", "gateway", "router", "pd", "vllm"}
    return names


def shim_enabled(name: str, environ: Mapping[str, str] | None = None) -> bool:
    return name in enabled_shims(environ)


def guarded(default: Any = None) -> Callable[[Callable[..., _T]], Callable[..., _T]]:
    """Run shim-internal code so that a bug in it costs a span, never the host's request."""

    def deco(fn: Callable[..., _T]) -> Callable[..., _T]:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> _T:
            try:
                return fn(*args, **kwargs)
            except Exception:
                logger.debug("railtrace shim failure in %s", fn.__qualname__, exc_info=True)
                return default

        return inner

    return deco


class _MappingGetter(Getter[Mapping[str, Any]]):
    def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
        v = carrier.get(key)  # headers are usually lower-case already: skip the scan
        if type(v) is str:
            return [v]
        for k, v in carrier.items():
            if str(k).lower() == key:
                if v is None:
                    return None
                return [str(x) for x in v] if isinstance(v, list | tuple) else [str(v)]
        return None

    def keys(self, carrier: Mapping[str, Any]) -> list[str]:
        return [str(k) for k in carrier]


MAPPING_GETTER = _MappingGetter()


_LOWER_HEX = frozenset("0123456789abcdef-")
_EMPTY_CONTEXT = otel_context.Context()


def _fast_traceparent(value: Any) -> otel_context.Context | None:
    """The common case (version 00, lower-case, no `tracestate`) parsed as the W3C propagator
    does, without its regular expression; None hands the header to the propagator."""
    if (
        type(value) is not str
        or len(value) != 55
        or value[2] != "-"
        or value[35] != "-"
        or value[52] != "-"
        or not value.startswith("00-")
        or not _LOWER_HEX.issuperset(value)
        or value.count("-") != 3
    ):
        return None
    trace_id, span_id = int(value[3:35], 16), int(value[36:52], 16)
    if not trace_id or not span_id:
        return None
    span_context = trace.SpanContext(
        trace_id=trace_id,
        span_id=span_id,
        is_remote=True,
        trace_flags=trace.TraceFlags(int(value[53:], 16)),
        trace_state=None,
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(span_context), _EMPTY_CONTEXT)


def extract_context(carrier: Mapping[str, Any] | None) -> otel_context.Context | None:
    """W3C trace context from a header-like mapping; None when it carries no valid `traceparent`."""
    if not carrier:
        return None
    if "tracestate" not in carrier and "Tracestate" not in carrier:
        fast = _fast_traceparent(carrier.get("traceparent"))
        if fast is not None:
            return fast
    ctx = _W3C.extract(carrier, getter=MAPPING_GETTER)
    span_ctx = trace.get_current_span(ctx).get_span_context()
    return ctx if span_ctx.is_valid else None


def inject_context(carrier: dict[str, str], ctx: otel_context.Context | None = None) -> dict[str, str]:
    """Write `traceparent`/`tracestate` of `ctx` (current when None) into `carrier`."""
    _W3C.inject(carrier, context=ctx)
    return carrier


def inject_span(carrier: Any, span: trace.Span | None) -> Any:
    """`inject_context` for one span, without building a context: the same W3C headers."""
    if span is None:
        return inject_context(carrier)
    sc = span.get_span_context()
    if sc == trace.INVALID_SPAN_CONTEXT:
        return carrier
    carrier["traceparent"] = f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}"
    if sc.trace_state:
        carrier["tracestate"] = sc.trace_state.to_header()
    return carrier


class GatedInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Instrumentor that `opentelemetry-instrument` loads but that stays off unless
    `RAILTRACE_SHIMS` names it; an explicit `instrument()` call always enables it.
    `instrument()`/`uninstrument()` never raise into the host application."""

    shim_name = ""
    shim_aliases: frozenset[str] = frozenset()  # other `RAILTRACE_SHIMS` words that enable it

    def instrument(self, **kwargs: Any) -> Any:
        # opentelemetry-instrument passes skip_dep_check=True; explicit callers normally don't.
        if kwargs.get("skip_dep_check") and not kwargs.get("force"):
            names = {self.shim_name} | set(self.shim_aliases)
            if not (enabled_shims() & names):
                return None
        try:
            return super().instrument(**kwargs)
        except Exception:
            logger.warning("railtrace: %s shim not enabled", self.shim_name, exc_info=True)
            return None

    def uninstrument(self, **kwargs: Any) -> Any:
        try:
            return super().uninstrument(**kwargs)
        except Exception:
            logger.warning("railtrace: %s shim not disabled cleanly", self.shim_name, exc_info=True)
            return None
