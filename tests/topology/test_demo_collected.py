"""A fleet described only by what `railtrace topology collect` writes on each node plus Pods (no Nodes,
ResourceSlices or ResourceClaims), run end to end through the real service: transfers over the
wrong NIC and TCP fallbacks are still found, nothing healthy is flagged, and what a node cannot know
(rails) stays unjudged rather than guessed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from railtrace.demo import run_demo
from railtrace.simulator.collected import write_collected
from railtrace.simulator.fleet import build_fleet
from railtrace.simulator.scenarios import resolve
from railtrace.topology import load_paths


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_demo(
        requests=40,
        seed=5,
        scenario_names=["unconstrained", "topology-aware", "tcp-fallback", "cross-rail"],
        workdir=tmp_path_factory.mktemp("demo-collected"),
        print_report=False,
        include_requests=True,
        topology_source="collected",
    )


def test_collected_fleet_files_hold_no_dra_objects(tmp_path: Path) -> None:
    fleet = build_fleet("a3-ultra", resolve(["unconstrained"]), 5)
    paths = write_collected(fleet, tmp_path)
    kinds = set()
    for p in paths:
        for doc in yaml.safe_load_all(p.read_text()):
            kinds.add(doc["kind"])
            kinds.update(i["kind"] for i in doc.get("items", []))
    assert kinds == {"Topology", "List", "Pod"}
    t = load_paths([tmp_path])
    node = fleet.nodes[0]
    assert t.nodes[node.name].rdma_path is True
    for g in node.gpus:
        nic = node.paired_nic(g.index)
        p = t.pairing(node.name, g.name)
        assert p.method == "pcieRoot" and p.nics == (nic.rdma_device,)
    assert t.gpus_on(node.name)[0].uuid == node.gpus[0].uuid


def test_wrong_nic_and_tcp_fallback_are_found(report: dict[str, Any]) -> None:
    assert report["complete"]
    detail = report["requests_detail"]
    for flag in ("gpu_nic_mismatch", "tcp_fallback"):
        carriers = [r for r in detail if flag in r["injected"]]
        assert carriers and all(flag in r["flags"] for r in carriers), flag


def test_nothing_healthy_is_flagged_and_rails_are_not_guessed(report: dict[str, Any]) -> None:
    detail = report["requests_detail"]
    assert not [r for r in detail if not r["injected"] and r["flags"]]
    assert not [r for r in detail if "cross_rail" in r["flags"]]
