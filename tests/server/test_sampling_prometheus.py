"""The traced share from a real Prometheus: `railtrace serve --prometheus-url` in its own process,
fed by the official OTel SDK, against a Prometheus (Debian's, loopback, free port, temporary
TSDB, stopped by PID) that scrapes request counters under the names the EPP and vLLM expose
(`llm_d_epp_request_total`: llm-d-router v0.10.0 pkg/epp/metrics/llm_d_router_metrics.go
l.38-47; `vllm:request_success_total`: vLLM 0.34.0 vllm/v1/metrics/loggers.py l.807-812),
served by a small exporter in the test. The share shows in the coverage stats, in
`llm_d_tracing_traced_share` and on the overview, on both stores."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from railtrace_tracing import semconv
from tests.reliability.reliability_helpers import free_port
from tests.server.test_sampling import _traces
from tests.service_helpers import serve_process, wait_for

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

PROMETHEUS = shutil.which("prometheus")
if PROMETHEUS is None:
    pytest.skip("prometheus binary not installed (apt-get install prometheus)", allow_module_level=True)

TRACED = 5
SERVED = 20  # the EPP counted four times as many requests as were traced
VLLM_SUCCESSES = 40  # prefill and decode engines both count each P/D request


class Counters:
    """A scrape target exposing the EPP's and vLLM's request counters (text format)."""

    def __init__(self) -> None:
        self.epp = 0
        self.vllm = 0
        counters = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = (
                    "# TYPE llm_d_epp_request_total counter\n"
                    'llm_d_epp_request_total{model_name="m",target_model_name="m",fairness_id="",priority="0"}'
                    f" {counters.epp}\n"
                    "# TYPE vllm:request_success_total counter\n"
                    'vllm:request_success_total{model_name="m",engine="0",finished_reason="stop"}'
                    f" {counters.vllm}\n"
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "text/plain; version=0.0.4")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def counters() -> Iterator[Counters]:
    c = Counters()
    yield c
    c.stop()


@pytest.fixture
def prometheus(tmp_path: Path, counters: Counters) -> Iterator[str]:
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "llm-d", "static_configs": [{"targets": [counters.address]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                return httpx.get(url + "/-/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout=60, what="Prometheus to become ready")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


def _value(url: str, expr: str) -> float | None:
    body = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=10).json()
    result = body["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def _coverage(base: str) -> dict[str, Any]:
    return httpx.get(base + "/api/v1/stats", params={"group_by": "coverage"}, timeout=10).json()


def test_share_from_prometheus_counters(
    db_url: str, tmp_path: Path, counters: Counters, prometheus: str
) -> None:
    # Prometheus has the counters at 0 before any traffic.
    wait_for(lambda: _value(prometheus, "llm_d_epp_request_total") == 0, timeout=60, what="a first scrape")
    env = {
        "RAILTRACE_SAMPLING_WINDOW_S": "600",  # longer than the test: every request is inside it
        "RAILTRACE_SAMPLING_LAG_S": "0",
        "RAILTRACE_SAMPLING_REFRESH_S": "0.5",
        "RAILTRACE_MAX_TRACE_WAIT_S": "0.5",  # the client span above the engines is not sent
        "RAILTRACE_ASSEMBLY_PROCESSES": "0",
    }
    with serve_process(db_url, tmp_path, "--prometheus-url", prometheus, env=env) as base:
        # No traffic yet: the share is unknown, not 1.
        assert _coverage(base)["sampling"]["traced_share"] is None
        exporter = OTLPSpanExporter(endpoint=base + "/v1/traces")
        try:
            assert exporter.export(_traces(None, TRACED, 0)) == SpanExportResult.SUCCESS
        finally:
            exporter.shutdown()
        counters.epp, counters.vllm = SERVED, VLLM_SUCCESSES
        wait_for(
            lambda: _value(prometheus, "llm_d_epp_request_total") == SERVED, timeout=60, what="the new counts"
        )

        # `increase` extrapolates past the last scrape by up to half a scrape interval: on a
        # series only a few scrapes old that is a large share (27 for 20 was seen under load);
        # it shrinks as the series ages, so wait for the estimate to settle near SERVED.
        seen: list[float] = []

        def estimated() -> dict[str, Any] | None:
            sampling = _coverage(base)["sampling"]
            est = sampling["estimates"]["prometheus"]
            if est["traced"] != TRACED or sampling["traced_share"] is None:
                return None
            seen.append(est["total"])
            return sampling if SERVED <= est["total"] < SERVED * 1.25 else None

        sampling = wait_for(estimated, timeout=60, what="the share settled near the served count")
        est = sampling["estimates"]["prometheus"]
        assert min(seen) >= SERVED, seen  # never below what was served
        assert est["counter"] == "llm_d_epp_request_total"  # the EPP's counter comes first
        assert sampling["source"] == "prometheus" and sampling["sampled"] is True
        assert TRACED / (SERVED * 1.25) < sampling["traced_share"] <= TRACED / SERVED
        metrics = httpx.get(base + "/metrics", timeout=10).text
        line = next(
            x
            for x in metrics.splitlines()
            if x.startswith(f'{semconv.M_TRACED_SHARE}{{source="prometheus"}}')
        )
        assert float(line.rsplit(" ", 1)[1]) == pytest.approx(sampling["traced_share"], rel=0.2)
        # The overview reads this answer (js/overview.js `samplingNote`, the "traced share" tile).
        shell = httpx.get(base + "/", timeout=10).text
        router = httpx.get(base + "/ui/static/app.js", timeout=10).text
        script = httpx.get(base + "/ui/static/js/overview.js", timeout=10).text
        assert "app.js" in shell and "./js/overview.js" in router
        assert "group_by=coverage" in script and "traced share" in script
