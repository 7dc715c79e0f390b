"""The contract over the real pipeline: simulator -> shims -> OTLP -> service -> verdicts -> store.

`railtrace demo` runs the simulated fleet through the real service; `railtrace contract`
then reads the written Kubernetes objects and the demo's database. What it shows: every
injected fault breaks exactly the obligation the issue names, on the pods that carry it, and
the topology-aware pool is `ok` on all four obligations.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections import defaultdict
from pathlib import Path

import pytest

from railtrace.cli import main
from railtrace.demo import run_demo

SCENARIOS = ["topology-aware", "tcp-fallback", "unconstrained", "dra-aligned", "cross-rail"]


@pytest.fixture(scope="module")
def contract(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work: Path = tmp_path_factory.mktemp("demo")
    run_demo(requests=200, seed=7, scenario_names=SCENARIOS, workdir=work, print_report=False)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(
            [
                "contract",
                "--topology",
                str(work / "topology"),
                "--db",
                f"sqlite:///{work / 'railtrace.db'}",
                "--json",
            ]
        )
    assert rc == 1  # faults were injected
    return json.loads(buf.getvalue())


def _statuses(doc: dict) -> dict[tuple[str, str, str], set[str]]:
    """(scenario pod prefix, role, obligation) -> statuses seen."""
    out: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for pod in doc["pods"]:
        prefix = pod["name"].split("-")[0]
        for obligation, result in pod["obligations"].items():
            out[(prefix, pod["role"], obligation)].add(result["status"])
    return out


def test_healthy_pool_all_ok(contract: dict) -> None:
    s = _statuses(contract)
    for role in ("prefill", "decode"):
        for obligation in ("discovered", "preserved", "verified", "consumed"):
            assert s[("topo", role, obligation)] == {"ok"}, (role, obligation)


def test_each_fault_breaks_its_obligation(contract: dict) -> None:
    s = _statuses(contract)
    assert s[("unc", "decode", "preserved")] == {"broken"}  # mismatched allocation
    assert s[("dra", "decode", "preserved")] == {"ok"}
    assert "broken" in s[("tcp", "decode", "verified")]  # silent TCP
    assert s[("tcp", "decode", "preserved")] == {"ok"}
    assert s[("dra", "decode", "consumed")] == {"broken"}  # topology-blind router
    assert s[("xr", "decode", "verified")] == {"broken"}  # two-rail split on the decode side
    assert s[("xr", "prefill", "verified")] == {"ok"}
    fleet = contract["fleet"]["obligations"]
    assert fleet["discovered"]["status"] == "ok"
    assert all(fleet[o]["status"] == "broken" for o in ("preserved", "verified", "consumed"))


def test_offending_tcp_requests_are_linked(contract: dict) -> None:
    pod = next(
        p
        for p in contract["pods"]
        if p["name"].startswith("tcp-decode") and p["obligations"]["verified"]["status"] == "broken"
    )
    evidence = pod["obligations"]["verified"]["evidence"]
    assert evidence and all(e["link"].startswith("/api/v1/requests/") for e in evidence)
    assert all("TCP" in e["message"] for e in evidence)
