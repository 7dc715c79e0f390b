"""railtrace's own metric families (`railtrace.metrics`) expose what prometheus_client's
`Counter`, `Histogram` and `Gauge` would for the same updates, in the text format and in
OpenMetrics with exemplars; a child's deltas merged in the serve process equal counting in
place; and counting while deltas are taken loses nothing."""

from __future__ import annotations

import itertools
import math
import random
import threading
import time
from typing import Any

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client import generate_latest as text_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from railtrace.metrics import KNOWN_SERIES, Metrics
from railtrace.scheduling.workers import RecordedMetrics
from railtrace_tracing import semconv

OPENMETRICS = "application/openmetrics-text"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A wall clock both implementations read (creation and exemplar times); tests move it."""
    now = [1_800_000_000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    return now


class Reference:
    """prometheus_client's own families for the registry, updated by the rules as they were
    written against them (the oracle the aggregation is checked against)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.families: dict[str, Any] = {}
        for m in semconv.METRICS:
            if m.type == "counter":
                f: Any = prometheus_client.Counter(m.name, m.description, m.labels, registry=self.registry)
            elif m.type == "gauge":
                f = prometheus_client.Gauge(m.name, m.description, m.labels, registry=self.registry)
            else:
                f = prometheus_client.Histogram(
                    m.name, m.description, m.labels, registry=self.registry, buckets=m.buckets
                )
            self.families[m.name] = f
        for name, keys in KNOWN_SERIES.items():  # series railtrace exposes at 0 from the start
            for key in keys:
                self.families[name].labels(*key)

    def __getitem__(self, name: str) -> Any:
        return self.families[name]

    def render(self, accept: str | None) -> tuple[bytes, str]:
        if accept == OPENMETRICS:
            return openmetrics_latest(self.registry), ""
        return text_latest(self.registry), ""

    def export_done(self, protocol: str, outcome: str, committed: int = 0, rejected: int = 0) -> None:
        self[semconv.M_EXPORTS].labels(protocol, outcome).inc()
        if committed:
            self[semconv.M_SPANS_RECEIVED].labels(protocol).inc(committed)
        if rejected:
            self[semconv.M_SPANS_REJECTED].labels("invalid_span").inc(rejected)

    def throttled(self, protocol: str) -> None:
        self[semconv.M_THROTTLED].labels(protocol).inc()
        self[semconv.M_EXPORTS].labels(protocol, "throttled").inc()

    def request_assembled(self, new: dict[str, Any], old: dict[str, Any] | None) -> None:
        def label(value: Any) -> str:
            return "" if value is None else str(value)[:128]

        ex = {"trace_id": str(new.get("trace_id", ""))}
        kv = new.get("kv_transfer") or None
        old_kv = (old or {}).get("kv_transfer") or None
        path_class = label((kv or {}).get("path_class") or "unknown")
        if old is None:
            self[semconv.M_REQUESTS].labels(path_class, label(new.get("model"))).inc(exemplar=ex)
            identity = new.get("identity") or {}
            resolution = (
                f"{identity.get('prefill') or 'none'}+{identity.get('decode') or 'none'}"
                if new.get("resolved")
                else "unresolved"
            )
            recipe = label((new.get("coverage") or {}).get("recipe") or "unknown")
            self[semconv.M_LEG_RESOLUTION].labels(recipe, label(resolution)).inc(exemplar=ex)
            pre, dec = new.get("prefill") or {}, new.get("decode") or {}
            if pre.get("node") or dec.get("node"):
                level = label(new.get("pairing_level") or "unknown")
                self[semconv.M_PAIRINGS].labels(label(pre.get("node")), label(dec.get("node")), level).inc(
                    exemplar=ex
                )
        old_flags = {f["name"] for f in (old or {}).get("flags") or []}
        for name in sorted({f["name"] for f in new.get("flags") or []} - old_flags):
            self[semconv.M_FLAGS].labels(label(name), path_class).inc(exemplar=ex)
        if kv and not old_kv:
            transport = label(kv.get("transport") or "unknown")
            self[semconv.M_KV_TRANSFERS].labels(transport, path_class).inc(exemplar=ex)
            duration, size = kv.get("duration_s"), kv.get("bytes")
            if isinstance(duration, int | float) and duration >= 0:
                self[semconv.M_KV_DURATION].labels(path_class).observe(duration, exemplar=ex)
                dec = new.get("decode") or {}
                node, nic = label(dec.get("node")), label(dec.get("nic"))
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
                self[semconv.M_STAGE].labels(label(stage), path_class).observe(seconds, exemplar=ex)


def _summary(rnd: random.Random, n: int, exact: bool = False) -> dict[str, Any]:
    """A request summary with every shape `request_assembled` distinguishes; `exact` keeps to
    values whose sums are exact in binary, so any order of adding gives the same sum."""
    seconds = [0.0, 0.25, 0.5, 2.0, 0.0009765625, 64.0] if exact else [0.02, 0.0, 0.4, 3.0, 1e-9, 0.0025]
    kv = rnd.choice(
        [
            None,
            {},
            {
                "transport": rnd.choice(["tcp", "rdma", None]),
                "path_class": rnd.choice(["rdma_same_rail", "tcp_fallback", None, "x" * 200]),
                "duration_s": rnd.choice([*seconds, -1.0, None, 2]),
                "bytes": rnd.choice([4096, None, 0, 2**30, -5]),
            },
        ]
    )
    stages = ["queue", "prefill", "kv_transfer", "decode_first"]
    return {
        "trace_id": f"{n:032x}",
        "model": rnd.choice(["m", None, "llama"]),
        "ttft_s": rnd.choice([*seconds, None, -0.5, 100.0, *([] if exact else [math.nan, math.inf])]),
        "breakdown_s": {s: rnd.choice([*seconds, -1.0, None]) for s in rnd.sample(stages, rnd.randint(0, 4))},
        "prefill": rnd.choice([{}, {"node": "n1"}, {"node": None}]),
        "decode": {"node": rnd.choice(["n2", "n3", None]), "nic": rnd.choice(["mlx5_0", None])},
        "pairing_level": rnd.choice(["block", "rail", None]),
        "kv_transfer": kv,
        "flags": [
            {"name": f} for f in rnd.sample(["tcp_fallback", "cross_block", "slow"], rnd.randint(0, 3))
        ],
        # From the request's own number: the shared stream's draws above stay as they were.
        "resolved": n % 2 == 0,
        "identity": [{}, {"prefill": "otlp_peer", "decode": "k8s_resource"}, {"decode": "epp_pick"}][n % 3],
        "coverage": [{}, {"recipe": "full"}, {"recipe": "decode_only"}][n % 5 % 3],
    }


def _requests(
    seed: int, count: int, exact: bool = False
) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    rnd = random.Random(seed)
    return [
        (_summary(rnd, n, exact), _summary(rnd, n, exact) if rnd.random() < 0.3 else None)
        for n in range(count)
    ]


def _count(
    target: Any,
    requests: list[tuple[dict[str, Any], dict[str, Any] | None]],
    clock: list[float],
    first: int = 0,
) -> None:
    """What the assembler counts, with the clock moving between requests (`first`: the number
    of the first of them)."""
    for n, (new, old) in enumerate(requests, start=first):
        clock[0] += 0.001
        target.request_assembled(new, old)
        target[semconv.M_ASSEMBLY_LAG].observe(n / 64, exemplar={"trace_id": new["trace_id"]})
        if n % 5 == 0:
            target[semconv.M_STITCHED].inc()
            target[semconv.M_SPANS_REJECTED].labels("assembly_failed").inc(3)
            target[semconv.M_PENDING].set(n)


def _ingest(target: Any) -> None:
    target.export_done("http", "ok", committed=5, rejected=2)
    target.export_done("grpc", "invalid")
    target.throttled("grpc")
    target[semconv.M_INGEST_QUEUE].set(4)
    target[semconv.M_CONTRACT].labels("preserved", "ok").set(3)


@pytest.mark.parametrize("accept", [None, OPENMETRICS])
def test_empty_families_expose_as_prometheus_client(clock: list[float], accept: str | None) -> None:
    assert Metrics().render(accept)[0] == Reference().render(accept)[0]


@pytest.mark.parametrize("accept", [None, OPENMETRICS])
def test_counting_exposes_what_prometheus_client_would(clock: list[float], accept: str | None) -> None:
    """Every family type, labelled and not, NaN, infinities, negative and boundary values,
    exemplars on counters and buckets: byte for byte the same exposition."""
    ours, reference = Metrics(), Reference()
    requests = _requests(1, 300)
    for target in (ours, reference):
        clock[0] = 1_800_000_000.0
        _count(target, requests, clock)
        _ingest(target)
        for bound in semconv.METRICS_BY_NAME[semconv.M_TTFT].buckets:  # an observation on each bound
            target[semconv.M_TTFT].labels("edge").observe(bound, exemplar={"trace_id": "e" * 32})
        target[semconv.M_KV_NODE_SECONDS].labels("n", "nic", "edge")  # looked up, never counted
    body = ours.render(accept)[0]
    assert body == reference.render(accept)[0]
    if accept == OPENMETRICS:
        assert b'# {trace_id="' in body
        clean = Metrics()  # well-formed OpenMetrics (a NaN sum, as above, is not)
        _count(clean, _requests(4, 100, exact=True), clock)
        families = {f.name: f for f in parse_openmetrics(clean.render(accept)[0].decode())}
        assert any(s.exemplar for s in families["llm_d_tracing_stage_duration_seconds"].samples)
    # The collected samples too (compared as text: a NaN sum is not equal to itself).
    assert repr(list(ours.registry.collect())) == repr(list(reference.registry.collect()))


def test_family_api_checks_as_prometheus_client() -> None:
    metrics = Metrics()
    with pytest.raises(ValueError):
        metrics[semconv.M_REQUESTS].labels("only-one")
    with pytest.raises(ValueError):
        metrics[semconv.M_STITCHED].labels("x")
    with pytest.raises(ValueError):
        metrics[semconv.M_REQUESTS].inc()  # a labelled family needs its labels
    with pytest.raises(ValueError):
        metrics[semconv.M_STITCHED].inc(-1)
    with pytest.raises(ValueError):
        metrics[semconv.M_ASSEMBLY_LAG].observe(1.0, exemplar={"trace_id": "x" * 121})
    with pytest.raises(ValueError):
        metrics.request_assembled({"trace_id": "x" * 121}, None)
    assert metrics[semconv.M_SPANS_REJECTED].labels("a") is metrics[semconv.M_SPANS_REJECTED].labels("a")


@pytest.mark.parametrize("accept", [None, OPENMETRICS])
@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_merged_deltas_equal_counting_in_place(clock: list[float], accept: str | None, batch: int) -> None:
    """A child counting and handing over deltas every `batch` requests, merged in the serve
    process beside its own ingest counts, exposes what counting in place does (with values
    whose sums are exact: a delta's sum is added as one number, so otherwise a sum can differ
    in its last digit from adding the observations one by one)."""
    requests = _requests(2, 400, exact=True)
    direct = Metrics()
    _count(direct, requests, clock)
    _ingest(direct)

    clock[0] = 1_800_000_000.0
    child, served = RecordedMetrics(), Metrics()
    for start in range(0, len(requests), batch):
        _count(child, requests[start : start + batch], clock, first=start)
        served.merge(child.take())
    assert child.take() == {}
    _ingest(served)

    def without_created(m: Metrics) -> list[str]:  # series are created in the serve process
        return [line for line in m.render(accept)[0].decode().splitlines() if "_created" not in line]

    assert without_created(served) == without_created(direct)


def test_delta_carries_a_series_once_with_its_sum_and_latest_exemplar(clock: list[float]) -> None:
    child = RecordedMetrics()
    for n in range(5):
        clock[0] += 1
        child.request_assembled({"trace_id": f"{n:032x}", "model": "m", "ttft_s": 0.5}, None)
    delta = child.take()
    value, exemplar, _ = delta[semconv.M_REQUESTS][("unknown", "m")]
    assert value == 5 and exemplar[0] == {"trace_id": f"{4:032x}"} and exemplar[1] == 1
    counts, exemplars, total, _ = delta[semconv.M_TTFT][("unknown",)]
    assert sum(counts) == 5 and total == 2.5
    assert [e[0]["trace_id"] for e in exemplars if e] == [f"{4:032x}"]
    assert semconv.M_PENDING not in delta  # a child sends no zero gauges...
    assert semconv.M_INGEST_QUEUE not in delta  # ...that would overwrite the serve process's

    served = Metrics()
    served[semconv.M_INGEST_QUEUE].set(9)
    served.merge(delta)
    body = served.render(OPENMETRICS)[0].decode()
    assert (
        f'llm_d_tracing_requests_total{{model="m",path_class="unknown"}} 5.0 # {{trace_id="{4:032x}"}} 1.0'
        in body
    )
    assert "llm_d_tracing_ingest_queue_depth 9.0" in body


def test_the_latest_exemplar_wins_across_children(clock: list[float]) -> None:
    """Two children's deltas arriving out of order: the exemplar observed last stays."""
    first, second, served = RecordedMetrics(), RecordedMetrics(), Metrics()
    clock[0] = 100.0
    second.request_assembled({"trace_id": "b" * 32, "ttft_s": 0.5}, None)
    clock[0] = 50.0
    first.request_assembled({"trace_id": "a" * 32, "ttft_s": 0.5}, None)
    served.merge(second.take())
    served.merge(first.take())
    body = served.render(OPENMETRICS)[0].decode()
    assert (
        f'llm_d_tracing_requests_total{{model="",path_class="unknown"}} 2.0 # {{trace_id="{"b" * 32}"}}'
        in body
    )
    bucket = 'llm_d_tracing_ttft_seconds_bucket{le="0.5",path_class="unknown"} 2.0'
    assert f'{bucket} # {{trace_id="{"b" * 32}"}} 0.5 100.0' in body


def test_counting_while_deltas_are_taken_loses_nothing() -> None:
    """The child's assembler thread counts, also through handles made earlier, while its main
    thread takes deltas away: every update lands in exactly one delta."""
    child = RecordedMetrics()
    handle = child[semconv.M_SPANS_REJECTED].labels("assembly_failed")
    lag = child[semconv.M_ASSEMBLY_LAG]
    requests = _requests(3, 50, exact=True)
    done = threading.Event()
    served = Metrics()

    def take_until_done() -> None:
        while not done.is_set():
            served.merge(child.take())
        served.merge(child.take())

    reader = threading.Thread(target=take_until_done)
    reader.start()
    direct = Metrics()
    for (new, old), _ in zip(itertools.cycle(requests), range(20_000), strict=False):
        for target in (child, direct):
            target.request_assembled(new, old)
            target[semconv.M_SPANS_REJECTED].labels("assembly_failed").inc()
            target[semconv.M_ASSEMBLY_LAG].observe(0.5)
        handle.inc(0)
        lag.observe(0.0, exemplar={"trace_id": "f" * 32})
        direct[semconv.M_ASSEMBLY_LAG].observe(0.0)
    done.set()
    reader.join()

    def values(m: Metrics) -> list[str]:  # counts and sums, without times and exemplars
        return [
            line
            for line in m.render(None)[0].decode().splitlines()
            if "_created" not in line and "_sum" not in line
        ]

    assert values(served) == values(direct)


def _summary_object(summary: dict[str, Any]) -> Any:
    """The `RequestSummary` whose `to_dict` gives this summary's fields."""
    from railtrace.model import Flag, KVSummary, RequestSummary

    kv = summary["kv_transfer"]
    return RequestSummary(
        trace_id=summary["trace_id"],
        request_id=None,
        model=summary["model"],
        start="2026-12-01T00:00:00Z",
        ttft_s=summary["ttft_s"],
        e2e_s=None,
        breakdown_s=summary["breakdown_s"],
        prefill=summary["prefill"],
        decode=summary["decode"],
        kv_transfer=KVSummary(
            transport=kv["transport"],
            path_class=kv["path_class"],
            bytes=kv["bytes"],
            duration_s=kv["duration_s"],
        )
        if kv
        else None,
        flags=[Flag(f["name"], "") for f in summary["flags"]],
        pairing_level=summary["pairing_level"],
    )


@pytest.mark.parametrize("accept", [None, OPENMETRICS])
def test_a_summary_object_counts_as_its_dict(clock: list[float], accept: str | None) -> None:
    """`request_assembled` given the `RequestSummary` counts what it counts given `to_dict()`."""
    as_dicts, as_objects = Metrics(), Metrics()
    for new, old in _requests(5, 300):
        summary = _summary_object(new)
        as_dicts.request_assembled(summary.to_dict(), old)
        as_objects.request_assembled(summary, old)
    assert as_objects.render(accept)[0] == as_dicts.render(accept)[0]
