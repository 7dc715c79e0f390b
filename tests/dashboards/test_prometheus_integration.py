"""Real Prometheus scraping real railtrace services fed by the simulator.

One Prometheus (Debian's 2.42, loopback, free port, temporary TSDB) scrapes four services,
each under its own `namespace` target label, as a ServiceMonitor would label them:

- `tcp-fallback`: the simulator's TCP-fallback scenario;
- `healthy`: the topology-aware scenario (aligned claims, verified RDMA, topology router);
- `all-scenarios`: every scenario, so every dashboard panel has something to show;
- `shedding`: a service that sheds every export (backpressure panel, rejected spans).

It loads the rule files as written, except that each alert's `for:` is set to 0s — the `for`
semantics are proven by the promtool unit tests, this test proves the expressions against
live data. Every wait polls for a condition under a generous deadline; nothing asserts a
duration.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dashboards import build, promql
from dashboards.boards import DASHBOARDS
from railtrace_tracing import semconv

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

PROMETHEUS = shutil.which("prometheus")
if PROMETHEUS is None:
    pytest.skip("prometheus binary not installed (apt-get install prometheus)", allow_module_level=True)

from railtrace.server.runner import Service  # noqa: E402  (after the skip: heavy imports)
from railtrace.settings import Settings  # noqa: E402
from railtrace.simulator import scenarios as scen  # noqa: E402
from railtrace.simulator.emit import Emitter, Processes, otlp_http_exporter  # noqa: E402
from railtrace.simulator.engine import simulate  # noqa: E402
from railtrace.simulator.fleet import build_fleet  # noqa: E402

TCP_ALERT = "LLMDKVTransferSilentTCPFallback"
DEADLINE_S = 240.0
RATE_WINDOW = "30s"  # $__rate_interval at a 1s scrape interval
RANGE_WINDOW = "10m"  # $__range: longer than the whole test


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, check: Callable[[], Any], deadline_s: float = DEADLINE_S) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` at the deadline."""
    end = time.monotonic() + deadline_s
    last: Any = None
    while time.monotonic() < end:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    pytest.fail(f"gave up waiting for {what} (last: {last!r})")


@dataclass
class Fed:
    """One service and the simulator traffic it was fed."""

    namespace: str
    service: Service
    workdir: Path
    requests: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Prom:
    """A Prometheus process started and stopped by the test (by PID, never by name)."""

    def __init__(self, workdir: Path, targets: dict[str, str]) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        rules = []
        for path in build.rule_files():
            doc = yaml.safe_load(path.read_text())
            for group in doc["groups"]:
                for rule in group["rules"]:
                    if "alert" in rule:
                        rule["for"] = "0s"
            out = workdir / path.name
            out.write_text(yaml.safe_dump(doc, sort_keys=False))
            rules.append(str(out))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": rules,
            "scrape_configs": [
                {
                    "job_name": "railtrace",
                    "metrics_path": "/metrics",
                    "static_configs": [
                        {"targets": [address], "labels": {"namespace": namespace}}
                        for namespace, address in targets.items()
                    ],
                }
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                str(PROMETHEUS),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--enable-feature=exemplar-storage",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.client = httpx.Client(base_url=self.url, timeout=30)
        _wait("Prometheus ready", self._ready, 60)

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"prometheus exited with {self.proc.returncode}; see {self.log.name}")
        try:
            return self.client.get("/-/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = self.client.get("/api/v1/query", params={"query": expr}).json()
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def alerts(self) -> list[dict[str, Any]]:
        return self.client.get("/api/v1/alerts").json()["data"]["alerts"]

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.log.close()


def _start_service(workdir: Path, namespace: str, scenario_names: list[str], **overrides: Any) -> Fed:
    chosen = scen.resolve(scenario_names) if scenario_names else []
    topology: list[str] = []
    if chosen:
        fleet = build_fleet("a3-ultra", chosen, 11)
        fleet.write(workdir / "topology")
        topology = [str(workdir / "topology")]
    settings = Settings(
        db=f"sqlite:///{workdir / 'railtrace.db'}",
        topology=topology,
        host="127.0.0.1",
        port=0,
        grpc_port=0,
        quiet_period_s=0.5,
        assembly_interval_s=0.1,
        **overrides,
    )
    service = Service(settings).start()
    fed = Fed(namespace, service, workdir)
    if chosen:
        fed.extra["fleet"] = fleet
        fed.extra["scenarios"] = chosen
    return fed


def _service_value(fed: Fed, family: str) -> float:
    text = httpx.get(f"{fed.service.http_url}/metrics", timeout=30).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(family) and not line.startswith("#") and line[len(family)] in "{ "
    )


def _drive(fed: Fed, prom: Prom, requests: int, chunks: int, seed: int) -> None:
    """Send the scenario's requests in chunks; after each, wait until railtrace has assembled
    everything and Prometheus has scraped the new totals, so every counter is seen rising."""
    fleet, chosen = fed.extra["fleet"], fed.extra["scenarios"]
    sim = simulate(fleet, chosen, requests, seed)
    span_end = max(r.end for r in sim) + 1.0
    procs = Processes(otlp_http_exporter(fed.service.http_url), seed)
    emitter = Emitter(fleet, procs, "current", time.time_ns() - int(span_end * 1e9))
    size = -(-len(sim) // chunks)
    selector = f'sum({semconv.M_REQUESTS}{{namespace="{fed.namespace}"}})'
    try:
        for start in range(0, len(sim), size):
            before = _service_value(fed, semconv.M_REQUESTS)
            for r in sim[start : start + size]:
                emitter.emit(r)
            procs.flush()

            def settled(before: float = before) -> float | None:
                total = _service_value(fed, semconv.M_REQUESTS)
                idle = _service_value(fed, semconv.M_PENDING) == 0 and (
                    _service_value(fed, semconv.M_INGEST_QUEUE) == 0
                )
                return total if total > before and idle else None

            total = _wait(f"{fed.namespace}: requests assembled", settled)
            _wait(
                f"{fed.namespace}: Prometheus scraped {total}",
                lambda t=total: (prom.value(selector) or 0) >= t,
            )
    finally:
        procs.shutdown()
    fed.requests += len(sim)


def _exercise_shedding(fed: Fed) -> None:
    """Exports to a service that sheds everything, and one span it must reject elsewhere."""
    for _ in range(5):
        response = httpx.post(
            f"{fed.service.http_url}/v1/traces",
            content=json.dumps({"resourceSpans": []}),
            headers={"content-type": "application/json"},
            timeout=30,
        )
        assert response.status_code in (429, 503), response.text


def _reject_one_span(fed: Fed) -> None:
    body = {
        "resourceSpans": [
            {
                "resource": {"attributes": []},
                "scopeSpans": [
                    {
                        "scope": {"name": "integration-test"},
                        "spans": [
                            {
                                "traceId": "0" * 32,
                                "spanId": "00f067aa0ba902b7",
                                "name": "invalid",
                                "kind": 1,
                                "startTimeUnixNano": "1",
                                "endTimeUnixNano": "2",
                            }
                        ],
                    }
                ],
            }
        ]
    }
    response = httpx.post(
        f"{fed.service.http_url}/v1/traces",
        content=json.dumps(body),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 200 and "rejected" in response.text.lower(), response.text


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prom, dict[str, Fed]]]:
    base = tmp_path_factory.mktemp("prometheus-integration")
    feds: dict[str, Fed] = {}
    prom: Prom | None = None
    try:
        for namespace, names, overrides in (
            ("tcp-fallback", ["tcp-fallback"], {}),
            ("healthy", ["topology-aware"], {}),
            ("all-scenarios", ["all"], {}),
            ("shedding", [], {"max_pending_spans": 0}),
        ):
            workdir = base / namespace
            workdir.mkdir()
            feds[namespace] = _start_service(workdir, namespace, names, **overrides)
        targets = {ns: fed.service.http_url.removeprefix("http://") for ns, fed in feds.items()}
        (base / "prom").mkdir()
        prom = Prom(base / "prom", targets)
        _wait("all targets up", lambda: prom.value('count(up{job="railtrace"} == 1)') == len(targets))
        _drive(feds["tcp-fallback"], prom, 48, 3, 21)
        _drive(feds["healthy"], prom, 48, 3, 22)
        _drive(feds["all-scenarios"], prom, 120, 3, 23)
        _exercise_shedding(feds["shedding"])
        _reject_one_span(feds["all-scenarios"])
        yield prom, feds
    finally:
        if prom is not None:
            prom.stop()
        for fed in feds.values():
            fed.service.stop()


def _reads_contract(target: promql.Target) -> bool:
    return any(semconv.M_CONTRACT in n for n in promql.metric_names(target.expr))


def _dashboard_queries() -> list[promql.Target]:
    out = []
    for name in DASHBOARDS:
        board = json.loads((build.GENERATED / f"{name}.json").read_text())
        for target in promql.prometheus_targets(board):
            names = promql.metric_names(target.expr)
            if any(promql.external_family(n) for n in names):
                continue  # llm-d's and vLLM's own series: scraped from the EPP and model servers
            out.append(target)
    return out


def test_tcp_fallback_alert_fires_for_the_tcp_fallback_scenario(stack: tuple[Prom, dict[str, Fed]]) -> None:
    prom, _ = stack

    def firing() -> list[dict[str, Any]]:
        return [
            a
            for a in prom.alerts()
            if a["labels"]["alertname"] == TCP_ALERT
            and a["labels"].get("namespace") == "tcp-fallback"
            and a["state"] == "firing"
        ]

    alert = _wait("the TCP-fallback alert to fire", firing)[0]
    assert alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["runbook_url"] == f"docs/runbooks/{TCP_ALERT}.md"
    assert float(alert["value"]) > 0


def test_tcp_fallback_alert_stays_quiet_for_the_healthy_scenario(stack: tuple[Prom, dict[str, Fed]]) -> None:
    prom, _ = stack
    # Evidence that the rules have evaluated the healthy namespace's data: the recorded
    # TCP-fallback ratio reads exactly 0 there, while the alert fires for the faulty one.
    ratio = "namespace:llm_d_tracing_flags_tcp_fallback_per_requests:ratio_rate5m"
    _wait("the healthy ratio to be recorded", lambda: prom.value(f'{ratio}{{namespace="healthy"}}') == 0.0)
    _wait(
        "the TCP-fallback alert to fire elsewhere",
        lambda: any(a["labels"]["alertname"] == TCP_ALERT and a["state"] == "firing" for a in prom.alerts()),
    )
    healthy = [a for a in prom.alerts() if a["labels"].get("namespace") == "healthy"]
    assert [a for a in healthy if a["labels"]["alertname"] == TCP_ALERT] == []
    # railtrace exposes every flag's series at 0 from the start (`KNOWN_SERIES`): none counted.
    flagged = prom.query(f'{semconv.M_FLAGS}{{namespace="healthy", flag="{semconv.FlagName.TCP_FALLBACK}"}}')
    assert flagged and all(float(s["value"][1]) == 0 for s in flagged)


def test_gpu_nic_mismatch_alert_fires_only_where_claims_are_unaligned(
    stack: tuple[Prom, dict[str, Fed]],
) -> None:
    """The fleet mix includes unaligned DRA claims; the TCP-only and healthy pools do not."""
    prom, _ = stack
    name = "LLMDKVTransferGPUNICMismatch"

    def namespaces() -> set[str]:
        return {
            a["labels"].get("namespace", "")
            for a in prom.alerts()
            if a["labels"]["alertname"] == name and a["state"] == "firing"
        }

    assert _wait(f"{name} to fire", namespaces) == {"all-scenarios"}


def _assert_queries_return_data(prom: Prom, queries: list[promql.Target]) -> None:

    def empty() -> list[str]:
        return [
            f"{t.dashboard} / {t.panel} [{t.ref_id}]: {t.expr}"
            for t in queries
            if not prom.query(promql.substitute(t.expr, rate=RATE_WINDOW, range_=RANGE_WINDOW))
        ]

    missing: list[str] = []

    def all_have_data() -> bool:
        missing[:] = empty()
        return not missing

    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end and not all_have_data():
        time.sleep(1)
    assert not missing, "queries without data:\n" + "\n".join(missing)


def test_every_dashboard_query_returns_data(stack: tuple[Prom, dict[str, Fed]]) -> None:
    prom, _ = stack
    queries = [t for t in _dashboard_queries() if not _reads_contract(t)]
    assert len(queries) > 30
    _assert_queries_return_data(prom, queries)


def test_contract_queries_return_data(stack: tuple[Prom, dict[str, Fed]]) -> None:
    """The contract gauge is fed by the contract audit inside the service; until the service
    sets it, its family is exposed without samples and this test reports that, not a pass."""
    prom, feds = stack
    text = httpx.get(f"{feds['all-scenarios'].service.http_url}/metrics", timeout=30).text
    assert any(line.startswith(semconv.M_CONTRACT + "{") for line in text.splitlines())
    queries = [t for t in _dashboard_queries() if _reads_contract(t)]
    assert len(queries) >= 5
    _assert_queries_return_data(prom, queries)


def test_every_metric_the_dashboards_and_rules_use_is_in_live_metrics(
    stack: tuple[Prom, dict[str, Fed]],
) -> None:
    """Every railtrace series a query names is declared on /metrics and, after the traffic
    above, has samples (the contract gauge is the known exception, see the test above)."""
    _, feds = stack
    sampled: set[str] = set()
    declared: set[str] = set()
    for fed in feds.values():
        for line in httpx.get(f"{fed.service.http_url}/metrics", timeout=30).text.splitlines():
            if line.startswith("# TYPE "):
                declared.add(line.split()[2])
            elif line and line[0] != "#":
                sampled.add(line.split("{", 1)[0].split(" ", 1)[0])
    used: set[str] = set()
    for name in DASHBOARDS:
        board = json.loads((build.GENERATED / f"{name}.json").read_text())
        for target in promql.prometheus_targets(board):
            used |= promql.metric_names(target.expr)
    for path in build.rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                used |= promql.metric_names(rule["expr"])
    series = {n for n in used if promql.family(n)}
    assert series
    undeclared = {n for n in series if promql.family(n) not in declared}
    assert not undeclared, f"not declared on live /metrics: {sorted(undeclared)}"
    unsampled = series - sampled - {semconv.M_CONTRACT}
    assert not unsampled, f"declared but never sampled: {sorted(unsampled)}"


def test_exemplars_carry_the_trace_id(stack: tuple[Prom, dict[str, Fed]]) -> None:
    """The exemplar label Grafana's trace links read is what railtrace exposes."""
    prom, _ = stack
    now = time.time()
    series = f"{semconv.M_TTFT}_bucket"

    def exemplars() -> list[dict[str, Any]]:
        body = prom.client.get(
            "/api/v1/query_exemplars", params={"query": series, "start": now - 600, "end": now + 60}
        ).json()
        return [e for s in body.get("data", []) for e in s["exemplars"]]

    found = _wait("exemplars on the TTFT histogram", exemplars)
    assert all(len(e["labels"][semconv.EXEMPLAR_TRACE_ID_LABEL]) == 32 for e in found)


def test_no_rule_fails_to_evaluate(stack: tuple[Prom, dict[str, Fed]]) -> None:
    prom, _ = stack
    groups = prom.client.get("/api/v1/rules").json()["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == sum(
        len(g["rules"]) for p in build.rule_files() for g in yaml.safe_load(p.read_text())["groups"]
    )
    assert all(r["health"] in ("ok", "unknown") for r in rules), [
        (r["name"], r.get("lastError")) for r in rules if r["health"] == "err"
    ]
