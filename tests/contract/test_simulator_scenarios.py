"""The online audit on the simulator's P/D fleet and its injected faults.

The fleet is written out as Kubernetes objects and read back through the real topology
loaders; the traffic is the simulator's discrete-event run, turned into the request summaries
the verdicts give for it (its ground-truth transport, lanes, pairing level and flags).
What it shows: each injected fault breaks exactly the obligation it should, with links to
the offending requests, and the healthy topology-aware pool is `ok` on all four.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from railtrace.contract import ContractConfig, audit
from railtrace.contract.report import BROKEN, OK, UNKNOWN
from railtrace.model import Flag, KVSummary, RequestSummary
from railtrace.simulator.engine import SimRequest, simulate
from railtrace.simulator.fleet import Fleet, Pod, build_fleet
from railtrace.simulator.scenarios import resolve
from railtrace.topology import load_paths

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _leg(pod: Pod) -> dict[str, str | None]:
    return {
        "pod": pod.name,
        "node": pod.node.name,
        "gpu": pod.gpu.name,
        "nic": pod.nic.rdma_device,
        "rail": f"railtrace-rdma-sub-{pod.nic.rail}",
    }


def _summary(r: SimRequest) -> RequestSummary:
    start = T0 + timedelta(seconds=r.arrival)
    return RequestSummary(
        trace_id=f"{r.index:032x}",
        request_id=r.request_id,
        model="meta-llama/Llama-3.3-70B-Instruct",
        start=start.isoformat().replace("+00:00", "Z"),
        ttft_s=r.ttft,
        e2e_s=r.end - r.arrival,
        breakdown_s={},
        prefill=_leg(r.prefill),
        decode=_leg(r.decode),
        kv_transfer=KVSummary(
            transport=str(r.transport),
            path_class=str(r.path_class),
            bytes=r.kv_bytes,
            duration_s=r.kv_end - r.kv_start,
            devices=list(r.devices),
            evidence="simulated UCX proto_info",
        ),
        flags=[Flag(str(f), f"simulated {f}") for f in sorted(r.expected_flags)],
        pairing_level=str(r.level),
    )


def _run(tmp_path: Path, shape: str, scenarios: list[str], requests: int = 400):
    fleet: Fleet = build_fleet(shape, resolve(scenarios), seed=7)
    fleet.write(tmp_path)
    topology = load_paths([str(tmp_path)])
    sims = simulate(fleet, resolve(scenarios), requests, seed=7)
    now = T0 + timedelta(seconds=max(r.end for r in sims) + 1)
    report = audit(topology, [_summary(r) for r in sims], ContractConfig(window_s=3600), now=now)
    return fleet, sims, report


def _pods(report, prefix: str):
    return [s for s in report.subjects if s.kind == "pod" and s.name.startswith(prefix)]


def test_healthy_topology_aware_pool_is_ok_on_every_obligation(tmp_path: Path) -> None:
    _, _, report = _run(tmp_path, "a3-ultra", ["topology-aware"])
    pods = _pods(report, "topo-")
    assert pods
    for pod in pods:
        for obligation, result in pod.obligations.items():
            assert result.status == OK, (pod.name, obligation, result.summary)
    assert all(v["status"] == OK for v in report.fleet.obligations.values())


def test_mismatched_allocation_breaks_preserved_and_verified(tmp_path: Path) -> None:
    _, _, report = _run(tmp_path, "a3-ultra", ["unconstrained", "topology-aware"])
    for pod in _pods(report, "unc-"):
        assert pod.obligations["preserved"].status == BROKEN
        assert pod.obligations["discovered"].status == OK
    broken = [p for p in _pods(report, "unc-") if p.obligations["verified"].status == BROKEN]
    assert broken
    ev = broken[0].obligations["verified"].evidence[0]
    assert ev.link and ev.link.startswith("/api/v1/requests/") and "gpu_nic_mismatch" in ev.message
    for pod in _pods(report, "topo-"):
        assert pod.obligations["preserved"].status == OK


def test_silent_tcp_breaks_verified_with_links(tmp_path: Path) -> None:
    fleet, sims, report = _run(tmp_path, "a3-ultra", ["tcp-fallback"])
    tcp_decodes = {p.name for p in fleet.pods if p.scenario == "tcp-fallback" and not p.rdma_ok}
    assert tcp_decodes
    tcp_trace_ids = {f"{r.index:032x}" for r in sims if str(r.transport) == "tcp"}
    for pod in _pods(report, "tcp-"):
        verified = pod.obligations["verified"]
        if pod.name in tcp_decodes:
            assert verified.status == BROKEN
            assert verified.counts["tcp"] > 0
            assert all(e.link.rsplit("/", 1)[1] in tcp_trace_ids for e in verified.evidence)
        assert pod.obligations["preserved"].status == OK  # the allocation was right; the runtime was not
    pools = {r.name: r for r in report.pools}
    assert pools["decode"].obligations["verified"]["status"] == BROKEN


def test_topology_blind_router_breaks_consumed(tmp_path: Path) -> None:
    _, _, report = _run(tmp_path, "a3-ultra", ["dra-aligned", "topology-aware"])
    blind = _pods(report, "dra-")
    statuses = [p.obligations["consumed"].status for p in blind]
    assert BROKEN in statuses
    bad = next(p for p in blind if p.obligations["consumed"].status == BROKEN)
    consumed = bad.obligations["consumed"]
    assert consumed.counts["blind_share"] > ContractConfig().blind_pairing_threshold
    assert consumed.evidence and consumed.evidence[0].link
    for pod in _pods(report, "topo-"):
        assert pod.obligations["consumed"].status == OK


def test_cross_rail_split_breaks_verified(tmp_path: Path) -> None:
    _, _, report = _run(tmp_path, "a3-ultra", ["cross-rail"])
    decodes = [p for p in _pods(report, "xr-") if p.role == "decode"]
    assert any(p.obligations["verified"].status == BROKEN for p in decodes)


def test_stale_traffic_is_not_evidence(tmp_path: Path) -> None:
    fleet = build_fleet("a3-ultra", resolve(["topology-aware"]), seed=7)
    fleet.write(tmp_path)
    topology = load_paths([str(tmp_path)])
    sims = simulate(fleet, resolve(["topology-aware"]), 100, seed=7)
    later = T0 + timedelta(hours=2)
    report = audit(topology, [_summary(r) for r in sims], ContractConfig(window_s=900), now=later)
    for pod in _pods(report, "topo-"):
        assert pod.obligations["verified"].status == UNKNOWN
        assert pod.obligations["consumed"].status == UNKNOWN
    assert report.mode == "online"


@pytest.mark.parametrize("shape", ["a4x"])
def test_grace_fleet_pairs_by_name_and_numa(tmp_path: Path, shape: str) -> None:
    """GB200 GPUs never share a PCIe root with their NIC; the audit still judges allocations."""
    _, _, report = _run(tmp_path, shape, ["unconstrained", "topology-aware"], requests=200)
    assert all(p.obligations["preserved"].status == BROKEN for p in _pods(report, "unc-"))
    assert all(p.obligations["preserved"].status == OK for p in _pods(report, "topo-"))
    assert all(p.obligations["discovered"].status == OK for p in _pods(report, "topo-"))
