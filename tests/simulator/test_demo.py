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

from railtrace.cli import build_parser
from railtrace.demo import demo_command, format_report, run_demo
from railtrace.simulator.scenarios import SCENARIOS
from railtrace_tracing.semconv import FlagName

REQUESTS = 48
SEED = 5


def demo_args(*argv: str) -> argparse.Namespace:
    """The demo's options as the command line parses them."""
    return build_parser().parse_args(["demo", *argv])


def _run(
    tmp: Path,
    generation: str,
    protocol: str = "http",
    recipe: str = "full",
    resources: str = "collector",
    requests: int = REQUESTS,
) -> dict[str, Any]:
    return run_demo(
        protocol=protocol,
        requests=requests,
        seed=SEED,
        scenario_names=[],
        generation=generation,
        recipe=recipe,
        resources=resources,
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


@pytest.mark.parametrize(
    ("generation", "protocol"), [("post-v0.10", "http"), ("v0.10", "grpc"), ("v0.8", "http")]
)
def test_older_generations_yield_the_same_verdicts(
    current: dict[str, Any], generation: str, protocol: str, tmp_path: Path
) -> None:
    """Older span names, and router main's after v0.10.0 (`request`, `request_orchestration`,
    `scoring`, `scorer.<type>`), change nothing (nor, for v0.10, the OTLP/gRPC exporter). v0.8's sidecar
    does not inject trace context, so its engines' spans come in traces of their own: joined by
    the ids they carry, they are no broken trace."""
    old = _run(tmp_path, generation, protocol)
    assert old["complete"]
    now = {r["request_id"]: set(r["flags"]) for r in current["requests_detail"]}
    for r in old["requests_detail"]:
        assert set(r["flags"]) == now[r["request_id"]], r
        # Only the scenario whose decode engine spans are lost is a broken trace.
        assert (FlagName.BROKEN_TRACE in r["flags"]) == (r["scenario"] == "broken-trace"), r
    assert old["coverage"] == current["coverage"]


@pytest.mark.parametrize("generation", ["v0.9"])
def test_resources_as_emitted_resolve_by_sender_address(
    current: dict[str, Any], generation: str, tmp_path: Path
) -> None:
    """Without k8s.* on the engines, each pod's address places its legs: the same verdicts."""
    emitted = _run(tmp_path, generation, resources="emitted")  # the same requests as `current`
    assert emitted["complete"]
    assert emitted["coverage"]["full_verdict"] == current["coverage"]["full_verdict"]
    now = {r["request_id"]: set(r["flags"]) for r in current["requests_detail"]}
    for r in emitted["requests_detail"]:
        assert set(r["flags"]) == now[r["request_id"]], r


def test_decode_only_recipe_is_not_flagged_and_says_what_is_untraced(tmp_path: Path) -> None:
    """llm-d's guide traces the decode engine only: no broken_trace, no false flag, and the report
    says how many requests still got a full verdict (the KV span names the prefill peer)."""
    n = 16
    rep = _run(tmp_path, "current", recipe="decode_only", resources="emitted", requests=n)
    assert rep["complete"] and rep["assembled"] == n
    # Only the scenario that loses the decode engine's spans leaves the KV span alone (partial).
    lost = {r["request_id"] for r in rep["requests_detail"] if r["scenario"] == "broken-trace"}
    assert rep["coverage"]["recipes_seen"] == {"decode_only": n - len(lost), "partial": len(lost)} or not lost
    assert rep["verdicts"]["healthy_flagged"] == 0
    for r in rep["requests_detail"]:
        assert (FlagName.BROKEN_TRACE in r["flags"]) == (r["request_id"] in lost), r
    cov = rep["coverage"]
    assert cov["full_verdict"] + sum(cov["not_full"].values()) == n
    assert "tracing decode_only" in format_report(rep)


def test_demo_covers_every_release_and_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    args = demo_args(
        "--requests", "2", "--seed", "3", "--scenario", "topology-aware",
        "--generation", "all", "--recipe", "all", "--resources", "emitted", "--exit",
    )  # fmt: skip
    assert demo_command(args) == 0
    out = capsys.readouterr().out
    for release in ("HEAD", "main@8540131219eb", "v0.10.0", "v0.9.0", "v0.8.0"):
        for recipe in ("full", "decode_only"):
            assert any(line.startswith(release) and recipe in line for line in out.splitlines()), (
                release,
                recipe,
            )


def test_a_port_in_use_gives_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        args = demo_args("--requests", "4", "--seed", "1", "--port", str(port), "--exit")
        assert demo_command(args) == 2
    assert f"port {port} (--port) is already in use" in capsys.readouterr().err


def test_unknown_scenario_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    args = demo_args("--requests", "4", "--seed", "1", "--scenario", "nope", "--exit")
    assert demo_command(args) == 2
    assert "unknown scenario 'nope'" in capsys.readouterr().err


def test_post_v010_generation_emits_router_mains_names_through_the_shims() -> None:
    """The `post-v0.10` generation sends the EPP's root, director and scoring spans under the
    names router main uses after v0.10.0, the scoring ones through the router shim."""
    import threading

    from opentelemetry.sdk.trace import ReadableSpan

    from railtrace.simulator import Emitter, Processes, build_fleet, resolve, simulate
    from tests.fixtures.otlp_fixtures import SinkExporter

    scenarios = resolve(["topology-aware"])
    fleet = build_fleet("a3-ultra", scenarios, seed=SEED)
    sink: list[ReadableSpan] = []
    procs = Processes(lambda: SinkExporter(sink, threading.Lock()), SEED)
    emitter = Emitter(fleet, procs, "post-v0.10", 1_790_000_000 * 10**9)
    for run in simulate(fleet, scenarios, 1, seed=SEED):
        emitter.emit(run)
    procs.flush()
    procs.shutdown()
    names = {s.name for s in sink}
    assert {"request", "request_orchestration", "scoring"} <= names, names
    assert any(n.startswith("scorer.") for n in names), names
    old = {"gateway.request", "gateway.request_orchestration", "llm_d.epp.scoring"}
    assert not names & old and not any(n.startswith("llm_d.epp.scorer.") for n in names), names
