"""Prometheus metrics of the service, built from `semconv.METRICS` (the one registry of names).

Each service instance owns its own `CollectorRegistry` (no module globals), so tests and the
demo can run several services in one process. Request-level series carry an OpenMetrics
exemplar with the trace id, so a Grafana panel links straight to the request.

The families are railtrace's own small aggregation, not prometheus_client's `Counter` and
`Histogram`: every assembled request updates a dozen series, and prometheus_client's label
lookup, locks and exemplar objects per update were most of the cost of counting it. Here a
series is a plain list (a value or per-bucket counts, a sum, the latest exemplar) behind one
lock per `Metrics`, taken once per request; each family is a registry collector that exposes
exactly the samples prometheus_client's own would (`_total`/`_created`, `_bucket`/`_count`/
`_sum`/`_created`, the latest exemplar per counter and per bucket). Because a series is plain
data, an assembly process can hand over what it counted as a delta (`take`, in
`railtrace.scheduling.workers`) and the serve process adds it in (`merge`) instead of replaying
each observation.

Label values a sender chooses (a model name, the nodes and NICs its spans claim; semconv's
`BOUNDED_LABELS`) are bounded, so that a sender naming a new model per request cannot grow
`/metrics` and the service's memory without end: `LabelBound` gives a value a series of its own
when it is listed in the settings, known to the topology, or among the first
`metrics_label_values` others seen, and counts the rest under `other`; and no family holds more
than `metrics_max_series` series (past it, new label sets fold their sender-chosen values into
`other`). Both are decided when a series is created, never per observation, and a series never
moves: counters stay monotonic and every observation is counted somewhere, so totals add up.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import add
from typing import TYPE_CHECKING, Any

import prometheus_client.metrics as prometheus_metrics
from prometheus_client import CollectorRegistry
from prometheus_client import generate_latest as text_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST as TEXT_CONTENT_TYPE
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_CONTENT_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.samples import Exemplar
from prometheus_client.utils import INF, floatToGoString

from railtrace.incidents.group import PRIMARY
from railtrace.model import resolution_label
from railtrace_tracing import semconv
from railtrace_tracing.semconv import FlagName, PathClass

if TYPE_CHECKING:
    from railtrace.model import RequestSummary
    from railtrace.settings import Settings

# prometheus_client's default buckets, for a histogram the registry gives none.
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)

# The latest exemplar of a counter or bucket: (labels, value, unix time), as prometheus_client
# keeps it (`Exemplar`), built only when scraped.
ExemplarState = tuple[dict[str, str], float, float]

# What a process counted, family name -> label values -> series state:
# counter [value, exemplar | None, created], histogram [bucket counts, bucket exemplars, sum,
# created], gauge [value]. Plain lists, so it pickles small and merges by adding.
Delta = dict[str, dict[tuple[str, ...], list[Any]]]


def _created_series() -> bool:
    """Whether `_created` samples are exposed: prometheus_client's own switch
    (`PROMETHEUS_DISABLE_CREATED_SERIES`, `disable_created_metrics`)."""
    return getattr(prometheus_metrics, "_use_created", True)


def _exemplar(labels: dict[str, str] | None, value: float) -> ExemplarState | None:
    """An exemplar as prometheus_client checks it (at most 128 characters of labels)."""
    if not labels:
        return None
    if sum(len(k) + len(v) for k, v in labels.items()) > 128:
        raise ValueError("Exemplar labels have more than 128 UTF-8 characters")
    return (labels, value, time.time())


def _exposed(state: ExemplarState | None) -> Exemplar | None:
    return None if state is None else Exemplar(state[0], state[1], state[2])


OTHER = semconv.LABEL_OTHER
# Defaults of the settings `metrics_label_values` and `metrics_max_series`.
DEFAULT_LABEL_VALUES = 50
DEFAULT_MAX_SERIES = 400
# Exception types counted apart in the assembly-failure metric (they come from the code, not
# from senders; the bound only keeps an unforeseen variety from growing the family).
ERROR_KINDS = 20

# Series exposed at 0 from the start: those of counters whose label values are all known
# beforehand, so that a panel or `rate()` over a healthy service reads 0, not "No data"
# (throttling, rejections, flags). Families with a sender-chosen label (model, node) get their
# series on first use.
_PROTOCOLS = ("http", "grpc")
_FLAG_SERIES: list[tuple[str, ...]] = [(flag.value, pc.value) for flag in FlagName for pc in PathClass]
_CAUSES = frozenset(flag.value for flag in FlagName)
_CAUSE_SERIES: list[tuple[str, ...]] = [(c,) for c in [*sorted(_CAUSES), semconv.CAUSE_NONE]]
KNOWN_SERIES: dict[str, list[tuple[str, ...]]] = {
    semconv.M_SPANS_RECEIVED: [(p,) for p in _PROTOCOLS],
    semconv.M_THROTTLED: [(p,) for p in _PROTOCOLS],
    semconv.M_EXPORTS: [(p, "ok") for p in _PROTOCOLS],
    semconv.M_SPANS_REJECTED: [
        (r,) for r in ("invalid_span", semconv.REJECT_TRACE_SPAN_LIMIT, "assembly_failed")
    ],
    semconv.M_FLAGS: _FLAG_SERIES,
    semconv.M_FLAGS_RETRACTED: _FLAG_SERIES,
    semconv.M_SECONDS_LOST: _CAUSE_SERIES,
    semconv.M_SECONDS_LOST_RETRACTED: _CAUSE_SERIES,
}

# Whether the topology knows a value of a bounded label's set: (set, value) -> bool.
KnownValue = Callable[[str, str], bool]


class LabelBound:
    """Which values of one set of a bounded label (models, nodes, NICs) get series of their own.

    A value keeps its own series if it is listed (`allowed`), known (`known`, the topology), or
    among the first `limit` other values seen; any other value is counted under `other`. Once a
    value has its own series it keeps it for the life of the process, so a series never
    changes meaning and its counters stay monotonic. `limit=None`: every value (an assembly
    child, whose counts the serve process bounds when it adds them in). The caller holds the
    lock of `Metrics`.
    """

    __slots__ = ("_known", "limit", "name", "own", "seen")

    def __init__(
        self, name: str, limit: int | None, allowed: Iterable[str] = (), known: KnownValue | None = None
    ) -> None:
        self.name = name
        self.limit = limit
        self._known = known
        # Values with series of their own, each mapped to itself: on the hot path a caller
        # tries `own.get(value) or bound(value)`, a dict lookup instead of a call.
        self.own: dict[str, str] = {v: v for v in allowed}
        self.own[""] = ""  # "no value" is one fixed value, not a sender's choice
        self.own[OTHER] = OTHER
        self.seen = 0  # values admitted by first sight

    def __call__(self, value: str) -> str:
        own = self.own.get(value)
        if own is not None:
            return own
        if self.limit is None:
            return value
        if self._known is not None and self._known(self.name, value):
            self.own[value] = value
            return value
        if self.seen < self.limit:
            self.seen += 1
            self.own[value] = value
            return value
        return OTHER  # not remembered: a later topology may still know it


@dataclass(frozen=True, slots=True)
class MetricLimits:
    """How far sender-chosen label values may grow `/metrics` (settings `metrics_*`)."""

    label_values: int | None = DEFAULT_LABEL_VALUES
    max_series: int | None = DEFAULT_MAX_SERIES
    allowed: dict[str, tuple[str, ...]] = field(default_factory=dict)  # set name -> listed values
    known: KnownValue | None = None

    @classmethod
    def unbounded(cls) -> MetricLimits:
        return cls(label_values=None, max_series=None)

    def bound(self, name: str) -> LabelBound:
        limit = self.label_values
        if name == "error" and limit is not None:
            limit = min(limit, ERROR_KINDS)
        return LabelBound(name, limit, self.allowed.get(name, ()), self.known)


def metric_limits(settings: Settings, known: KnownValue | None = None) -> MetricLimits:
    """The limits the settings ask for; `known` says which nodes and NICs the topology has."""
    return MetricLimits(
        label_values=settings.metrics_label_values,
        max_series=settings.metrics_max_series,
        allowed={"model": tuple(settings.metrics_models)},
        known=known,
    )


class TopologyLabels:
    """`KnownValue` from the current topology: its node names, and its NICs' names, RDMA devices
    and interfaces; rebuilt when the topology is replaced."""

    def __init__(self, current: Callable[[], Any]) -> None:
        self._current = current
        self._topology: Any = None
        self._names: dict[str, frozenset[str]] = {}

    def __call__(self, name: str, value: str) -> bool:
        topology = self._current()
        if topology is None:
            return False
        if topology is not self._topology:
            nics = {n for nic in topology.nics for n in (nic.name, nic.rdma_device, nic.if_name) if n}
            self._names = {"node": frozenset(topology.nodes), "nic": frozenset(nics)}
            self._topology = topology
        return value in self._names.get(name, ())


def _inc(family: _Family, key: tuple[str, ...], amount: float, ex: Any) -> None:
    """Add to a counter series (created on first use); the caller holds the lock."""
    s = family.series.get(key)
    if s is None:
        s = family.create(key)
    s[0] += amount
    if ex is not None:
        s[1] = ex


class _Family:
    """One metric family: its series by label values, and the registry collector of them."""

    type = ""

    def __init__(
        self,
        metric: semconv.Metric,
        lock: threading.Lock,
        zero_series: bool,
        bounds: dict[str, LabelBound] | None = None,
        max_series: int | None = None,
    ) -> None:
        self.name = metric.name
        self.labelnames = metric.labels
        self.documentation = metric.description
        self.series: dict[tuple[str, ...], list[Any]] = {}
        self._lock = lock
        self._zero_series = zero_series
        self._handles: dict[tuple[Any, ...], _Series] = {}
        sets = bounds or {}
        # (position, bound) of each label whose values a sender chooses.
        self._bounds = tuple(
            (i, sets[semconv.BOUNDED_LABELS[label]])
            for i, label in enumerate(self.labelnames)
            if semconv.BOUNDED_LABELS.get(label) in sets
        )
        self._max_series = max_series if self.labelnames else None
        open_positions = {i for i, _ in self._bounds} or set(range(len(self.labelnames)))
        self._fold_positions = tuple(sorted(open_positions))
        if zero_series and not self.labelnames:  # as prometheus_client: exposed from the start
            self.series[()] = self._new()

    def _new(self, now: float | None = None) -> list[Any]:
        """An empty series, created `now` (default: the clock now)."""
        raise NotImplementedError

    def bound_key(self, key: tuple[str, ...]) -> tuple[str, ...]:
        """`key` with each sender-chosen value bounded (`LabelBound`); the caller holds the lock."""
        if not self._bounds:
            return key
        out = list(key)
        for i, bound in self._bounds:
            out[i] = bound(out[i])
        return tuple(out)

    def create(self, key: tuple[str, ...], now: float | None = None) -> list[Any]:
        """The series to count `key` in, which has none yet; the caller holds the lock. A new
        one (created `now`), except at `max_series`: then the label set's sender-chosen values
        (all of them, in a family without such labels) fold into `other`, whose series may
        exist already, so the family stops growing and nothing is lost."""
        if self._max_series is not None and len(self.series) >= self._max_series:
            folded = list(key)
            for i in self._fold_positions:
                folded[i] = OTHER
            key = tuple(folded)
            s = self.series.get(key)
            if s is not None:
                return s
        s = self.series[key] = self._new(now)
        return s

    def labels(self, *values: Any) -> _Series:
        """The series of these label values (a cached handle; the series itself is looked up
        at each update, so a handle never writes into a delta already taken)."""
        handle = self._handles.get(values)
        if handle is None:
            if not self.labelnames:
                raise ValueError(f"No label names were set when constructing {self.name}")
            if len(values) != len(self.labelnames):
                raise ValueError(f"Incorrect label count for {self.name}")
            with self._lock:
                key = self.bound_key(tuple(str(v) for v in values))
                if self._zero_series and key not in self.series:  # as prometheus_client
                    self.create(key)
            handle = self._handles[values] = _Series(self, key)
        return handle

    def _key(self) -> tuple[str, ...]:
        if self.labelnames:
            raise ValueError(f"{self.name} metric is missing label values")
        return ()

    def _snapshot(self) -> list[tuple[tuple[str, ...], list[Any]]]:
        with self._lock:
            return [(k, list(s)) for k, s in self.series.items()]

    def describe(self) -> list[Metric]:
        return [self._metric()]

    def _metric(self) -> Metric:
        return Metric(self.name, self.documentation, self.type)

    def collect(self) -> list[Metric]:
        raise NotImplementedError

    def merge(self, series: dict[tuple[str, ...], list[Any]], now: float) -> None:
        raise NotImplementedError


class Counter(_Family):
    type = "counter"

    def __init__(self, metric: semconv.Metric, lock: threading.Lock, zero_series: bool, **kw: Any) -> None:
        super().__init__(metric, lock, zero_series, **kw)
        self._base = self.name[:-6] if self.name.endswith("_total") else self.name

    def _new(self, now: float | None = None) -> list[Any]:
        return [0.0, None, time.time() if now is None else now]

    def _metric(self) -> Metric:
        return Metric(self._base, self.documentation, self.type)

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        self._inc(self._key(), amount, exemplar)

    def _inc(self, key: tuple[str, ...], amount: float, exemplar: dict[str, str] | None) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        ex = _exemplar(exemplar, amount)
        with self._lock:
            _inc(self, key, amount, ex)

    def collect(self) -> list[Metric]:
        metric, created = self._metric(), _created_series()
        total, born = self._base + "_total", self._base + "_created"
        for key, (value, ex, since) in self._snapshot():
            labels = dict(zip(self.labelnames, key, strict=True))
            metric.add_sample(total, labels, value, None, _exposed(ex))
            if created:
                metric.add_sample(born, dict(labels), since)
        return [metric]

    def merge(self, series: dict[tuple[str, ...], list[Any]], now: float) -> None:
        mine = self.series
        for raw, (value, ex, _) in series.items():
            key = self.bound_key(raw)
            s = mine.get(key)
            if s is None:
                s = self.create(key, now)
            s[0] += value
            if ex is not None and (s[1] is None or ex[2] >= s[1][2]):
                s[1] = ex


class Histogram(_Family):
    type = "histogram"

    def __init__(self, metric: semconv.Metric, lock: threading.Lock, zero_series: bool, **kw: Any) -> None:
        bounds = [float(b) for b in metric.buckets or DEFAULT_BUCKETS]
        if bounds != sorted(bounds):
            raise ValueError(f"buckets of {metric.name} not in sorted order")
        if bounds[-1] != INF:
            bounds.append(INF)
        self.bounds = tuple(bounds)
        self._le = tuple(floatToGoString(b) for b in bounds)
        super().__init__(metric, lock, zero_series, **kw)

    def _new(self, now: float | None = None) -> list[Any]:
        n = len(self.bounds)
        return [[0] * n, [None] * n, 0.0, time.time() if now is None else now]

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        self._observe(self._key(), amount, exemplar)

    def _observe(self, key: tuple[str, ...], amount: float, exemplar: dict[str, str] | None) -> None:
        ex = _exemplar(exemplar, amount)
        with self._lock:
            self.add(key, amount, ex)

    def add(self, key: tuple[str, ...], amount: float, ex: ExemplarState | None) -> None:
        """One observation; the caller holds the lock. Like prometheus_client, a NaN adds to
        the sum and to no bucket."""
        s = self.series.get(key)
        if s is None:
            s = self.create(key)
        s[2] += amount
        if amount == amount:
            i = bisect_left(self.bounds, amount)
            s[0][i] += 1
            if ex is not None:
                s[1][i] = ex

    def _snapshot(self) -> list[tuple[tuple[str, ...], list[Any]]]:
        with self._lock:
            return [(k, [list(s[0]), list(s[1]), s[2], s[3]]) for k, s in self.series.items()]

    def collect(self) -> list[Metric]:
        metric, created = self._metric(), _created_series()
        name, with_sum = self.name, self.bounds[0] >= 0
        for key, (counts, exemplars, total, since) in self._snapshot():
            labels = dict(zip(self.labelnames, key, strict=True))
            acc = 0.0
            for le, count, ex in zip(self._le, counts, exemplars, strict=True):
                acc += count
                metric.add_sample(name + "_bucket", {**labels, "le": le}, acc, None, _exposed(ex))
            metric.add_sample(name + "_count", dict(labels), acc)
            if with_sum:
                metric.add_sample(name + "_sum", dict(labels), total)
            if created:
                metric.add_sample(name + "_created", dict(labels), since)
        return [metric]

    def merge(self, series: dict[tuple[str, ...], list[Any]], now: float) -> None:
        mine = self.series
        for raw, (counts, exemplars, total, _) in series.items():
            key = self.bound_key(raw)
            s = mine.get(key)
            if s is None:
                s = self.create(key, now)
            s[0] = list(map(add, s[0], counts))
            s[2] += total
            latest = s[1]
            for i, ex in enumerate(exemplars):
                if ex is not None and (latest[i] is None or ex[2] >= latest[i][2]):
                    latest[i] = ex


class Gauge(_Family):
    type = "gauge"

    def _new(self, now: float | None = None) -> list[Any]:
        return [0.0]

    def set(self, value: float) -> None:
        self._set(self._key(), value)

    def _set(self, key: tuple[str, ...], value: float) -> None:
        with self._lock:
            s = self.series.get(key)
            if s is None:
                s = self.create(key)
            s[0] = float(value)

    def collect(self) -> list[Metric]:
        metric = self._metric()
        for key, (value,) in self._snapshot():
            metric.add_sample(self.name, dict(zip(self.labelnames, key, strict=True)), value)
        return [metric]

    def merge(self, series: dict[tuple[str, ...], list[Any]], now: float) -> None:
        for raw, (value,) in series.items():
            key = self.bound_key(raw)
            s = self.series.get(key)
            if s is None:
                s = self.create(key)
            s[0] = value


class _Series:
    """One label set of a family (what `family.labels(...)` returns)."""

    __slots__ = ("_family", "_key")

    def __init__(self, family: Any, key: tuple[str, ...]) -> None:
        self._family, self._key = family, key

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        self._family._inc(self._key, amount, exemplar)

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        self._family._observe(self._key, amount, exemplar)

    def set(self, value: float) -> None:
        self._family._set(self._key, value)


_TYPES: dict[str, type[_Family]] = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}


# Below this, a difference of seconds lost between two assemblies is rounding (summaries keep
# microseconds), not a change to count.
_SECONDS_EPSILON = 1e-9
# What `request_assembled` takes as a number (isinstance with a tuple is quicker than `int | float`).
_NUMBER = (int, float)


def _label(value: Any) -> str:
    return "" if value is None else str(value)[:128]


def lost_cause(flag_names: Iterable[str] | None) -> str:
    """The `cause` label of a request's seconds lost: its primary flag, as incidents pick it
    (one cause per request, so sums over causes count a second once); `none` without a flag."""
    names = set(flag_names or ())
    primary = next((c for c in PRIMARY if c in names), min(names, default=None))
    if primary is None:
        return semconv.CAUSE_NONE
    return primary if primary in _CAUSES else OTHER


def _seconds_lost(cost: dict[str, Any] | None) -> float:
    """`cost.ttft_s_lost` of a summary when it is a positive number, else 0."""
    lost = (cost or {}).get("ttft_s_lost")
    return float(lost) if isinstance(lost, _NUMBER) and lost > 0 else 0.0


class Metrics:
    """The service's metric families plus the update rules (count changes only).

    `zero_series=False` leaves out the series prometheus_client shows at zero before their
    first update (label-less families, looked-up label sets): for a process whose counts are
    handed over as deltas, where a zero gauge would overwrite the receiver's value.
    """

    def __init__(self, *, zero_series: bool = True, limits: MetricLimits | None = None) -> None:
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=True)
        self.families: dict[str, Any] = {}
        self.limits = limits = limits if limits is not None else MetricLimits()
        self.bounds = {name: limits.bound(name) for name in set(semconv.BOUNDED_LABELS.values())}
        for m in semconv.METRICS:
            if m.type not in _TYPES:
                raise ValueError(f"unknown metric type {m.type!r} for {m.name}")
            family = self.families[m.name] = _TYPES[m.type](
                m, self._lock, zero_series, bounds=self.bounds, max_series=limits.max_series
            )
            self.registry.register(family)
        # Per request: `own.get(value) or bound(value)`; unbounded (a child), `str` is the bound.
        b = self.bounds
        self._models, self._nodes, self._nics = b["model"].own, b["node"].own, b["nic"].own
        self._model, self._node, self._nic = (
            str if bound.limit is None else bound for bound in (b["model"], b["node"], b["nic"])
        )
        f = self.families
        self._requests: Counter = f[semconv.M_REQUESTS]
        self._pairings: Counter = f[semconv.M_PAIRINGS]
        self._flags: Counter = f[semconv.M_FLAGS]
        self._seconds_lost: Counter = f[semconv.M_SECONDS_LOST]
        self._resolution: Counter = f[semconv.M_LEG_RESOLUTION]
        self._kv_transfers: Counter = f[semconv.M_KV_TRANSFERS]
        self._kv_duration: Histogram = f[semconv.M_KV_DURATION]
        self._kv_node_seconds: Counter = f[semconv.M_KV_NODE_SECONDS]
        self._kv_node_bytes: Counter = f[semconv.M_KV_NODE_BYTES]
        self._kv_bandwidth: Histogram = f[semconv.M_KV_BANDWIDTH]
        self._ttft: Histogram = f[semconv.M_TTFT]
        self._stage: Histogram = f[semconv.M_STAGE]
        self._exports: Counter = f[semconv.M_EXPORTS]
        self._spans_received: Counter = f[semconv.M_SPANS_RECEIVED]
        self._spans_rejected: Counter = f[semconv.M_SPANS_REJECTED]
        self._throttled: Counter = f[semconv.M_THROTTLED]
        self._assembly_failures: Counter = f[semconv.M_ASSEMBLY_FAILURES]
        if zero_series:
            self._zero_known_series()

    def _zero_known_series(self) -> None:
        """Create the `KNOWN_SERIES` at 0, as prometheus_client does for `labels(...)`."""
        with self._lock:
            for name, keys in KNOWN_SERIES.items():
                family = self.families[name]
                for key in keys:
                    if key not in family.series:
                        family.create(key)

    def __getitem__(self, name: str) -> Any:
        return self.families[name]

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """Exposition body and content type; OpenMetrics (with exemplars) when asked for."""
        if accept and "application/openmetrics-text" in accept:
            return openmetrics_latest(self.registry), OPENMETRICS_CONTENT_TYPE
        return text_latest(self.registry), TEXT_CONTENT_TYPE

    def merge(self, delta: Delta) -> None:
        """Add what another process counted (`RecordedMetrics.take`): counts and sums add up,
        the later exemplar of a series or bucket wins, a gauge takes the value sent. Series
        new here are created now, as prometheus_client would on their first update."""
        now = time.time()
        with self._lock:
            for name, series in delta.items():
                self.families[name].merge(series, now)

    # -- ingest -------------------------------------------------------------------------------

    def export_done(self, protocol: str, outcome: str, committed: int = 0, rejected: int = 0) -> None:
        with self._lock:
            _inc(self._exports, (protocol, outcome), 1, None)
            if committed:
                _inc(self._spans_received, (protocol,), committed, None)
            if rejected:
                _inc(self._spans_rejected, ("invalid_span",), rejected, None)

    def throttled(self, protocol: str) -> None:
        with self._lock:
            _inc(self._throttled, (protocol,), 1, None)
            _inc(self._exports, (protocol, "throttled"), 1, None)

    def assembly_failed(self, stage: str, error: str, count: int = 1) -> None:
        """Count assembly steps that raised (`semconv.AssemblyStage`, the exception type)."""
        with self._lock:
            _inc(self._assembly_failures, (_label(stage), self.bounds["error"](_label(error))), count, None)

    # -- assembly ------------------------------------------------------------------------------

    def request_assembled(
        self, new: dict[str, Any] | RequestSummary, old: dict[str, Any] | None, verdicts: bool = True
    ) -> None:
        """Update verdict metrics for a (re)assembled request, counting only what changed.

        A re-assembly after late spans must not count the request twice: counters and
        histograms see the request once, and later only the flags, KV transfer and TTFT that
        were not there before. `new` is the summary as a dict (`RequestSummary.to_dict`) or the
        `RequestSummary` itself, which saves building the dicts only to count them.
        `verdicts=False` leaves the verdict counters (`VERDICT_COUNTERS`) to `verdicts_revised`.
        """
        kv_class = transport = duration = size = None
        if isinstance(new, dict):
            trace_id = str(new.get("trace_id", ""))
            model, pairing_level = new.get("model"), new.get("pairing_level")
            kv = new.get("kv_transfer") or None
            if kv:
                kv_class, transport = kv.get("path_class"), kv.get("transport")
                duration, size = kv.get("duration_s"), kv.get("bytes")
            pre, dec = new.get("prefill") or {}, new.get("decode") or {}
            new_flags = new.get("flags")
            flag_names = {f["name"] for f in new_flags} if new_flags else None
            ttft, breakdown = new.get("ttft_s"), new.get("breakdown_s")
            recipe = (new.get("coverage") or {}).get("recipe")
            identity = new.get("identity") or {}
            resolved = bool(new.get("resolved"))
            lost = _seconds_lost(new.get("cost"))
        else:
            trace_id, model, pairing_level = str(new.trace_id), new.model, new.pairing_level
            kv = new.kv_transfer
            if kv:
                kv_class, transport, duration, size = kv.path_class, kv.transport, kv.duration_s, kv.bytes
            pre, dec = new.prefill or {}, new.decode or {}
            flag_names = {f.name for f in new.flags} if new.flags else None
            ttft, breakdown = new.ttft_s, new.breakdown_s
            recipe, identity, resolved = new.coverage.get("recipe"), new.identity, new.resolved
            lost = _seconds_lost(new.cost)
        cause = lost_cause(flag_names) if lost else ""
        if len(trace_id) > 128 - len(semconv.EXEMPLAR_TRACE_ID_LABEL):
            raise ValueError("Exemplar labels have more than 128 UTF-8 characters")
        ex = {semconv.EXEMPLAR_TRACE_ID_LABEL: trace_id}
        path_class = _label(kv_class or "unknown") if kv else "unknown"
        by_class = (path_class,)
        if flag_names:
            if old is not None and old.get("flags"):
                flag_names -= {f["name"] for f in old["flags"]}
            flags = sorted(flag_names)
        else:
            flags = []
        if not (isinstance(ttft, _NUMBER) and (old is None or old.get("ttft_s") is None)):
            ttft = None
        old_stages = (old.get("breakdown_s") or {}) if old is not None else {}
        with self._lock:
            now = time.time()
            one = (ex, 1, now)  # the exemplar of an increment by one
            if old is None and verdicts:
                value = _label(model)
                _inc(self._requests, (path_class, self._models.get(value) or self._model(value)), 1, one)
                resolution = resolution_label(resolved, identity)
                _inc(self._resolution, (_label(recipe or "unknown"), _label(resolution)), 1, one)
                if pre.get("node") or dec.get("node"):
                    p_node, d_node = _label(pre.get("node")), _label(dec.get("node"))
                    key = (
                        self._nodes.get(p_node) or self._node(p_node),
                        self._nodes.get(d_node) or self._node(d_node),
                        _label(pairing_level or "unknown"),
                    )
                    _inc(self._pairings, key, 1, one)
                if lost:
                    _inc(self._seconds_lost, (cause,), lost, (ex, lost, now))
            if verdicts:
                for name in flags:
                    _inc(self._flags, (_label(name), path_class), 1, one)
            if kv and not (old is not None and old.get("kv_transfer")):
                if verdicts:
                    _inc(self._kv_transfers, (_label(transport or "unknown"), path_class), 1, one)
                if isinstance(duration, _NUMBER) and duration >= 0:
                    self._kv_duration.add(by_class, duration, (ex, duration, now))
                    d_node, nic = _label(dec.get("node")), _label(dec.get("nic"))
                    node = (
                        self._nodes.get(d_node) or self._node(d_node),
                        self._nics.get(nic) or self._nic(nic),
                        path_class,
                    )
                    _inc(self._kv_node_seconds, node, duration, None)
                    if isinstance(size, int) and size >= 0:
                        _inc(self._kv_node_bytes, node, size, None)
                        if duration > 0:
                            rate = size / duration
                            self._kv_bandwidth.add(by_class, rate, (ex, rate, now))
            if ttft is not None:
                self._ttft.add(by_class, ttft, (ex, ttft, now))
            if breakdown:
                # The stages, a third of the updates: `Histogram.add` inline (a NaN is not >= 0).
                stage = self._stage
                series, bounds = stage.series, stage.bounds
                for name, seconds in breakdown.items():
                    if name not in old_stages and isinstance(seconds, _NUMBER) and seconds >= 0:
                        stage_key = (_label(name), path_class)
                        s = series.get(stage_key)
                        if s is None:
                            s = stage.create(stage_key)
                        s[2] += seconds
                        i = bisect_left(bounds, seconds)
                        s[0][i] += 1
                        s[1][i] = (ex, seconds, now)

    def verdicts_revised(
        self, new: Sequence[RequestSummary | dict[str, Any]], old: Iterable[dict[str, Any]]
    ) -> None:
        """Count what a re-assembly changed in the verdict counters (`VERDICT_COUNTERS`).

        `old` are the stored summaries that `new` replace (late spans, traces stitched into one
        request, a request split). The verdicts `new` hold and `old` did not are added to the
        counters; those `old` held and `new` do not are added to the family's `_retracted_total`
        counter, with the labels they had been counted under. Both stay monotonic, and
        `<family>_total - <family>_retracted_total` is what the store holds now: the numbers of
        the API and the UI (docs/ui.md, "Counts that agree"). Histograms are not corrected
        (`request_assembled` observes a request's TTFT and KV transfer once).
        """
        dicts = [s if isinstance(s, dict) else s.to_dict() for s in new]
        with self._lock:
            now = time.time()
            gained: dict[tuple[str, tuple[str, ...]], tuple[float, str]] = {}
            for d in dicts:
                for name, key, amount in self._verdict_keys(d):
                    n, _ = gained.get((name, key), (0, ""))
                    gained[name, key] = (n + amount, str(d.get("trace_id", "")))
            for d in old:
                for name, key, amount in self._verdict_keys(d):
                    n, tid = gained.get((name, key), (0, ""))
                    gained[name, key] = (n - amount, tid or str(d.get("trace_id", "")))
            for (name, key), (n, tid) in gained.items():
                if abs(n) < _SECONDS_EPSILON:  # equal, or seconds that differ by rounding only
                    continue
                if n > 0:
                    value = n if name == semconv.M_SECONDS_LOST else 1
                    ex = ({semconv.EXEMPLAR_TRACE_ID_LABEL: tid}, value, now) if tid else None
                    _inc(self.families[name], key, n, ex)
                else:
                    _inc(self.families[semconv.RETRACTED[name]], key, -n, None)

    def _verdict_keys(self, d: dict[str, Any]) -> list[tuple[str, tuple[str, ...], float]]:
        """The verdict counter series a stored summary counts in, and by how much (1, or its
        seconds lost), as `request_assembled` counts a first assembly; the caller holds the lock."""
        kv = d.get("kv_transfer") or None
        path_class = _label((kv or {}).get("path_class") or "unknown")
        model = _label(d.get("model"))
        resolution = resolution_label(bool(d.get("resolved")), d.get("identity") or {})
        out: list[tuple[str, tuple[str, ...], float]] = [
            (semconv.M_REQUESTS, (path_class, self._models.get(model) or self._model(model)), 1),
            (
                semconv.M_LEG_RESOLUTION,
                (_label((d.get("coverage") or {}).get("recipe") or "unknown"), resolution),
                1,
            ),
        ]
        pre, dec = d.get("prefill") or {}, d.get("decode") or {}
        if pre.get("node") or dec.get("node"):
            p_node, d_node = _label(pre.get("node")), _label(dec.get("node"))
            level = _label(d.get("pairing_level") or "unknown")
            nodes = (
                self._nodes.get(p_node) or self._node(p_node),
                self._nodes.get(d_node) or self._node(d_node),
            )
            out.append((semconv.M_PAIRINGS, (*nodes, level), 1))
        flag_names = sorted({f["name"] for f in d.get("flags") or ()})
        for name in flag_names:
            out.append((semconv.M_FLAGS, (_label(name), path_class), 1))
        if kv:
            out.append((semconv.M_KV_TRANSFERS, (_label(kv.get("transport") or "unknown"), path_class), 1))
        lost = _seconds_lost(d.get("cost"))
        if lost:
            out.append((semconv.M_SECONDS_LOST, (lost_cause(flag_names),), lost))
        return out
