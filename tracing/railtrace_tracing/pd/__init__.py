"""Prefill/decode shim: sidecar-compatible proxy spans and vLLM-compatible engine spans.

Proxy spans follow llm-d's P/D sidecar (nixlv2 serial path): an inbound SERVER span
`llm_d.pd_proxy.<METHOD> <path>`, `forward_request` under it, `prefill` under that and
`decode` as a child of `prefill` (the sidecar's quirk, kept so both read the same), with the
roll-up `llm_d.pd_proxy.*_ms` attributes on `decode`. Engine spans imitate vLLM's
`llm_request` (`gen_ai.latency.*` in seconds) and add `llm_d.role`. Everything takes
optional start/end times in ns so a simulator can emit realistic timings.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from railtrace_tracing import semconv as sc
from railtrace_tracing._common import extract_context, get_tracer, inject_span, logger

TRACER_NAME = "railtrace_tracing.pd"


def _ms(ns: int) -> float:
    """Whole milliseconds as float, like the sidecar's `Milliseconds()`."""
    return float(ns // 1_000_000)


def _start(
    tracer: trace.Tracer,
    name: str,
    parent: otel_context.Context | None,
    kind: SpanKind,
    attrs: Mapping[str, Any],
    start_ns: int | None,
) -> trace.Span | None:
    try:
        return tracer.start_span(
            name,
            context=parent,
            kind=kind,
            attributes=attrs,  # the SDK copies it
            start_time=start_ns if start_ns is not None else time.time_ns(),
        )
    except Exception:
        logger.debug("railtrace pd: %s not started", name, exc_info=True)
        return None


def _end(
    span: trace.Span | None,
    end_ns: int | None,
    attrs: Mapping[str, Any] | None = None,
    error: BaseException | None = None,
) -> None:
    if span is None:
        return
    with contextlib.suppress(Exception):
        if attrs:
            span.set_attributes(attrs)
        if error is not None:
            span.set_attribute(sc.ERROR_TYPE, type(error).__qualname__)
            span.set_status(Status(StatusCode.ERROR, str(error) or type(error).__qualname__))
        span.end(end_time=end_ns)


def _ctx_of(
    span: trace.Span | None, fallback: otel_context.Context | None = None
) -> otel_context.Context | None:
    return trace.set_span_in_context(span, fallback) if span is not None else fallback


@dataclass
class Leg:
    """An open `prefill` or `decode` span; `headers()` gives what to send to that engine."""

    span: trace.Span | None
    request_id: str
    start_ns: int
    status_code: int | None = None

    def headers(self, extra: MutableMapping[str, str] | None = None) -> MutableMapping[str, str]:
        """`traceparent`/`tracestate` of this leg and `x-request-id`, for the HTTP call to the engine."""
        out: MutableMapping[str, str] = {} if extra is None else extra
        with contextlib.suppress(Exception):
            inject_span(out, self.span)
            out["x-request-id"] = self.request_id
        return out

    def kv_transfer_params(self, params: Mapping[str, Any] | None) -> dict[str, Any]:
        """`params` plus this leg's W3C headers under `trace_headers`, so the KV shim in the
        decode engine parents its `llm_d.kv_transfer` span on this request's trace."""
        out = dict(params or {})
        with contextlib.suppress(Exception):
            out[sc.KV_PARAM_TRACE_HEADERS] = inject_span({}, self.span)
        return out


class ProxyRequest:
    """One proxied request: `forward_request`, then `prefill()` and `decode()` legs."""

    def __init__(
        self,
        rec: PDProxyRecorder,
        server: trace.Span | None,
        forward: trace.Span | None,
        request_id: str,
        connector: str,
        start_ns: int,
    ) -> None:
        self._rec = rec
        self.server = server
        self.forward = forward
        self.request_id = request_id
        self.connector = connector
        self.start_ns = start_ns
        self.prefill_leg: Leg | None = None
        self.prefill_end_ns: int | None = None

    @contextlib.contextmanager
    def prefill(
        self, target: str, *, start_time_ns: int | None = None, end_time_ns: int | None = None
    ) -> Iterator[Leg]:
        """The `prefill` span (INTERNAL) under `forward_request`."""
        start = start_time_ns if start_time_ns is not None else time.time_ns()
        self._set_forward({sc.PD_PREFILL_TARGET: target, sc.PD_DISAGG_USED: True})
        span = _start(
            self._rec.tracer,
            sc.SPAN_PD_PREFILL,
            _ctx_of(self.forward),
            SpanKind.INTERNAL,
            {
                sc.PD_REQUEST_ID: self.request_id,
                sc.PD_PREFILL_TARGET: target,
                sc.PD_CONNECTOR: self.connector,
            },
            start,
        )
        leg = Leg(span, self.request_id, start)
        self.prefill_leg = leg
        err: BaseException | None = None
        try:
            yield leg
        except BaseException as exc:
            err = exc
            raise
        finally:
            end = end_time_ns if end_time_ns is not None else time.time_ns()
            self.prefill_end_ns = end
            attrs: dict[str, Any] = {sc.PD_PREFILL_LEG_DURATION_MS: _ms(end - start)}
            if leg.status_code is not None:
                attrs[sc.PD_PREFILL_STATUS] = int(leg.status_code)
            _end(span, end, attrs, err)

    @contextlib.contextmanager
    def decode(
        self,
        target: str,
        *,
        streaming: bool = False,
        start_time_ns: int | None = None,
        end_time_ns: int | None = None,
    ) -> Iterator[Leg]:
        """The `decode` span, a child of `prefill` (as in the sidecar), with the roll-ups."""
        start = start_time_ns if start_time_ns is not None else time.time_ns()
        parent_span = self.prefill_leg.span if self.prefill_leg else self.forward
        span = _start(
            self._rec.tracer,
            sc.SPAN_PD_DECODE,
            _ctx_of(parent_span),
            SpanKind.INTERNAL,
            {
                sc.PD_REQUEST_ID: self.request_id,
                sc.PD_CONNECTOR: self.connector,
                sc.PD_DECODE_TARGET: target,
                sc.PD_DECODE_STREAMING: bool(streaming),
            },
            start,
        )
        leg = Leg(span, self.request_id, start)
        err: BaseException | None = None
        try:
            yield leg
        except BaseException as exc:
            err = exc
            raise
        finally:
            end = end_time_ns if end_time_ns is not None else time.time_ns()
            p_start = self.prefill_leg.start_ns if self.prefill_leg else start
            p_end = self.prefill_end_ns if self.prefill_end_ns is not None else start
            prefill_ms, decode_ms, total_ms = _ms(p_end - p_start), _ms(end - start), _ms(end - self.start_ns)
            _end(
                span,
                end,
                {
                    sc.PD_DECODE_LEG_DURATION_MS: decode_ms,
                    sc.PD_TOTAL_DURATION_MS: total_ms,
                    sc.PD_TRUE_TTFT_MS: _ms(start - self.start_ns),
                    sc.PD_PREFILL_DURATION_MS: prefill_ms,
                    sc.PD_DECODE_DURATION_MS: decode_ms,
                    sc.PD_COORDINATOR_OVERHEAD_MS: max(0.0, total_ms - prefill_ms - decode_ms),
                },
                err,
            )

    def _set_forward(self, attrs: Mapping[str, Any]) -> None:
        if self.forward is not None:
            with contextlib.suppress(Exception):
                self.forward.set_attributes(attrs)


class PDProxyRecorder:
    """Spans of a Python P/D proxy on `tracer_provider` (global when None)."""

    def __init__(
        self, tracer_provider: trace.TracerProvider | None = None, connector: str = "nixlv2"
    ) -> None:
        self.tracer = get_tracer(TRACER_NAME, tracer_provider)
        self.connector = connector

    @contextlib.contextmanager
    def request(
        self,
        method: str = "POST",
        path: str = "/v1/chat/completions",
        *,
        headers: Mapping[str, str] | None = None,
        parent: otel_context.Context | None = None,
        request_id: str | None = None,
        start_time_ns: int | None = None,
        end_time_ns: int | None = None,
    ) -> Iterator[ProxyRequest]:
        """Inbound server span + `forward_request`; the parent comes from `headers` (W3C) or `parent`."""
        start = start_time_ns if start_time_ns is not None else time.time_ns()
        ctx = parent if parent is not None else extract_context(headers or {})
        rid = request_id or str(uuid.uuid4())
        server = _start(
            self.tracer,
            f"{sc.SPAN_PD_SERVER_PREFIX}{method} {path}",
            ctx,
            SpanKind.SERVER,
            {sc.HTTP_REQUEST_METHOD: method, sc.URL_PATH: path},
            start,
        )
        forward = _start(
            self.tracer,
            sc.SPAN_PD_FORWARD,
            _ctx_of(server, ctx),
            SpanKind.SERVER,
            {
                sc.PD_CONNECTOR: self.connector,
                sc.PD_KV_CONNECTOR: "nixl",
                sc.PD_REQUEST_PATH: path,
            },
            start,
        )
        req = ProxyRequest(self, server, forward, rid, self.connector, start)
        err: BaseException | None = None
        try:
            yield req
        except BaseException as exc:
            err = exc
            raise
        finally:
            end = end_time_ns if end_time_ns is not None else time.time_ns()
            _end(forward, end, None, err)
            _end(server, end, None, err)


class EngineRecorder:
    """vLLM-compatible `llm_request` spans (SERVER) for engines that do not emit them."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None, role: str | None = None) -> None:
        self.tracer = get_tracer(TRACER_NAME, tracer_provider)
        self.role = role

    def llm_request(
        self,
        *,
        request_id: str,
        arrival_time_ns: int,
        queued_time_ns: int | None = None,
        scheduled_time_ns: int,
        first_token_time_ns: int,
        last_token_time_ns: int,
        end_time_ns: int | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        max_tokens: int | None = None,
        model: str | None = None,
        role: str | None = None,
        trace_headers: Mapping[str, str] | None = None,
        parent: otel_context.Context | None = None,
        error: str | None = None,
    ) -> trace.Span | None:
        """Emit one finished `llm_request` from the engine's timestamps (ns).

        On the decode side `time_in_queue` (scheduled − queued) includes the wait for the
        remote KV blocks, as in vLLM; the KV span shows what that wait was made of.
        """
        try:
            queued = queued_time_ns if queued_time_ns is not None else arrival_time_ns
            end = end_time_ns if end_time_ns is not None else last_token_time_ns
            s = 1e-9
            attrs: dict[str, Any] = {
                sc.GEN_AI_REQUEST_ID: request_id,
                sc.VLLM_TTFT: (first_token_time_ns - arrival_time_ns) * s,
                sc.VLLM_E2E: (last_token_time_ns - arrival_time_ns) * s,
                sc.VLLM_QUEUE: (scheduled_time_ns - queued) * s,
                sc.VLLM_PREFILL: (first_token_time_ns - scheduled_time_ns) * s,
                sc.VLLM_DECODE: (last_token_time_ns - first_token_time_ns) * s,
                sc.VLLM_INFERENCE: (last_token_time_ns - scheduled_time_ns) * s,
            }
            for key, val in (
                (sc.VLLM_PROMPT_TOKENS, prompt_tokens),
                (sc.VLLM_COMPLETION_TOKENS, completion_tokens),
                (sc.GEN_AI_MAX_TOKENS, max_tokens),
                (sc.GEN_AI_RESPONSE_MODEL, model),
                (sc.LLM_D_ROLE, role or self.role),
            ):
                if val is not None:
                    attrs[key] = val
            ctx = parent if parent is not None else extract_context(trace_headers or {})
            span = self.tracer.start_span(
                sc.SPAN_VLLM_REQUEST,
                context=ctx,
                kind=SpanKind.SERVER,
                attributes=attrs,
                start_time=arrival_time_ns,
            )
            if error:
                span.set_attribute(sc.ERROR_TYPE, error)
                span.set_status(Status(StatusCode.ERROR, error))
            span.end(end_time=end)
            return span
        except Exception:
            logger.debug("railtrace pd: llm_request not emitted", exc_info=True)
            return None


__all__ = ["EngineRecorder", "Leg", "PDProxyRecorder", "ProxyRequest"]
