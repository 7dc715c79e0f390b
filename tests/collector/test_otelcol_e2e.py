"""End to end through the real collector, both tiers as shipped.

Simulated llm-d processes export with the official OTel SDK (OTLP/HTTP); the engines and sidecars
carry no `k8s.*` resource attributes, as vLLM and the Go sidecar emit them. Each pod's exporter
sends from its own loopback address, which the fake Kubernetes API server gives as that pod's IP,
so tier 1's `k8sattributes` associates by connection as it does in a cluster. Tier 1 routes by
trace id (`loadbalancing`) to two tier-2 collectors; each sends its pre-sampling copy to its own
`railtrace serve` replica, both on one PostgreSQL database, and its tail-sampled traces to a trace
store (a third railtrace, on SQLite). The same traffic, with the resources the collector would
add, goes directly to a single replica for reference.

Checks: every span stored through the collectors is the span sent, with the pod, node and
namespace of the process that sent it; every trace holding a KV span the collector can see is
flagged (TCP, failed) is in the trace store; and the replicas' requests and verdicts equal the
single replica's (before, it did not: the Collector writes a KeyValue's value before its key,
and ingest read join keys only in the SDK's field order, so no trace through a collector
recorded one and split KV-transfer traces never joined their requests: tests/otlp/test_wire_order.py).

Test-only departures from the shipped files: local ports, `auth_type: kubeConfig` and
`wait_for_metadata` for k8sattributes, a static resolver instead of DNS, a 6 s decision wait, and
no servicegraph (not built: tests/collector/otelcol.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import yaml
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from requests.adapters import HTTPAdapter
from sqlalchemy import create_engine

from railtrace.model import Span
from railtrace.server.runner import Service
from railtrace.settings import Settings
from railtrace.simulator import Emitter, Processes, build_fleet, resolve, simulate
from railtrace.simulator.fleet import Fleet
from railtrace.store import Store
from railtrace_tracing import semconv as sc
from tests.collector.otelcol import REPO, otelcol_binary, without_unbuilt
from tests.conftest import _pg_schema_url
from tests.fixtures.otlp_fixtures import SinkExporter
from tests.k8s.k8s_fake_apiserver import FakeApiServer
from tests.scaleout.test_scaleout import send, settled, verdict_counts

REQUESTS = 30
SEED = 5
GENERATION = "current"
QUIET_S = 4.0
# Tier 2 waits 45 s for a trace's spans before deciding (collector_config/README.md); the test's
# traffic is all sent before the first decision is due.
DECISION_WAIT = "6s"
# The railtrace copy drops these before it leaves tier 2 (filter/railtrace, llm-d's scrape filter).
DROPPED_NAMES = {
    "index_add",
    "index_evict",
    "llm_d.kv_cache.index.add",
    "llm_d.kv_cache.index.evict",
    "GET /metrics",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _FromAddress(HTTPAdapter):
    """Connects from a given local address: the pod's IP as the collector sees it."""

    def __init__(self, source: str) -> None:
        self.source = source
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["source_address"] = (self.source, 0)
        super().init_poolmanager(*args, **kwargs)


def _traffic(
    topo: Path, exporter: Callable[..., Any], resources: str, base_ns: int | None = None
) -> tuple[Fleet, int]:
    """Emit the simulated requests through `exporter`; the fleet and the base time used (pass it
    to the next run so that both send the same spans, but for the resources)."""
    scenarios = resolve(None)
    fleet = build_fleet("a3-ultra", scenarios, SEED)
    # Pod IPs on the loopback range: each pod's exporter sends from its IP, and the addresses the
    # spans name (the sidecar's upstream, UCX's peer) must be the ones the collector sees.
    for i, pod in enumerate(fleet.pods):
        pod.ip = f"127.0.1.{i + 1}"
    fleet.write(topo)
    runs = simulate(fleet, scenarios, REQUESTS, SEED)
    procs = Processes(exporter, SEED)
    if base_ns is None:
        base_ns = time.time_ns() - int((max(r.end for r in runs) + 1.0) * 1e9)
    emitter = Emitter(fleet, procs, GENERATION, base_ns, resources=resources)
    for r in runs:
        emitter.emit(r)
    procs.flush()
    procs.shutdown()
    return fleet, base_ns


class Collector:
    """One otelcol process on a configuration, stopped by its PID."""

    def __init__(self, name: str, config: dict[str, Any], workdir: Path, env: dict[str, str]) -> None:
        self.name = name
        self.config_path = workdir / f"{name}.yaml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / f"{name}.log"
        self.health = config["extensions"]["health_check"]["endpoint"]
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [str(otelcol_binary()), f"--config={self.config_path}"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"http://{self.health}/", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{self.name} not healthy in {timeout} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()


def _telemetry_on(config: dict[str, Any], port: int) -> None:
    for reader in config["service"]["telemetry"]["metrics"]["readers"]:
        reader["pull"]["exporter"]["prometheus"].update(host="127.0.0.1", port=port)


def tier1_config(tier2_endpoints: list[str]) -> tuple[dict[str, Any], str]:
    """The shipped tier 1 on free local ports, against the fake API server, routing to `tier2_endpoints`."""
    config = yaml.safe_load((REPO / "collector_config" / "tier1-loadbalancer.yaml").read_text())
    http_port = _free_port()
    protocols = config["receivers"]["otlp"]["protocols"]
    protocols["grpc"]["endpoint"] = f"127.0.0.1:{_free_port()}"
    protocols["http"]["endpoint"] = f"127.0.0.1:{http_port}"
    # In a cluster the pod's service account; here the fake API server's kubeconfig ($KUBECONFIG).
    k8s = config["processors"]["k8sattributes"]
    k8s["auth_type"] = "kubeConfig"
    k8s["wait_for_metadata"] = True  # no span before the pod list is in
    # A cluster's tier 2 is found through its headless Service's DNS; here, the two listed.
    config["exporters"]["loadbalancing"]["resolver"] = {"static": {"hostnames": tier2_endpoints}}
    config["extensions"]["health_check"]["endpoint"] = f"127.0.0.1:{_free_port()}"
    _telemetry_on(config, _free_port())
    return config, f"http://127.0.0.1:{http_port}"


def tier2_config(railtrace_url: str, trace_store: str) -> tuple[dict[str, Any], str]:
    config, removed = without_unbuilt(
        yaml.safe_load((REPO / "collector_config" / "tier2-sampler.yaml").read_text())
    )
    assert removed == ["servicegraph"]
    grpc_endpoint = f"127.0.0.1:{_free_port()}"
    protocols = config["receivers"]["otlp"]["protocols"]
    protocols["grpc"]["endpoint"] = grpc_endpoint
    protocols["http"]["endpoint"] = f"127.0.0.1:{_free_port()}"
    config["exporters"]["otlphttp/railtrace"]["endpoint"] = railtrace_url
    config["exporters"]["otlp/tracestore"]["endpoint"] = trace_store
    config["exporters"]["prometheus"]["endpoint"] = f"127.0.0.1:{_free_port()}"
    config["processors"]["tail_sampling"]["decision_wait"] = DECISION_WAIT
    config["extensions"]["health_check"]["endpoint"] = f"127.0.0.1:{_free_port()}"
    _telemetry_on(config, _free_port())
    return config, grpc_endpoint


@dataclass
class Run:
    """One pass of the traffic through both tiers, and the same traffic fed to one replica."""

    sent: dict[tuple[str, str], ReadableSpan]  # (trace id, span id) -> the span as the reference sent it
    stored: list[Span]  # the spans the replicas stored, as they arrived through the collectors
    single: list[dict[str, Any]]  # request rows of the replica fed directly
    shared: list[dict[str, Any]]  # request rows of the two replicas behind the collectors
    single_counts: dict[tuple[str, str], float]
    shared_counts: dict[tuple[str, str], float]
    kept: set[str]  # trace ids the tail sampler sent to the trace store


def _databases(pg_admin: object, tmp: Path) -> Iterator[tuple[str, str, str]]:
    single, shared = _pg_schema_url(pg_admin), _pg_schema_url(pg_admin)
    try:
        yield next(single), next(shared), f"sqlite:///{tmp / 'trace-store.db'}"
    finally:
        next(single, None)
        next(shared, None)


@pytest.fixture(scope="module")
def run(pg_admin: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    otelcol_binary()  # build (or find) before any server starts
    tmp = tmp_path_factory.mktemp("otelcol-e2e")
    databases = _databases(pg_admin, tmp)
    single_url, shared_url, store_url = next(databases)
    topo = tmp / "topology"

    # Reference: what the collectors would deliver, fed directly to one replica.
    sink: list[ReadableSpan] = []
    lock = threading.Lock()
    fleet, base_ns = _traffic(topo, lambda **_: SinkExporter(sink, lock), "collector")
    expected = [s for s in sink if s.name not in DROPPED_NAMES]
    sent = {(format(s.context.trace_id, "032x"), format(s.context.span_id, "016x")): s for s in expected}
    n = len(sent)
    # Both the collectors and the stand-in for one (the direct feed of collector-shaped spans)
    # connect from loopback: railtrace believes their k8s.*, as a deployment lists its collectors.
    settings = {
        "topology": [str(topo)],
        "port": 0,
        "grpc_port": 0,
        "quiet_period_s": QUIET_S,
        "trusted_collectors": ["127.0.0.1/32"],
    }
    with Service(Settings(db=single_url, assembly_interval_s=0.05, **settings)) as one:
        send([one.http_url], expected)
        single = settled(single_url, n, QUIET_S)
        single_counts = verdict_counts([one.http_url])

    # The cluster: the fleet's pods (loopback IPs) on the fake API server. client-go sends a
    # kubeconfig's token only over TLS, and the fake serves plain HTTP: no authentication.
    apiserver = FakeApiServer(token=None).start()
    for obj in fleet.k8s_objects():
        if obj["kind"] == "Pod":
            apiserver.put(obj)
    kubeconfig = tmp / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(apiserver.kubeconfig()))

    replicas = [Service(Settings(db=shared_url, assembly_interval_s=0.05, **settings)) for _ in range(2)]
    starting = [threading.Thread(target=s.start) for s in replicas]  # concurrent start: migrations race
    for t in starting:
        t.start()
    for t in starting:
        t.join()
    trace_store = Service(Settings(db=store_url, port=0, grpc_port=0, quiet_period_s=QUIET_S))
    trace_store.start()
    collectors: list[Collector] = []
    try:
        tier2_endpoints = []
        for i, replica in enumerate(replicas):
            config, endpoint = tier2_config(replica.http_url, trace_store.grpc_endpoint)
            collectors.append(Collector(f"tier2-{i}", config, tmp, {"POD_NAME": f"otelcol-sampler-{i}"}))
            tier2_endpoints.append(endpoint)
        config, tier1_url = tier1_config(tier2_endpoints)
        collectors.append(Collector("tier1", config, tmp, {"KUBECONFIG": str(kubeconfig)}))
        for c in collectors:
            c.wait_ready()

        def exporter(sender: str | None = None) -> OTLPSpanExporter:
            session = requests.Session()
            if sender is not None:  # the EPP, whose k8s.* the router chart sets, sends from 127.0.0.1
                session.mount("http://", _FromAddress(sender))
            return OTLPSpanExporter(endpoint=f"{tier1_url}/v1/traces", session=session, timeout=30)

        _traffic(tmp / "topology-live", exporter, "emitted", base_ns)
        try:
            shared = settled(shared_url, n, QUIET_S)
        except AssertionError:
            logs = "\n".join(f"--- {c.name}\n{c.log()}" for c in collectors)
            raise AssertionError(f"spans did not all arrive through the collectors:\n{logs}") from None
        shared_counts = verdict_counts([r.http_url for r in replicas])
        engine = create_engine(shared_url)
        try:
            stored = Store(engine).load_spans({tid for tid, _ in sent}, normalize=False)
        finally:
            engine.dispose()
        # Sampled traces reach the store once their decision is due (DECISION_WAIT after their
        # first span), and after the exporter's batch: wait until nothing more comes.
        store_engine = create_engine(store_url)
        try:
            kept: set[str] = set()
            stable_since = time.monotonic()
            deadline = stable_since + 90
            while time.monotonic() < deadline:
                now = {
                    sp.trace_id
                    for sp in Store(store_engine).load_spans({t for t, _ in sent}, normalize=False)
                }
                if now != kept:
                    kept, stable_since = now, time.monotonic()
                elif kept and time.monotonic() - stable_since > 5:
                    break
                time.sleep(0.5)
        finally:
            store_engine.dispose()
        yield Run(sent, stored, single, shared, single_counts, shared_counts, kept)
    finally:
        for c in collectors:
            c.stop()
        trace_store.stop()
        for s in replicas:
            s.stop()
        apiserver.stop()
        next(databases, None)


def _plain(values: Any) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dict(values or {}).items()}


def test_every_span_arrives_with_its_pod_and_as_sent(run: Run) -> None:
    # The engines and sidecars sent no k8s.*: tier 1 found their pods by the connection's address.
    assert len(run.stored) == len(run.sent)
    engines = 0
    for span in run.stored:
        reference = run.sent[(span.trace_id, span.span_id)]
        # Less what ingest itself adds (railtrace.otlp.*: the sender, and who vouches for k8s.*).
        stored = {k: v for k, v in span.resource.items() if not k.startswith("railtrace.otlp.")}
        assert stored == _plain(reference.resource.attributes), (span.name, span.service_name)
        assert _plain(span.attributes) == _plain(reference.attributes), span.name
        assert span.resource.get(sc.RES_POD), (span.name, span.service_name)
        engines += span.service_name.startswith("vllm")
    assert engines > 0


def test_the_sampler_keeps_every_trace_the_collector_can_see_is_flagged(run: Run) -> None:
    # The collector cannot judge topology; what it can see is a TCP transport or a failed KV
    # transfer on the KV span (transform/mark), so the trace holding that span must be kept.
    visible = {sc.FlagName.TCP_FALLBACK.value, sc.FlagName.KV_TRANSFER_FAILED.value}
    trace_of = {sid: tid for tid, sid in run.sent}
    must_keep = {
        trace_of[f["span_id"]]
        for row in run.shared
        for f in row["flags"]
        if f["name"] in visible and f.get("span_id") in trace_of
    }
    assert must_keep, "the scenario mix must produce TCP fallbacks"
    assert must_keep <= run.kept, f"flagged traces the sampler dropped: {sorted(must_keep - run.kept)}"
    # Not everything: the sampler drops most unflagged traces (5 % baseline).
    assert len(run.kept) < len({tid for tid, _ in run.sent})


def test_replicas_behind_the_collectors_judge_as_one_replica_fed_directly(run: Run) -> None:
    assert [r["trace_id"] for r in run.shared] == [r["trace_id"] for r in run.single]
    for got, want in zip(run.shared, run.single, strict=True):
        differ = {k: (got.get(k), want.get(k)) for k in want.keys() | got.keys() if got.get(k) != want.get(k)}
        assert not differ, (got["trace_id"], differ)
    assert run.shared_counts == run.single_counts
