"""The modelled fleet as production sees it: objects load through railtrace.topology, pairing holds,
allocations are what each scenario injects, UCX evidence parses, and runs are reproducible."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

import pytest

from railtrace.simulator.engine import simulate
from railtrace.simulator.fleet import SHAPES, build_fleet
from railtrace.simulator.scenarios import LADDER, resolve
from railtrace.simulator.ucxlog import endpoint_log
from railtrace.topology import load_paths
from railtrace_tracing.semconv import Transport
from railtrace_tracing.ucx.parser import parse_text


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_fleet_objects_load_with_the_modelled_pairing(shape: str, tmp_path: Path) -> None:
    fleet = build_fleet(shape, resolve(None), seed=7)
    fleet.write(tmp_path)
    topo = load_paths([str(tmp_path)])
    doc = topo.to_dict()
    assert not doc["warnings"]
    assert len(doc["nodes"]) == len(fleet.nodes) >= 8
    assert len({n.block for n in fleet.nodes}) == 2 and len({n.subblock for n in fleet.nodes}) == 4
    for node in fleet.nodes:
        for gpu in node.gpus:
            pairing = topo.pairing(node.name, gpu.name)
            assert pairing is not None and node.paired_nic(gpu.index).name in pairing.nics
            assert pairing.method == ("pcieRoot" if SHAPES[shape].pcie_pairing else "numa")
    alignment = {a["pods"][0]: a["alignment"] for a in doc["allocations"]}
    for pod in fleet.pods:
        assert alignment[pod.name] == ("aligned" if pod.aligned else "misaligned"), pod.name
    assert {p["name"] for p in doc["pods"]} == {p.name for p in fleet.pods}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_no_nic_is_allocated_twice_and_numbering_is_not_contiguous(shape: str) -> None:
    fleet = build_fleet(shape, resolve(None), seed=3)
    used = Counter((p.node.name, n.name) for p in fleet.pods for n in p.nics)
    assert max(used.values()) == 1
    gpus = Counter((p.node.name, p.gpu.name) for p in fleet.pods)
    assert max(gpus.values()) == 1
    if shape == "a3-ultra":
        numbering = {tuple(sorted(n.rdma_device for n in node.nics)) for node in fleet.nodes}
        assert len(numbering) > 1  # real hosts number their NICs differently


@pytest.mark.parametrize(
    ("devices", "split", "transport"),
    [
        (["rc_mlx5/mlx5_3:1"], [1.0], Transport.RDMA),
        (["rc_mlx5/mlx5_3:1", "rc_mlx5/mlx5_7:1"], [0.72, 0.28], Transport.RDMA),
        (["tcp/eth0"], [1.0], Transport.TCP),
        (["cuda_ipc/cuda"], [1.0], Transport.NVLINK),
    ],
)
def test_ucx_log_text_is_read_by_the_real_parser(
    devices: list[str], split: list[float], transport: str
) -> None:
    text = endpoint_log(
        agent="engine-a",
        host="pod-a",
        pid=7,
        ts=1795950464.5,
        devices=devices,
        split=split,
        transport=transport,
    )
    ev = parse_text(text).select("engine-a", "read")
    assert ev is not None and ev.source == "proto_info"
    assert ev.transport == transport and ev.devices == devices and ev.split == split


def test_a_seed_reproduces_the_run_and_pools_do_not_depend_on_the_mix() -> None:
    scenarios = resolve(None)
    fleet = build_fleet("a3-ultra", scenarios, seed=11)
    a = simulate(fleet, scenarios, 60, seed=11)
    b = simulate(build_fleet("a3-ultra", scenarios, seed=11), scenarios, 60, seed=11)
    assert [(r.request_id, r.arrival, r.ttft, r.prefill.name, r.decode.name) for r in a] == [
        (r.request_id, r.arrival, r.ttft, r.prefill.name, r.decode.name) for r in b
    ]
    alone = simulate(fleet, resolve(["topology-aware"]), 10, seed=11)
    mixed = [r for r in a if r.scenario == "topology-aware"]
    assert [(r.request_id, r.ttft) for r in alone] == [(r.request_id, r.ttft) for r in mixed]


def test_default_run_reproduces_the_published_ttft_ladder_in_shape() -> None:
    scenarios = resolve(list(LADDER))
    fleet = build_fleet("a3-ultra", scenarios, seed=7)
    runs = simulate(fleet, scenarios, 200, seed=7)
    mean = {
        name: statistics.mean(r.ttft for r in runs if r.scenario == name and r.ttft is not None)
        for name in LADDER
    }
    # Published: 2.15 s unconstrained, 1.157 s DRA-aligned, 0.33 s topology-aware.
    assert mean["unconstrained"] > 1.5 * mean["dra-aligned"] > 1.5 * 1.5 * mean["topology-aware"]


def test_tcp_fallback_times_out_under_load_while_rdma_completes() -> None:
    scenarios = resolve(["tcp-fallback"])
    runs = simulate(build_fleet("a3-ultra", scenarios, seed=7), scenarios, 80, seed=7)
    tcp = [r for r in runs if r.transport == Transport.TCP]
    rdma = [r for r in runs if r.transport != Transport.TCP]
    assert tcp and rdma
    assert any(r.failed for r in tcp) and not any(r.failed for r in rdma)


def test_a4x_pairs_inside_the_nvlink_domain_ride_nvlink() -> None:
    scenarios = resolve(["topology-aware"])
    runs = simulate(build_fleet("a4x", scenarios, seed=7), scenarios, 24, seed=7)
    near = [r for r in runs if r.prefill.node.subblock == r.decode.node.subblock]
    assert near and all(r.transport == Transport.NVLINK and r.devices == ["cuda_ipc/cuda"] for r in near)
    far = [r for r in runs if r.prefill.node.subblock != r.decode.node.subblock]
    assert all(r.transport == Transport.RDMA for r in far)
