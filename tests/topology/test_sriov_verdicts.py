"""KV transfers over SR-IOV VFs judged end to end: slices of the SR-IOV DRA driver, Pods and claims,
PF rails, optionally the node collector's RDMA device names, then the judge."""

from __future__ import annotations

from pathlib import Path

from railtrace.model import Endpoint, KVFacts, RequestFacts
from railtrace.topology import load_paths
from railtrace.verdicts import judge

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "topology" / "sriov"
T0 = 1_700_000_000_000_000_000


def _facts(devices: list[str]) -> RequestFacts:
    kv = KVFacts(
        span_id="00000000000000aa",
        operation="read",
        connector="nixl",
        backend="UCX",
        bytes=48_000_000,
        duration_s=0.0066,
        transport="rdma",
        devices=devices,
        local_gpu="0",
        remote_host="10.1.0.1",
        pod="decode-0",
        node="sriov-node-b",
    )
    return RequestFacts(
        trace_id="0" * 31 + "1",
        trace_ids=["0" * 31 + "1"],
        request_id="req-1",
        model="m",
        start_ns=T0,
        end_ns=T0 + 10**9,
        ttft_s=0.3,
        e2e_s=1.0,
        breakdown_s={"kv_transfer": 0.0066},
        prefill=Endpoint(address="10.1.0.1:8000", span_id="00000000000000c1"),
        decode=Endpoint(address="10.1.0.2:8000", span_id="00000000000000c2"),
        kv=kv,
        picks=[],
        flags=[],
        span_count=8,
        complete=True,
    )


def test_transfer_over_the_allocated_vf_is_same_rail() -> None:
    """No node collector: UCX's mlx5_N meets the VF because the pod holds that one RDMA NIC only."""
    t = load_paths([FIX / "slices.yaml", FIX / "pods-and-claims.yaml", FIX / "rails.yaml"])
    assert t.nodes["sriov-node-b"].rdma_path is True
    s = judge(_facts(["rc_mlx5/mlx5_5:1"]), t)
    assert s.kv_transfer.path_class == "rdma_same_rail"
    assert {f.name for f in s.flags} == set()
    assert "mlx5_5 is 0000-1a-00-1 (VF 0000:1a:00.1 of PF ibp26s0)" in s.kv_transfer.evidence
    assert s.decode["rail"] == "rail-0" and s.prefill["rail"] == "rail-0"


def test_tcp_between_sriov_nodes_is_a_fallback() -> None:
    t = load_paths([FIX / "slices.yaml", FIX / "pods-and-claims.yaml"])
    f = _facts(["tcp/eth0"])
    f.kv.transport = "tcp"
    s = judge(f, t)
    assert "tcp_fallback" in {x.name for x in s.flags}


def test_collected_rdma_names_show_a_vf_on_another_root(tmp_path: Path) -> None:
    """The node collector names each VF's RDMA device: a lane on a VF of the other PF is caught."""
    collected = tmp_path / "collected.yaml"
    collected.write_text(
        "apiVersion: railtrace.io/v1alpha1\nkind: Topology\ncollected: {by: railtrace topology collect}\n"
        "nodes:\n- name: sriov-node-b\n  nics:\n"
        "  - {name: mlx5_5, rdmaDevice: mlx5_5, pciAddress: '0000:1a:00.1', function: VF}\n"
        "  - {name: mlx5_9, rdmaDevice: mlx5_9, pciAddress: '0000:2c:00.1', function: VF}\n"
    )
    t = load_paths([FIX / "slices.yaml", FIX / "pods-and-claims.yaml", FIX / "rails.yaml", collected])
    vf = t.nic("sriov-node-b", "0000-2c-00-1")
    assert vf.rdma_device == "mlx5_9" and vf.rail == "rail-1"
    assert vf.decided_by["rdma_device"] == "node (railtrace topology collect)"
    assert vf.decided_by["rdma"] == "ResourceSlice sriovnetwork.k8snetworkplumbingwg.io"
    s = judge(_facts(["rc_mlx5/mlx5_9:1"]), t)
    names = {f.name: f for f in s.flags}
    assert s.kv_transfer.path_class == "rdma_cross_rail"
    assert "VF 0000:2c:00.1 of PF ibp44s0" in names["gpu_nic_mismatch"].evidence
    assert "(devices UCX used)" in names["gpu_nic_mismatch"].evidence
    assert "rail rail-1 via mlx5_9" in names["cross_rail"].evidence
