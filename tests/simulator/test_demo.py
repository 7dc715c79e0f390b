"""`railtrace demo` end to end: the real service finds what the simulator injected, and nothing else.

One small run per generation (module-scoped) keeps the suite lean; each goes through the real
shims, the official OTLP exporter and the service's assembly and verdicts.
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import Any

import pytest

from railtrace.demo import demo_command, format_report, run_demo
from railtrace.simulator.scenarios import SCENARIOS
from railtrace_tracing.semconv import FlagName

REQUESTS = 48
SEED = 5


def _run(tmp: Path, generation: str, protocol: str = "http") -> dict[str, Any]:
    return run_demo(
        protocol=protocol,
        requests=REQUESTS,
        seed=SEED,
        scenario_names=[],
        generation=generation,
        workdir=tmp,
        print_report=False,
        include_requests=True,
    )


@pytest.fixture(scope="module")
def current(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run(tmp_path_factory.mktemp("demo-current"), "current")


def test_every_request_is_assembled(current: dict[str, Any]) -> None:
    assert current["complete"] and current["assembled"] == REQUESTS


def test_each_scenario_fault_is_found_on_its_requests(current: dict[str, Any]) -> None:
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for r in current["requests_detail"]:
        by_scenario.setdefault(r["scenario"], []).append(r)
    assert set(by_scenario) == set(SCENARIOS)
    for name, scenario in SCENARIOS.items():
        for flag in scenario.expected_flags:
            carriers = [r for r in by_scenario[name] if flag in r["injected"]]
            assert carriers, f"{name} injected no {flag}"
            assert all(flag in r["flags"] for r in carriers), (name, flag)
    # Every injected flag, on any request, is reported.
    missed = [
        (r["scenario"], f) for r in current["requests_detail"] for f in r["injected"] if f not in r["flags"]
    ]
    assert not missed


def test_healthy_requests_are_not_flagged(current: dict[str, Any]) -> None:
    healthy = [r for r in current["requests_detail"] if not r["injected"]]
    assert healthy
    assert [r for r in healthy if r["flags"]] == []
    assert current["verdicts"]["healthy_flagged"] == 0
    faults = {
        FlagName.GPU_NIC_MISMATCH,
        FlagName.TCP_FALLBACK,
        FlagName.CROSS_RAIL,
        FlagName.BROKEN_TRACE,
        FlagName.TOPOLOGY_BLIND_PAIRING,
        FlagName.KV_TRANSFER_FAILED,
    }
    aware = [r for r in current["requests_detail"] if r["scenario"] == "topology-aware"]
    assert aware and not [r for r in aware if faults & set(r["flags"])]


def test_report_names_the_worst_flagged_requests_with_evidence_and_urls(current: dict[str, Any]) -> None:
    assert current["worst"]
    for w in current["worst"]:
        assert w["flags"] and all(f["evidence"] for f in w["flags"])
        assert w["url"].endswith(f"/requests/{w['trace_id']}")  # the request's UI page
    text = format_report(current)
    for name in SCENARIOS:
        assert name in text
    assert "TCP fallback" in text and "worst flagged requests" in text


def test_a_seed_reproduces_the_verdicts(current: dict[str, Any], tmp_path: Path) -> None:
    again = _run(tmp_path, "current")
    assert again["requests_detail"] == current["requests_detail"]


@pytest.mark.parametrize(("generation", "protocol"), [("v0.10", "grpc"), ("v0.8", "http")])
def test_older_generations_yield_the_same_verdicts(
    current: dict[str, Any], generation: str, protocol: str, tmp_path: Path
) -> None:
    """Older span names (and, for v0.10, the OTLP/gRPC exporter) change nothing but the known gaps."""
    old = _run(tmp_path, generation, protocol)
    assert old["complete"]
    # v0.8's sidecar does not inject trace context: every request is split, the rest is unchanged.
    gap = {FlagName.BROKEN_TRACE} if generation == "v0.8" else set()
    now = {r["request_id"]: set(r["flags"]) for r in current["requests_detail"]}
    for r in old["requests_detail"]:
        assert set(r["flags"]) - gap == now[r["request_id"]] - gap, r
        assert gap <= set(r["flags"])


def test_a_port_in_use_gives_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        args = argparse.Namespace(
            requests=4,
            seed=1,
            scenario=None,
            shape="a3-ultra",
            generation="current",
            db=None,
            port=port,
            grpc_port=0,
            keep_serving=False,
            json=False,
        )
        assert demo_command(args) == 2
    assert f"port {port} (--port) is already in use" in capsys.readouterr().err


def test_unknown_scenario_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(
        requests=4,
        seed=1,
        scenario=["nope"],
        shape="a3-ultra",
        generation="current",
        db=None,
        port=0,
        grpc_port=0,
        keep_serving=False,
        json=False,
    )
    assert demo_command(args) == 2
    assert "unknown scenario 'nope'" in capsys.readouterr().err
