"""The summary's `cost`: seconds lost against the aligned path, and the link rates behind it."""

from __future__ import annotations

from pathlib import Path

import pytest

from railtrace.topology import Topology, load_paths
from railtrace.verdicts import VerdictConfig, judge
from railtrace.verdicts.cost import link_rate_bps
from tests.verdicts.helpers import FLEET, facts, kv

BYTES = 480_000_000  # 66 ms at the default 7.27 GB/s same-rail figure


def test_aligned_request_loses_nothing(fleet: Topology) -> None:
    c = judge(facts(kvf=kv(bytes=BYTES, duration_s=0.07)), fleet).cost
    assert c is not None and c["aligned_path"] == "rdma_same_rail"
    assert c["kv_s_lost"] == 0 and c["ttft_s_lost"] == 0 and c["gpu_s_lost"] == 0
    assert c["aligned_kv_s"] == pytest.approx(BYTES / (48e6 / 6.6e-3), rel=1e-6)


def test_tcp_loses_more_than_cross_rail(fleet: Topology) -> None:
    tcp = judge(
        facts(kvf=kv(bytes=BYTES, transport="tcp", devices=["tcp/eth0"], duration_s=0.9), ttft_s=1.2),
        fleet,
    )
    xr = judge(facts(kvf=kv(bytes=BYTES, devices=["rc_mlx5/mlx5_1:1"], duration_s=0.1)), fleet)
    assert {f.name for f in tcp.flags} >= {"tcp_fallback"} and "cross_rail" in {f.name for f in xr.flags}
    ct, cx = tcp.cost, xr.cost
    assert ct is not None and cx is not None
    assert ct["kv_s_lost"] == pytest.approx(0.9 - BYTES / (48e6 / 6.6e-3), abs=1e-6)
    assert ct["kv_s_lost"] > cx["kv_s_lost"] > 0
    # TTFT saves at most what the KV stage took (the breakdown's 6.6 ms here).
    assert ct["ttft_s_lost"] == pytest.approx(0.0066)
    assert ct["decode_gpu_s_lost"] == ct["prefill_gpu_s_lost"] == ct["kv_s_lost"]
    assert ct["side"] == "decode" and any("0.9" in e or "900.0 ms" in e for e in ct["evidence"])


def test_tcp_where_the_fleet_has_no_rdma_loses_nothing(fleet: Topology) -> None:
    f = facts(
        "10.0.1.1:8000",
        "10.0.1.2:8000",
        kv(
            transport="tcp",
            devices=["tcp/eth1"],
            pod="decode-t",
            node="tcpx-2",
            remote_host="10.0.1.1",
            duration_s=0.09,
        ),
    )
    c = judge(f, fleet).cost
    assert c is not None and c["aligned_path"] == "tcp" and c["kv_s_lost"] == 0


def test_no_kv_transfer_no_cost(fleet: Topology) -> None:
    s = judge(facts(kvf=None), fleet)
    assert s.cost is None and s.to_dict()["cost"] is None


def test_link_rate_scales_the_expectation(tmp_path: Path) -> None:
    text = FLEET.read_text().replace(
        '{name: mlx5_0, pcieRoot: "pci0000:10", numa: 0, rail: rail-0}',
        '{name: mlx5_0, pcieRoot: "pci0000:10", numa: 0, rail: rail-0, rate: "200 Gb/sec (4X HDR)"}',
    )
    doc = tmp_path / "fleet.yaml"
    doc.write_text(text)
    c = judge(facts(kvf=kv(bytes=BYTES, duration_s=0.2), ttft_s=0.5), load_paths([doc]), VerdictConfig()).cost
    assert c is not None
    assert c["expected_bandwidth_bps"] == pytest.approx(48e6 / 6.6e-3 / 2, rel=1e-6)
    assert any("200 Gb/sec" in e for e in c["evidence"])


@pytest.mark.parametrize(
    ("text", "bps"),
    [("400 Gb/sec (4X NDR)", 400e9), ("400Gb/s", 400e9), ("100 Gbit/s", 100e9), ("", None), ("fast", None)],
)
def test_link_rate_forms(text: str, bps: float | None) -> None:
    assert link_rate_bps(text) == bps
