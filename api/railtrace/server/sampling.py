"""How much of the traffic railtrace sees: the traced share, estimated two ways.

llm-d's router samples at 0.1 unless told otherwise (`parentbased_traceidratio`, docs/deploy.md,
"Sampling"), so every count railtrace shows may be a tenth of the traffic. The service says so
instead of showing counts as if complete:

- **Prometheus** (`prometheus_url`): the requests the EPP (or vLLM) counted over a window, from
  the first of `prometheus_request_counters` with series, against the requests railtrace
  assembled that started in the same window (`Store.stats`). The window ends `sampling_lag_s`
  ago, so that its requests have been assembled.
- **tracestate** (always): OpenTelemetry's consistent-probability samplers write their
  rejection threshold into W3C tracestate (`ot=th:<hex>`); a trace kept with probability p
  stands for 1/p traces. Spans keep their tracestate in their stored encoding, but it is not
  decoded; `ThresholdWindow.observe` reads it at ingest, one span per trace of an export call,
  and only for calls whose bytes hold `ot=` at all.

Either may be unknown (no Prometheus, no traffic, samplers that write no threshold): then the
share is None, shown as unknown, never as 1.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import httpx
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from railtrace.otlp.rows import RowBatch, chunk_records
from railtrace.settings import Settings
from railtrace_tracing import semconv

log = logging.getLogger(__name__)

# OTel's probability sampling (W3C tracestate, vendor key `ot`, sub-key `th`): a 56-bit
# rejection threshold written as 1-14 hex digits, trailing zeros dropped; a trace is kept when
# its randomness is at or above it, so p = 1 - T / 2**56.
# https://opentelemetry.io/docs/specs/otel/trace/tracestate-probability-sampling/ ; read as the
# collector's own parser does (opentelemetry-collector-contrib v0.161.0, pkg/sampling:
# threshold.go l.62-85 `TValueToThreshold`, probability.go l.80-81 `Threshold.Probability`).
THRESHOLD_BITS = 56
THRESHOLD_DIGITS = 14
HEX_DIGITS = "0123456789abcdefABCDEF"
# Trace ids remembered so that a trace counted from one process is not counted again from the
# next (bounded: older ids are forgotten first).
MAX_REMEMBERED_TRACES = 100_000
BUCKET_S = 10.0  # threshold counts are kept per bucket of this many seconds

SOURCE_PROMETHEUS = "prometheus"
SOURCE_TRACESTATE = "tracestate"


def sampling_probability(tracestate: str) -> float | None:
    """The probability the `ot=th:` threshold of a W3C tracestate stands for; None when the
    tracestate carries no valid threshold."""
    for member in tracestate.split(","):
        key, _, value = member.strip().partition("=")
        if key != "ot":
            continue
        for field in value.split(";"):
            name, _, th = field.partition(":")
            if name != "th":
                continue
            if not 1 <= len(th) <= THRESHOLD_DIGITS or th.strip(HEX_DIGITS):
                return None
            threshold = int(th.ljust(THRESHOLD_DIGITS, "0"), 16)
            return ((1 << THRESHOLD_BITS) - threshold) / (1 << THRESHOLD_BITS)
        return None
    return None


@dataclass(slots=True)
class Estimate:
    """One estimate of the traced share; `share` None: unknown, `reason` says why."""

    source: str
    share: float | None = None
    traced: float | None = None  # requests (Prometheus) or traces (tracestate) railtrace has
    total: float | None = None  # what they stand for: requests served, or traces sampled from
    window_s: float = 0.0
    until: float | None = None  # unix seconds the window ends
    reason: str = ""
    counter: str | None = None  # the counter selector that counted the traffic (Prometheus)
    without_threshold: int = 0  # traces in the window whose tracestate held no threshold

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ThresholdWindow:
    """Per-window estimate from `ot=th:` thresholds: Σ 1 over Σ 1/p of the traces seen, each
    trace once. Memory is bounded by `MAX_REMEMBERED_TRACES` ids and one bucket per
    `BUCKET_S` of the window."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.time) -> None:
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, None] = OrderedDict()
        # [bucket start, traces with a threshold, Σ 1/p, traces without one]
        self._buckets: deque[list[float]] = deque()

    def observe(self, raw: bytes, batch: RowBatch) -> None:
        """Count the traces of an export call by the threshold of their first span. Costs two
        substring searches for calls without an `ot=…th:` tracestate (nearly all, where no
        sampler writes one); only then is one span per trace decoded."""
        if b"ot=" not in raw or b"th:" not in raw or not batch.chunks:
            return
        found: list[tuple[str, float | None]] = []
        for chunk in batch.chunks:
            trace_id = chunk[0]
            try:
                records = chunk_records(chunk[4])
                state = PbSpan.FromString(records[0][1]).trace_state if records else ""
            except Exception:  # a chunk the writer will refuse anyway: not this estimate's concern
                continue
            found.append((trace_id, sampling_probability(state) if state else None))
        if found:
            self._add(found)

    def _add(self, found: list[tuple[str, float | None]]) -> None:
        now = self._clock()
        start = now - now % BUCKET_S
        with self._lock:
            if not self._buckets or self._buckets[-1][0] != start:
                self._buckets.append([start, 0, 0.0, 0])
            bucket = self._buckets[-1]
            for trace_id, p in found:
                if trace_id in self._seen:
                    continue
                self._seen[trace_id] = None
                if len(self._seen) > MAX_REMEMBERED_TRACES:
                    self._seen.popitem(last=False)
                if p is None or p <= 0:
                    bucket[3] += 1
                else:
                    bucket[1] += 1
                    bucket[2] += 1.0 / p
            self._expire(now)

    def _expire(self, now: float) -> None:
        while self._buckets and self._buckets[0][0] + BUCKET_S <= now - self.window_s:
            self._buckets.popleft()

    def estimate(self) -> Estimate:
        now = self._clock()
        with self._lock:
            self._expire(now)
            kept = sum(b[1] for b in self._buckets)
            stands_for = sum(b[2] for b in self._buckets)
            without = int(sum(b[3] for b in self._buckets))
        out = Estimate(SOURCE_TRACESTATE, window_s=self.window_s, until=now, without_threshold=without)
        if not kept:
            out.reason = "no trace in the window carried an ot=th: sampling threshold"
            return out
        out.traced, out.total = kept, stands_for
        out.share = min(1.0, kept / stands_for)
        return out


class PrometheusShare:
    """Requests assembled against requests counted by Prometheus, over the same window."""

    def __init__(self, settings: Settings, count_assembled: Callable[[int, int], int]) -> None:
        self.url = (settings.prometheus_url or "").rstrip("/")
        self.counters = list(settings.prometheus_request_counters)
        self.window_s = settings.sampling_window_s
        self.lag_s = settings.sampling_lag_s
        self._count_assembled = count_assembled

    def _query(self, client: httpx.Client, expr: str, at: float) -> float | None:
        """The value of a scalar-ish query (sum of its series); None when it has none."""
        resp = client.get(self.url + "/api/v1/query", params={"query": expr, "time": f"{at:.3f}"})
        resp.raise_for_status()
        body = resp.json()
        if body.get("status") != "success":
            raise ValueError(str(body.get("error") or body)[:200])
        result = body["data"]["result"]
        if not result:
            return None
        value = float(result[0]["value"][1])
        return value if math.isfinite(value) else None

    def estimate(self, now: float | None = None) -> Estimate:
        until = (time.time() if now is None else now) - self.lag_s
        out = Estimate(SOURCE_PROMETHEUS, window_s=self.window_s, until=until)
        window, lag = f"{self.window_s:.0f}s", f"{self.lag_s:.0f}s"
        offset = f" offset {lag}" if self.lag_s >= 1 else ""
        try:
            with httpx.Client(timeout=10) as client:
                for selector in self.counters:
                    served = self._query(
                        client, f"sum(increase({selector}[{window}]{offset}))", until + self.lag_s
                    )
                    if served is not None:
                        out.counter, out.total = selector, served
                        break
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            out.reason = f"Prometheus at {self.url} did not answer: {exc}"[:300]
            return out
        if out.total is None:
            out.reason = "no request counter has series in Prometheus: " + ", ".join(self.counters)
            return out
        until_ns = int(until * 1e9)
        traced = self._count_assembled(until_ns - int(self.window_s * 1e9), until_ns)
        out.traced = traced
        if out.total <= 0:
            out.reason = "no requests served in the window"
            return out
        out.share = min(1.0, traced / out.total)
        return out


class SamplingEstimator:
    """Both estimates, the metric `llm_d_tracing_traced_share`, and the thread that asks
    Prometheus again every `sampling_refresh_s`."""

    def __init__(self, settings: Settings, count_assembled: Callable[[int, int], int], metrics: Any) -> None:
        self.thresholds = ThresholdWindow(settings.sampling_window_s)
        self.prometheus = PrometheusShare(settings, count_assembled) if settings.prometheus_url else None
        self.refresh_s = settings.sampling_refresh_s
        self._gauge = metrics[semconv.M_TRACED_SHARE]
        self._last: Estimate | None = None
        if self.prometheus is not None:
            self._last = Estimate(SOURCE_PROMETHEUS, reason="not estimated yet")
            self._gauge.labels(SOURCE_PROMETHEUS).set(math.nan)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def observe(self, raw: bytes, batch: RowBatch) -> None:
        self.thresholds.observe(raw, batch)

    def start(self) -> None:
        if self.prometheus is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="railtrace-sampling", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.refresh_s)

    def refresh(self) -> None:
        """Ask Prometheus again (a failure is an unknown share, logged once per kind)."""
        if self.prometheus is None:
            return
        try:
            estimate = self.prometheus.estimate()
        except Exception as exc:  # the store's count failed: unknown until the next turn
            estimate = Estimate(SOURCE_PROMETHEUS, reason=f"assembled requests not counted: {exc}"[:300])
        previous, self._last = self._last, estimate
        if estimate.reason and (previous is None or previous.reason != estimate.reason):
            log.warning("traced share unknown: %s", estimate.reason)
        self._gauge.labels(SOURCE_PROMETHEUS).set(math.nan if estimate.share is None else estimate.share)

    def snapshot(self) -> dict[str, Any]:
        """What `GET /api/v1/stats?group_by=coverage` answers under `sampling`: the best estimate
        (`traced_share`, None: unknown; `source`) and each estimate with its counts or reason."""
        thresholds = self.thresholds.estimate()
        if thresholds.share is not None or thresholds.without_threshold:
            self._gauge.labels(SOURCE_TRACESTATE).set(
                math.nan if thresholds.share is None else thresholds.share
            )
        estimates = [e for e in (self._last, thresholds) if e is not None]
        best = next((e for e in estimates if e.share is not None), None)
        share = None if best is None else best.share
        return {
            "traced_share": share,
            "source": None if best is None else best.source,
            "sampled": None if share is None else share < 1.0,
            "window_s": self.thresholds.window_s,
            "estimates": {e.source: e.to_dict() for e in estimates},
        }

    def refresh_gauges(self) -> None:
        """Bring the tracestate gauge up to date (before a scrape)."""
        self.snapshot()
