"""Prometheus metrics of the service, built from `semconv.METRICS` (the one registry of names).

Each service instance owns its own `CollectorRegistry` (no module globals), so tests and the
demo can run several services in one process. Request-level series carry an OpenMetrics
exemplar with the trace id, so a Grafana panel links straight to the request.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import generate_latest as text_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST as TEXT_CONTENT_TYPE
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_CONTENT_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from railtrace_tracing import semconv


def _family(metric: semconv.Metric, registry: CollectorRegistry) -> Any:
    if metric.type == "counter":
        return Counter(metric.name, metric.description, metric.labels, registry=registry)
    if metric.type == "gauge":
        return Gauge(metric.name, metric.description, metric.labels, registry=registry)
    if metric.type == "histogram":
        kw: dict[str, Any] = {"buckets": metric.buckets} if metric.buckets else {}
        return Histogram(metric.name, metric.description, metric.labels, registry=registry, **kw)
    raise ValueError(f"unknown metric type {metric.type!r} for {metric.name}")


def _label(value: Any) -> str:
    return "" if value is None else str(value)[:128]


class Metrics:
    """The service's metric families plus the update rules (count changes only)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.families: dict[str, Any] = {m.name: _family(m, self.registry) for m in semconv.METRICS}

    def __getitem__(self, name: str) -> Any:
        return self.families[name]

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """Exposition body and content type; OpenMetrics (with exemplars) when asked for."""
        if accept and "application/openmetrics-text" in accept:
            return openmetrics_latest(self.registry), OPENMETRICS_CONTENT_TYPE
        return text_latest(self.registry), TEXT_CONTENT_TYPE

    # -- ingest -------------------------------------------------------------------------------

    def export_done(self, protocol: str, outcome: str, committed: int = 0, rejected: int = 0) -> None:
        self[semconv.M_EXPORTS].labels(protocol, outcome).inc()
        if committed:
            self[semconv.M_SPANS_RECEIVED].labels(protocol).inc(committed)
        if rejected:
            self[semconv.M_SPANS_REJECTED].labels("invalid_span").inc(rejected)

    def throttled(self, protocol: str) -> None:
        self[semconv.M_THROTTLED].labels(protocol).inc()
        self[semconv.M_EXPORTS].labels(protocol, "throttled").inc()

    # -- assembly ------------------------------------------------------------------------------

    def request_assembled(self, new: dict[str, Any], old: dict[str, Any] | None) -> None:
        """Update verdict metrics for a (re)assembled request, counting only what changed.

        A re-assembly after late spans must not count the request twice: counters and
        histograms see the request once, and later only the flags, KV transfer and TTFT that
        were not there before.
        """
        ex = {"trace_id": str(new.get("trace_id", ""))}
        kv = new.get("kv_transfer") or None
        old_kv = (old or {}).get("kv_transfer") or None
        path_class = _label((kv or {}).get("path_class") or "unknown")
        if old is None:
            self[semconv.M_REQUESTS].labels(path_class, _label(new.get("model"))).inc(exemplar=ex)
            pre, dec = new.get("prefill") or {}, new.get("decode") or {}
            if pre.get("node") or dec.get("node"):
                self[semconv.M_PAIRINGS].labels(
                    _label(pre.get("node")),
                    _label(dec.get("node")),
                    _label(new.get("pairing_level") or "unknown"),
                ).inc(exemplar=ex)
        old_flags = {f["name"] for f in (old or {}).get("flags") or []}
        for name in sorted({f["name"] for f in new.get("flags") or []} - old_flags):
            self[semconv.M_FLAGS].labels(_label(name), path_class).inc(exemplar=ex)
        if kv and not old_kv:
            self[semconv.M_KV_TRANSFERS].labels(_label(kv.get("transport") or "unknown"), path_class).inc(
                exemplar=ex
            )
            duration, size = kv.get("duration_s"), kv.get("bytes")
            if isinstance(duration, int | float) and duration >= 0:
                self[semconv.M_KV_DURATION].labels(path_class).observe(duration, exemplar=ex)
                dec = new.get("decode") or {}
                node, nic = _label(dec.get("node")), _label(dec.get("nic"))
                self[semconv.M_KV_NODE_SECONDS].labels(node, nic, path_class).inc(duration)
                if isinstance(size, int) and size >= 0:
                    self[semconv.M_KV_NODE_BYTES].labels(node, nic, path_class).inc(size)
                    if duration > 0:
                        self[semconv.M_KV_BANDWIDTH].labels(path_class).observe(size / duration, exemplar=ex)
        ttft = new.get("ttft_s")
        if isinstance(ttft, int | float) and (old is None or old.get("ttft_s") is None):
            self[semconv.M_TTFT].labels(path_class).observe(ttft, exemplar=ex)
        old_stages = (old or {}).get("breakdown_s") or {}
        for stage, seconds in (new.get("breakdown_s") or {}).items():
            if stage not in old_stages and isinstance(seconds, int | float) and seconds >= 0:
                self[semconv.M_STAGE].labels(_label(stage), path_class).observe(seconds, exemplar=ex)
