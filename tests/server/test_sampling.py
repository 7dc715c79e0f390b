"""The traced share from sampling thresholds in tracestate (`railtrace.server.sampling`): the
threshold arithmetic, and a running service fed by the official OpenTelemetry SDK, whose spans
carry the `ot=th:` tracestate a consistent-probability sampler upstream wrote, on both stores."""

from __future__ import annotations

import math

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from railtrace.server.runner import Service
from railtrace.server.sampling import ThresholdWindow, sampling_probability
from railtrace_tracing import semconv
from tests.service_helpers import settings_for, wait_for


@pytest.mark.parametrize(
    ("tracestate", "probability"),
    [
        ("ot=th:0", 1.0),
        ("ot=th:8", 0.5),
        ("ot=th:c", 0.25),
        ("ot=th:e6", 0.1015625),  # 1 - 0xe6/0x100
        ("vendor=x,ot=rv:0123456789abcd;th:fd", 3 / 256),
        ("ot=th:ffffffffffffff", 2.0**-56),
        ("ot=th:", None),
        ("ot=th:xyz", None),
        ("ot=th:0x8", None),
        ("ot=th:fffffffffffffff", None),  # 15 digits
        ("ot=rv:abc", None),
        ("vendor=th:8", None),
        ("", None),
    ],
)
def test_threshold_to_probability(tracestate: str, probability: float | None) -> None:
    assert sampling_probability(tracestate) == probability


def test_window_counts_each_trace_once_and_forgets_old_buckets() -> None:
    now = [1_800_000_000.0]
    window = ThresholdWindow(60.0, clock=lambda: now[0])
    window._add([("a", 0.25), ("b", 0.25), ("a", 0.25), ("c", None)])
    e = window.estimate()
    assert (e.traced, e.total, e.share, e.without_threshold) == (2, 8.0, 0.25, 1)
    now[0] += 120
    e = window.estimate()
    assert e.share is None and e.reason and e.traced is None


def _traces(tracestate: str | None, n: int, first: int) -> list:
    """`n` decode-engine `llm_request` spans, each in its own trace, whose parent context came
    in over W3C trace context with `tracestate` (the official SDK keeps it on every span of the
    trace under its default parent-based sampler)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "vllm-decode", "k8s.pod.name": "decode-0"})
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("vllm.tracing")
    for i in range(first, first + n):
        headers = {"traceparent": f"00-{0xC0FFEE000 + i:032x}-{0xABC000 + i:016x}-01"}
        if tracestate:
            headers["tracestate"] = tracestate
        ctx = TraceContextTextMapPropagator().extract(headers)
        attrs = {"gen_ai.request.id": f"chatcmpl-s{i}", "gen_ai.latency.time_to_first_token": 0.05}
        with tracer.start_as_current_span(
            semconv.SPAN_VLLM_REQUEST, context=ctx, kind=SpanKind.SERVER, attributes=attrs
        ):
            pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def _gauge(svc: Service, source: str) -> float | None:
    prefix = f'{semconv.M_TRACED_SHARE}{{source="{source}"}} '
    for line in httpx.get(svc.http_url + "/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_share_from_tracestate_thresholds(db_url: str) -> None:
    # The client span above the engines is not sent: assemble without waiting for a root.
    with Service(settings_for(db_url, max_trace_wait_s=0.5)) as svc:
        coverage = httpx.get(svc.http_url + "/api/v1/stats", params={"group_by": "coverage"}).json()
        assert coverage["sampling"]["traced_share"] is None  # nothing seen: unknown, not 1
        assert coverage["sampling"]["estimates"]["tracestate"]["reason"]
        assert _gauge(svc, "tracestate") is None
        spans = _traces("ot=th:c", 8, 0) + _traces(None, 3, 100)
        exporter = OTLPSpanExporter(endpoint=svc.http_url + "/v1/traces")
        try:
            assert exporter.export(spans[:5]) == SpanExportResult.SUCCESS
            assert exporter.export(spans[5:]) == SpanExportResult.SUCCESS
            assert exporter.export(spans[:2]) == SpanExportResult.SUCCESS  # a retry counts nothing again
        finally:
            exporter.shutdown()
        body = httpx.get(svc.http_url + "/api/v1/stats", params={"group_by": "coverage"}).json()
        sampling = body["sampling"]
        assert sampling["traced_share"] == pytest.approx(0.25)
        assert sampling["source"] == "tracestate" and sampling["sampled"] is True
        est = sampling["estimates"]["tracestate"]
        assert (est["traced"], est["total"], est["without_threshold"]) == (8, 32.0, 3)
        assert set(body) >= {"group_by", "since", "until", "groups"}  # the keys it always had
        assert _gauge(svc, "tracestate") == pytest.approx(0.25)
        assert _gauge(svc, "prometheus") is None  # no Prometheus given: no series
        # The stats groups still count the traced requests (as before), now labelled sampled.
        wait_for(
            lambda: (
                sum(
                    g["requests"]
                    for g in httpx.get(
                        svc.http_url + "/api/v1/stats", params={"group_by": "coverage"}
                    ).json()["groups"]
                )
                == 11
            ),
            what="the 11 traced requests to be assembled",
        )


def test_prometheus_unreachable_is_unknown(db_url: str) -> None:
    """A Prometheus that does not answer gives an unknown share and a NaN gauge, never 1."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    settings = settings_for(db_url, prometheus_url=f"http://127.0.0.1:{port}", sampling_refresh_s=0.2)
    with Service(settings) as svc:
        reason = wait_for(
            lambda: (
                httpx.get(svc.http_url + "/api/v1/stats", params={"group_by": "coverage"})
                .json()["sampling"]["estimates"]["prometheus"]["reason"]
                .startswith("Prometheus at")
            ),
            what="the failed Prometheus query to be reported",
        )
        assert reason
        sampling = httpx.get(svc.http_url + "/api/v1/stats", params={"group_by": "coverage"}).json()[
            "sampling"
        ]
        assert sampling["traced_share"] is None and sampling["source"] is None
        value = _gauge(svc, "prometheus")
        assert value is not None and math.isnan(value)
