"""Label values a sender chooses (model, nodes, NICs) cannot grow `/metrics` without end:
`LabelBound` admits listed, topology-known and the first N values, folds the rest into `other`;
a family stops at `max_series`; counts folded into `other` are counted there, so totals add up;
and the serve process bounds what assembly children send the same way."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from railtrace.metrics import (
    DEFAULT_LABEL_VALUES,
    DEFAULT_MAX_SERIES,
    OTHER,
    LabelBound,
    MetricLimits,
    Metrics,
    TopologyLabels,
    metric_limits,
)
from railtrace.scheduling.workers import RecordedMetrics
from railtrace.settings import Settings
from railtrace.topology import NIC, Node, Topology
from railtrace_tracing import semconv

OPENMETRICS = "application/openmetrics-text"


def summary(
    n: int, *, model: str | None = None, pre: str | None = None, dec: str | None = None
) -> dict[str, Any]:
    """A request summary whose model and nodes are the sender's choice (`n` by default)."""
    return {
        "trace_id": f"{n:032x}",
        "model": model if model is not None else f"model-{n}",
        "ttft_s": 0.3,
        "breakdown_s": {"prefill": 0.1, "kv_transfer": 0.01, "decode": 0.2},
        "prefill": {"node": pre if pre is not None else f"p-node-{n}"},
        "decode": {"node": dec if dec is not None else f"d-node-{n}", "nic": f"nic-{n}"},
        "pairing_level": "rack",
        "kv_transfer": {
            "transport": "rdma",
            "path_class": "rdma_same_rail",
            "duration_s": 0.01,
            "bytes": 4096,
        },
        "flags": [{"name": "slow_kv_transfer"}],
        "resolved": True,
        "identity": {"prefill": "k8s_resource", "decode": "k8s_resource"},
        "coverage": {"recipe": "full"},
    }


def samples(metrics: Metrics, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The `_total` samples of one counter family, by label set."""
    text = metrics.render(None)[0].decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == family:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_first_values_then_other() -> None:
    bound = LabelBound("model", 3)
    assert [bound(f"m{i}") for i in range(5)] == ["m0", "m1", "m2", OTHER, OTHER]
    assert bound("m1") == "m1"  # admitted for good
    assert bound("") == "" and bound(OTHER) == OTHER and bound.seen == 3  # neither takes a slot


def test_listed_and_known_values_need_no_slot() -> None:
    known = {"node-a"}
    bound = LabelBound("node", 1, allowed=["listed"], known=lambda name, v: name == "node" and v in known)
    assert bound("x") == "x"
    assert bound("y") == OTHER
    assert bound("listed") == "listed" and bound("node-a") == "node-a"
    known.add("node-b")  # the topology learns a node after its requests were folded
    assert bound("node-b") == "node-b"
    assert LabelBound("node", 0)("z") == OTHER
    assert LabelBound("node", None)("z") == "z"  # unbounded (an assembly child)


def test_topology_labels_follow_the_current_topology() -> None:
    t1 = Topology(
        nodes={"n1": Node("n1")}, nics=(NIC("n1", "pci-0000-10-1b-0", rdma_device="mlx5_3", if_name="ens3"),)
    )
    current = [None, t1]
    known = TopologyLabels(lambda: current[-1])
    assert known("node", "n1") and not known("node", "n2")
    assert known("nic", "mlx5_3") and known("nic", "ens3") and known("nic", "pci-0000-10-1b-0")
    current.append(Topology(nodes={"n2": Node("n2")}))
    assert known("node", "n2") and not known("node", "n1")
    current.append(None)
    assert not known("node", "n2")


def test_distinct_models_fold_into_other_and_still_add_up() -> None:
    metrics = Metrics(limits=MetricLimits(label_values=10, allowed={"model": ("llama",)}))
    for n in range(1000):
        metrics.request_assembled(summary(n), None)
    for n in range(1000, 1005):
        metrics.request_assembled(summary(n, model="llama"), None)
    requests = samples(metrics, "llm_d_tracing_requests_total")
    models = {dict(k)["model"]: v for k, v in requests.items()}
    assert len(models) == 12  # the first ten, the listed one, other
    assert models[OTHER] == 990 and models["llama"] == 5 and models["model-0"] == 1
    assert sum(requests.values()) == 1005
    pairings = samples(metrics, "llm_d_tracing_pairings_total")
    assert len(pairings) <= 11 * 11 and sum(pairings.values()) == 1005
    kv_bytes = samples(metrics, "llm_d_tracing_kv_transfer_bytes_total")
    assert len(kv_bytes) <= 11 * 11 and sum(kv_bytes.values()) == 1005 * 4096


def test_a_family_stops_at_max_series() -> None:
    """Known nodes are never folded by the label bound; the family cap still holds."""
    metrics = Metrics(limits=MetricLimits(max_series=50, known=lambda name, v: True))
    for n in range(2000):
        metrics.request_assembled(summary(n), None)
    for name in ("llm_d_tracing_pairings_total", "llm_d_tracing_kv_transfer_seconds_total"):
        series = samples(metrics, name)
        assert 50 <= len(series) <= 51, name
    pairings = samples(metrics, "llm_d_tracing_pairings_total")
    assert sum(pairings.values()) == 2000
    folded = (("decode_node", OTHER), ("level", "rack"), ("prefill_node", OTHER))
    assert pairings[folded] == 2000 - 50


def test_children_are_bounded_where_they_are_added_in() -> None:
    parent = Metrics(limits=MetricLimits(label_values=5))
    children = [RecordedMetrics(), RecordedMetrics()]
    for n in range(400):
        children[n % 2].request_assembled(summary(n), None)
        if n % 37 == 0:
            for child in children:
                parent.merge(child.take())
    for child in children:
        parent.merge(child.take())
    requests = samples(parent, "llm_d_tracing_requests_total")
    assert len(requests) == 6 and sum(requests.values()) == 400
    models = {dict(k)["model"] for k in requests}
    assert OTHER in models and all(m.startswith("model-") for m in models - {OTHER})  # first merged, first in
    assert len(samples(parent, "llm_d_tracing_pairings_total")) <= 36


@pytest.mark.parametrize("accept", [None, OPENMETRICS])
def test_metrics_stay_under_a_megabyte_with_the_defaults(accept: str | None) -> None:
    """The worst a sender can do with the default settings: every request with new
    128-character model, node and NIC names, in every path class, until every family is full
    (plus every other family filled as far as its fixed label values go)."""
    metrics = Metrics()
    long = "x" * 120
    classes = list(semconv.PathClass)
    for n in range(6000):
        # Nodes and NICs in every combination, so the families with two of them fill up too.
        pre, dec, nic = n % 60, (n // 60) % 60, (n // 7) % 60
        s = summary(n, model=f"{long}m{n:07d}", pre=f"{long}p{pre:07d}", dec=f"{long}d{dec:07d}")
        s["decode"]["nic"] = f"{long}n{nic:07d}"
        s["kv_transfer"]["path_class"] = classes[n % len(classes)]
        s["kv_transfer"]["transport"] = list(semconv.Transport)[n % len(semconv.Transport)]
        s["flags"] = [{"name": f} for f in semconv.FlagName]
        s["pairing_level"] = list(semconv.TopologyLevel)[n % len(semconv.TopologyLevel)]
        s["breakdown_s"] = {st: 0.1 for st in semconv.Stage}
        metrics.request_assembled(s, None)
    for n in range(200):
        metrics.assembly_failed(semconv.AssemblyStage.BUILD, f"{long}Error{n}")
    for protocol in ("http", "grpc"):
        for outcome in ("ok", "partial", "invalid", "too_large", "timeout", "throttled"):
            metrics.export_done(protocol, outcome, 1, 1)
        metrics.throttled(protocol)
    body = metrics.render(accept)[0]
    assert len(body) < 1024 * 1024, len(body)
    assert sum(samples(metrics, "llm_d_tracing_requests_total").values()) == 6000


def test_settings_defaults_are_the_limits_defaults() -> None:
    limits = metric_limits(Settings(db="sqlite://"))
    assert (limits.label_values, limits.max_series) == (DEFAULT_LABEL_VALUES, DEFAULT_MAX_SERIES)
    assert metric_limits(Settings(db="sqlite://", metrics_models=["a", "b"])).allowed["model"] == ("a", "b")


def test_a_merge_into_a_folded_series_keeps_its_creation_time(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    clock = [1_800_000_000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    parent = Metrics(limits=MetricLimits(max_series=3, known=lambda name, v: True))
    for n in range(5):  # three series, then the fold into other
        parent.request_assembled(summary(n), None)
    family = parent[semconv.M_PAIRINGS]
    folded = (OTHER, OTHER, "rack")
    born = family.series[folded][2]
    clock[0] += 100
    child = RecordedMetrics()
    for n in range(5, 9):
        child.request_assembled(summary(n), None)
    parent.merge(child.take())
    assert family.series[folded][2] == born and family.series[folded][0] == 6
    assert len(family.series) == 4
