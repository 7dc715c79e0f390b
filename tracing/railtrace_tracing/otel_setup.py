"""A tracer provider for the shims when the host process has none.

vLLM's engine and worker processes have a global tracer provider only when vLLM runs with
`--otlp-traces-endpoint` or under `opentelemetry-instrument`; otherwise every span would go to
the no-op provider. The shims then build their own provider (never made global, so the host can
still set its own) from the standard variables: `OTEL_TRACES_EXPORTER` (`otlp` default, `console`,
`none`), `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`, `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`
(`http/protobuf` default, `grpc` when its exporter is installed), `OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`. It is built only when an exporter is asked for (an endpoint or
`OTEL_TRACES_EXPORTER`), so a pod without collector settings does not retry a dead localhost.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace

from railtrace_tracing._common import logger
from railtrace_tracing.semconv import ENV_OTEL_SETUP


class _Built:
    """The provider this process built (at most one), guarded by a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.decided = False
        self.provider: Any = None


_BUILT = _Built()


def host_provider() -> Any:
    """The host's global provider when it is a real one, else None."""
    current = trace.get_tracer_provider()
    if isinstance(current, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return current


def wants_export(environ: Mapping[str, str]) -> bool:
    if environ.get(ENV_OTEL_SETUP, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(
        exporter
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def build_provider(environ: Mapping[str, str] | None = None) -> Any:
    """An SDK provider with one batch exporter chosen by the standard variables; None if none asked."""
    env = os.environ if environ is None else environ
    if not wants_export(env):
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporter_name = (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")[0].strip().lower()
    if exporter_name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        exporter: Any = ConsoleSpanExporter()
    else:
        protocol = (
            env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or ""
        ).strip().lower() or "http/protobuf"
        exporter = None
        if protocol == "grpc":
            try:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

                exporter = Grpc()
            except ImportError:
                logger.warning("railtrace: OTLP/gRPC exporter not installed; exporting OTLP/HTTP instead")
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

            exporter = Http()
    provider = TracerProvider(resource=Resource.create())
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def provider_for_shims() -> Any:
    """The host's provider if it has one, else the one built from `OTEL_*` (None: the API's global)."""
    host = host_provider()
    if host is not None:
        return host
    if _BUILT.decided:
        return _BUILT.provider
    with _BUILT.lock:
        if not _BUILT.decided:
            try:
                _BUILT.provider = build_provider()
            except Exception:
                logger.warning("railtrace: could not build a tracer provider from OTEL_*", exc_info=True)
            if _BUILT.provider is None:
                logger.info(
                    "railtrace: no tracer provider in this process and no OTEL_EXPORTER_OTLP_ENDPOINT; "
                    "KV spans are not exported"
                )
            _BUILT.decided = True
    return _BUILT.provider


def reset_for_tests() -> None:
    with _BUILT.lock:
        if _BUILT.provider is not None:
            _BUILT.provider.shutdown()
        _BUILT.provider = None
        _BUILT.decided = False
