"""judge(): path class and every flag, positive and negative, and requests with incomplete evidence."""

from __future__ import annotations

from railtrace.model import Flag
from railtrace.topology import Topology, load_paths
from railtrace.verdicts import VerdictConfig, judge, lane_transport
from tests.topology.conftest import FIX
from tests.verdicts.helpers import facts, kv, pick


def names(summary) -> set[str]:
    return {f.name for f in summary.flags}


def flag(summary, name: str) -> Flag:
    return next(f for f in summary.flags if f.name == name)


# -- a healthy request ------------------------------------------------------------------------------
def test_healthy_rdma_same_rail_no_flags(fleet: Topology) -> None:
    s = judge(facts(kvf=kv()), fleet, VerdictConfig())
    assert s.kv_transfer.path_class == "rdma_same_rail" and s.kv_transfer.transport == "rdma"
    assert names(s) == set()
    assert s.prefill == {
        "pod": "prefill-0",
        "node": "node-a",
        "gpu": "gpu-0",
        "nic": "mlx5_0",
        "rail": "rail-0",
    }
    assert s.decode == {
        "pod": "decode-b",
        "node": "node-b",
        "gpu": "gpu-0",
        "nic": "mlx5_0",
        "rail": "rail-0",
    }
    assert s.pairing_level == "subblock"
    assert "rail rail-0 on both ends (devices UCX used)" in s.kv_transfer.evidence


# -- tcp_fallback ---------------------------------------------------------------------------------------
def test_tcp_fallback_between_rdma_nodes(fleet: Topology) -> None:
    s = judge(facts(kvf=kv(transport="tcp", devices=["tcp/eth0"], duration_s=0.09)), fleet)
    assert s.kv_transfer.path_class == "tcp"
    f = flag(s, "tcp_fallback")
    assert f.span_id == "00000000000000aa"
    assert "span 00000000000000aa llm_d.kv_transfer llm_d.kv_transfer.transport" in f.evidence
    assert "node-a" in f.evidence and "node-b" in f.evidence


def test_tcp_fallback_inferred_from_devices_only(fleet: Topology) -> None:
    s = judge(facts(kvf=kv(transport="unknown", devices=["tcp/eth1"], duration_s=0.09)), fleet)
    assert s.kv_transfer.transport == "tcp"
    assert "llm_d.kv_transfer.devices" in flag(s, "tcp_fallback").evidence


def test_tcp_on_gpudirect_tcpx_is_expected(fleet: Topology) -> None:
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
    s = judge(f, fleet)
    assert s.kv_transfer.path_class == "tcp"
    assert "tcp_fallback" not in names(s)
    assert "TCP expected" in s.kv_transfer.evidence and "GPUDirect-TCPX" in s.kv_transfer.evidence


def test_tcp_with_unknown_node_is_not_flagged(fleet: Topology) -> None:
    f = facts("10.9.9.9:8000", "10.0.0.2:8000", kv(transport="tcp", devices=["tcp/eth0"], remote_host=None))
    s = judge(f, fleet)
    assert "tcp_fallback" not in names(s)
    assert "RDMA availability unknown" in s.kv_transfer.evidence


def test_tcp_lane_in_a_split_is_a_fallback(fleet: Topology) -> None:
    k = kv(devices=["rc_mlx5/mlx5_0:1", "tcp/eth0"], split=[0.6, 0.4])
    ev = flag(judge(facts(kvf=k), fleet), "tcp_fallback").evidence
    assert "llm_d.kv_transfer.devices" in ev and "tcp/eth0 carried 40% of bytes" in ev


def test_rdma_is_never_tcp_fallback(fleet: Topology) -> None:
    assert "tcp_fallback" not in names(judge(facts(kvf=kv()), fleet))


# -- cross_rail and gpu_nic_mismatch ---------------------------------------------------------------
def test_wrong_nic_from_devices_is_cross_rail_and_mismatch(fleet: Topology) -> None:
    s = judge(facts(kvf=kv(devices=["rc_mlx5/mlx5_1:1"])), fleet)
    assert s.kv_transfer.path_class == "rdma_cross_rail"
    cr, mm = flag(s, "cross_rail"), flag(s, "gpu_nic_mismatch")
    assert "llm_d.kv_transfer.devices lane rc_mlx5/mlx5_1:1" in cr.evidence and "rail-1" in cr.evidence
    assert "(devices UCX used)" in mm.evidence and "not paired with gpu-0" in mm.evidence
    assert mm.span_id == "00000000000000aa"


def test_cross_rail_from_allocation_when_no_devices(fleet: Topology) -> None:
    f = facts(decode="10.0.0.4:8000", kvf=kv(devices=[], pod="decode-b1", local_gpu=None))
    s = judge(f, fleet)
    assert s.decode["rail"] == "rail-1" and s.prefill["rail"] == "rail-0"
    ev = flag(s, "cross_rail").evidence
    assert ev.startswith("allocation:") and "no llm_d.kv_transfer.devices" in ev
    assert "gpu_nic_mismatch" not in names(s)  # each pod holds its own GPU's NIC


def test_mismatch_from_allocation_when_no_devices(fleet: Topology) -> None:
    f = facts(decode="10.0.0.5:8000", kvf=kv(devices=[], pod="decode-bad", local_gpu=None))
    s = judge(f, fleet)
    ev = flag(s, "gpu_nic_mismatch").evidence
    assert "allocation (ResourceClaim railtrace:decode-bad)" in ev
    assert "gpu-1 (pcieRoot pci0000:20) allocated with mlx5_0" in ev


def test_devices_override_allocation(fleet: Topology) -> None:
    # The allocation of decode-bad is misaligned, but UCX used gpu-1's own NIC: devices decide the local side.
    f = facts(
        decode="10.0.0.5:8000", kvf=kv(devices=["rc_mlx5/mlx5_1:1"], pod="decode-bad", local_gpu="gpu-1")
    )
    assert "gpu_nic_mismatch" not in names(judge(f, fleet))


def test_two_rail_split_reports_share_and_threshold(fleet: Topology) -> None:
    k = kv(devices=["rc_mlx5/mlx5_0:1", "dc_mlx5/mlx5_1:1"], split=[0.72, 0.28])
    s = judge(facts(kvf=k), fleet)
    assert "28% of bytes" in flag(s, "cross_rail").evidence
    assert "gpu_nic_mismatch" not in names(s)  # the dominant lane is the GPU's own NIC
    s2 = judge(facts(kvf=k), fleet, VerdictConfig(cross_rail_min_share=0.3))
    assert "cross_rail" not in names(s2) and s2.kv_transfer.path_class == "rdma_same_rail"


def test_rails_unknown_gives_unknown_path_class(fleet: Topology) -> None:
    f = facts(decode="10.0.0.6:8000", kvf=kv(pod="decode-x", node="node-norail"))
    s = judge(f, fleet)
    assert s.kv_transfer.transport == "rdma" and s.kv_transfer.path_class == "unknown"
    assert not names(s) & {"cross_rail", "gpu_nic_mismatch"}
    assert "rails of both ends are not known" in s.kv_transfer.evidence


def test_unknown_device_is_not_judged(fleet: Topology) -> None:
    s = judge(facts(kvf=kv(devices=["rc_mlx5/mlx5_9:1"])), fleet)
    assert "gpu_nic_mismatch" not in names(s)
    assert "not found on node node-b" in s.kv_transfer.evidence


def test_real_azure_claim_gives_mismatch_from_allocation() -> None:
    az = FIX / "dranet"
    t = load_paths(
        [
            az / "azure_aks_examples__gb300__resourceslice-gpu.yaml",
            az / "azure_aks_examples__gb300__resourceslice-dranet.yaml",
            az / "azure_aks_examples__gb300__resource-claim.yaml",
        ]
    )
    k = kv(
        devices=[],
        pod="nccl-test-dra-worker-0",
        node="aks-gpu-45139532-vmss000081",
        local_gpu=None,
        remote_host=None,
    )
    s = judge(facts(prefill=None, decode=None, kvf=k), t)
    ev = flag(s, "gpu_nic_mismatch").evidence
    assert "nccl-test-dra-worker-0-gpu-nic-sbmhc" in ev and "mlx5_2" in ev and "NUMA 1" in ev
    assert s.decode["gpu"] == "gpu-0" and s.decode["nic"] == "mlx5_2"


# -- topology_blind_pairing --------------------------------------------------------------------------
def test_blind_pairing_passes_over_closer_comparable_candidate(fleet: Topology) -> None:
    p = pick("10.0.0.3:8000", [("10.0.0.2:8000", 0.80), ("10.0.0.3:8000", 0.82)])
    s = judge(facts(decode="10.0.0.3:8000", kvf=kv(pod="decode-c", node="node-c"), picks=[p]), fleet)
    f = flag(s, "topology_blind_pairing")
    assert f.span_id == "00000000000000bb"
    assert "llm_d.router.candidate.endpoints" in f.evidence
    assert (
        "chose 10.0.0.3:8000 (score 0.82, block" in f.evidence
        and "10.0.0.2:8000 (score 0.8, subblock)" in f.evidence
    )
    assert s.pairing_level == "block"


def test_blind_pairing_not_flagged_when_scores_not_comparable(fleet: Topology) -> None:
    p = pick("10.0.0.3:8000", [("10.0.0.2:8000", 0.50), ("10.0.0.3:8000", 0.82)])
    s = judge(facts(decode="10.0.0.3:8000", kvf=kv(pod="decode-c", node="node-c"), picks=[p]), fleet)
    assert "topology_blind_pairing" not in names(s)
    wide = VerdictConfig(score_tolerance=0.5)
    s2 = judge(facts(decode="10.0.0.3:8000", kvf=kv(pod="decode-c", node="node-c"), picks=[p]), fleet, wide)
    assert "topology_blind_pairing" in names(s2)


def test_blind_pairing_not_flagged_when_nearest_chosen(fleet: Topology) -> None:
    p = pick("10.0.0.2:8000", [("10.0.0.2:8000", 0.80), ("10.0.0.3:8000", 0.82)])
    assert "topology_blind_pairing" not in names(judge(facts(kvf=kv(), picks=[p]), fleet))


def test_blind_pairing_unknown_topology_is_not_guessed(fleet: Topology) -> None:
    p = pick("10.7.0.3:8000", [("10.7.0.2:8000", 0.80), ("10.7.0.3:8000", 0.82)])
    s = judge(facts(decode="10.7.0.3:8000", kvf=kv(pod=None, node=None), picks=[p]), fleet)
    assert "topology_blind_pairing" not in names(s)


def test_blind_pairing_from_router_shim_topology_keys(fleet: Topology) -> None:
    prefill_pick = pick("10.7.0.1:8000", [("10.7.0.1:8000", 1.0)], profile="prefill", topology="z/b1/s1/h1")
    decode_pick = pick("10.7.0.3:8000", [], profile="decode")
    decode_pick.candidates = [
        type(prefill_pick.candidates[0])(endpoint="10.7.0.2:8000", score=0.8, topology="z/b1/s1/h2"),
        type(prefill_pick.candidates[0])(endpoint="10.7.0.3:8000", score=0.8, topology="z/b2/s9/h3"),
    ]
    s = judge(
        facts("10.7.0.1:8000", "10.7.0.3:8000", kv(pod=None, node=None), [prefill_pick, decode_pick]), fleet
    )
    assert "subblock" in flag(s, "topology_blind_pairing").evidence


def test_no_picks_means_pairing_not_judged(fleet: Topology) -> None:
    s = judge(facts(kvf=kv()), fleet)
    assert "topology_blind_pairing" not in names(s)
    assert "no decode pick" in s.kv_transfer.evidence


# -- slow_kv_transfer ------------------------------------------------------------------------------
def test_slow_rdma_transfer(fleet: Topology) -> None:
    s = judge(facts(kvf=kv(duration_s=0.2)), fleet)
    ev = flag(s, "slow_kv_transfer").evidence
    assert "llm_d.kv_transfer.bytes=48000000 in 200.0 ms" in ev and "rdma_same_rail" in ev


def test_healthy_speed_is_not_slow(fleet: Topology) -> None:
    assert "slow_kv_transfer" not in names(judge(facts(kvf=kv(duration_s=0.0080)), fleet))


def test_tcp_expected_speed_is_not_slow_but_far_below_is(fleet: Topology) -> None:
    args = {
        "transport": "tcp",
        "devices": ["tcp/eth1"],
        "pod": "decode-t",
        "node": "tcpx-2",
        "remote_host": "10.0.1.1",
    }
    ok = judge(facts("10.0.1.1:8000", "10.0.1.2:8000", kv(duration_s=0.09, **args)), fleet)
    slow = judge(facts("10.0.1.1:8000", "10.0.1.2:8000", kv(duration_s=2.0, **args)), fleet)
    assert "slow_kv_transfer" not in names(ok) and "slow_kv_transfer" in names(slow)


def test_small_transfers_are_not_judged_for_speed(fleet: Topology) -> None:
    assert "slow_kv_transfer" not in names(judge(facts(kvf=kv(bytes=4096, duration_s=0.01)), fleet))


def test_expected_bandwidth_is_configurable(fleet: Topology) -> None:
    cfg = VerdictConfig(expected_bandwidth={"rdma_same_rail": 50e9})
    assert "slow_kv_transfer" in names(judge(facts(kvf=kv()), fleet, cfg))
    assert cfg.expected_bandwidth["tcp"] == 0.55e9  # other classes keep their defaults
    off = VerdictConfig(expected_bandwidth={"rdma_same_rail": None})
    assert "slow_kv_transfer" not in names(judge(facts(kvf=kv(duration_s=0.2)), fleet, off))


# -- kv_transfer_failed and broken_trace -------------------------------------------------------------
def test_failed_transfer(fleet: Topology) -> None:
    s = judge(facts(kvf=kv(error_type="NIXL_ERR_REMOTE_DISCONNECT", duration_s=5.0)), fleet)
    f = flag(s, "kv_transfer_failed")
    assert f.evidence == "span 00000000000000aa llm_d.kv_transfer error.type=NIXL_ERR_REMOTE_DISCONNECT"
    assert "slow_kv_transfer" not in names(s)  # a failed transfer is not also "slow"


def test_successful_transfer_is_not_failed(fleet: Topology) -> None:
    assert "kv_transfer_failed" not in names(judge(facts(kvf=kv()), fleet))


def test_broken_trace_from_assembly_is_kept(fleet: Topology) -> None:
    f = facts(kvf=kv(), flags=[Flag("broken_trace", "decode hop in trace 2", "00000000000000c2")])
    s = judge(f, fleet)
    assert [x.name for x in s.flags] == ["broken_trace"]
    assert names(judge(facts(kvf=kv()), fleet)) == set()


# -- other path classes and incomplete evidence --------------------------------------------------------
def test_nvlink_and_shm(fleet: Topology) -> None:
    assert (
        judge(facts(kvf=kv(transport="nvlink", devices=["cuda_ipc/cuda"])), fleet).kv_transfer.path_class
        == "nvlink"
    )
    s = judge(facts(kvf=kv(transport="unknown", devices=["cma/memory"])), fleet)
    assert (s.kv_transfer.transport, s.kv_transfer.path_class) == ("shm", "shm")
    assert lane_transport("srd/rdmap16s27:1") == "rdma" and lane_transport("cuda_copy/cuda") == ""


def test_no_kv_span(fleet: Topology) -> None:
    s = judge(facts(kvf=None), fleet)
    assert s.kv_transfer is None and s.flags == []
    assert s.decode["pod"] == "decode-b" and s.pairing_level == "subblock"


def test_unknown_transport_without_devices(fleet: Topology) -> None:
    s = judge(facts(kvf=kv(transport="unknown", devices=[])), fleet)
    assert (s.kv_transfer.transport, s.kv_transfer.path_class) == ("unknown", "unknown")
    assert s.flags == []


def test_nothing_resolvable(fleet: Topology) -> None:
    f = facts(prefill=None, decode=None, kvf=kv(pod=None, node=None, remote_host=None, operation=None))
    s = judge(f, fleet)
    assert s.prefill == {"pod": None, "node": None, "gpu": None, "nic": None, "rail": None}
    assert s.kv_transfer.path_class == "unknown" and s.pairing_level is None
    assert "which leg ran the transfer is unknown" in s.kv_transfer.evidence


def test_empty_topology(fleet: Topology) -> None:
    s = judge(facts(kvf=kv(transport="tcp", devices=["tcp/eth0"])), Topology())
    assert s.flags == [] and s.kv_transfer.path_class == "tcp" and s.decode["gpu"] is None


def test_summary_keys_are_the_public_contract(fleet: Topology) -> None:
    d = judge(facts(kvf=kv()), fleet).to_dict()
    assert list(d)[:11] == [
        "trace_id",
        "request_id",
        "model",
        "start",
        "ttft_s",
        "e2e_s",
        "breakdown_s",
        "prefill",
        "decode",
        "kv_transfer",
        "flags",
    ]
    assert d["start"].endswith("Z")


def test_slow_with_unknown_rails_uses_the_lower_rdma_figure(fleet: Topology) -> None:
    f = facts(decode="10.0.0.6:8000", kvf=kv(pod="decode-x", node="node-norail", duration_s=0.2))
    ev = flag(judge(f, fleet), "slow_kv_transfer").evidence
    assert "expected for rdma (rail unknown)" in ev and "5.13 GB/s" in ev


def test_config_from_settings_without_verdict_fields_takes_the_defaults() -> None:
    """A settings object that lacks a verdict field gives that field's default value (a slotted
    dataclass has no class attribute to read it from: that once gave a slot descriptor)."""
    cfg = VerdictConfig.from_settings(object())
    assert (cfg.score_tolerance, cfg.slow_fraction) == (0.05, 0.25)
