"""Loader behaviour on real-world input variations and on bad input; the builder's incremental use."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from railtrace.topology import TopologyBuilder, TopologyError, load_paths
from railtrace.topology.cli import topology_command

SMI_TABS = (
    "\x1b[4mGPU0\tGPU1\tmlx5_0\tmlx5_3\tmlx5_bond_0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV12\tPXB\tSYS\tSYS\t0-31\t0\tN/A\n"
    "GPU1\tNV12\t X \tSYS\tPXB\tNODE\t32-63\t1\tN/A\n"
    "mlx5_0\tPXB\tSYS\t X \tSYS\tSYS\n"
    "mlx5_3\tSYS\tPXB\tSYS\t X \tSYS\n"
    "mlx5_bond_0\tSYS\tNODE\tSYS\tSYS\t X \n"
)

GB200_SYS = """# node: gb200-host
        GPU0    GPU1    NIC0    NIC1    CPU Affinity    NUMA Affinity   GPU NUMA ID
GPU0     X      NV18    SYS     SYS     0-71            0               N/A
GPU1    NV18     X      SYS     SYS     72-143          1               N/A
NIC0    SYS     SYS      X      SYS
NIC1    SYS     SYS     SYS      X

NIC Legend:

  NIC0: mlx5_0
  NIC1: mlx5_1
"""


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="no such file or folder"):
        load_paths([tmp_path / "nope.yaml"])


def test_broken_yaml_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: v1\nkind: Node\nmetadata: {name: [x\n")
    with pytest.raises(TopologyError, match=r"bad.yaml: line \d+ not valid YAML"):
        load_paths([bad])


def test_binary_file_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(b"\x00\x01\x02")
    with pytest.raises(TopologyError, match="binary"):
        load_paths([tmp_path / "x.bin"])


def test_json_list_and_multidoc_yaml(tmp_path: Path) -> None:
    nodes = {
        "kind": "List",
        "items": [
            {
                "kind": "Node",
                "metadata": {
                    "name": "n1",
                    "labels": {
                        "topology.kubernetes.io/zone": "z",
                        "cloud.google.com/gce-topology-block": "b",
                        "cloud.google.com/gce-topology-subblock": "s1",
                        "node.kubernetes.io/instance-type": "a3-megagpu-8g",
                    },
                },
                "status": {"addresses": [{"type": "InternalIP", "address": "192.168.1.1"}]},
            },
        ],
    }
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))
    (tmp_path / "more.yaml").write_text(
        "kind: Node\nmetadata: {name: n2, labels: {topology.kubernetes.io/zone: z, "
        "cloud.google.com/gce-topology-block: b, cloud.google.com/gce-topology-subblock: s2}}\n---\n"
        "kind: Node\nmetadata: {name: n3, labels: {topology.kubernetes.io/zone: z2}}\n"
    )
    t = load_paths([tmp_path])
    assert set(t.nodes) == {"n1", "n2", "n3"}
    assert t.nodes["n1"].rdma_path is False and "GPUDirect-TCPX" in t.nodes["n1"].rdma_reason
    assert t.level_between("n1", "n2")[0] == "block"
    assert t.level_between("n1", "n3")[0] == "far"
    assert t.level_between("n1", "192.168.1.1")[0] == "same_host"  # node by address
    assert t.level_between("n1", "ghost")[0] == "unknown"


def test_smi_tabs_ansi_mlx5_columns_pxb_and_bond(tmp_path: Path) -> None:
    b = TopologyBuilder()
    b.add_nvidia_smi(SMI_TABS, node="h")
    t = b.build()
    assert (t.pairing("h", "gpu-0").method, t.pairing("h", "gpu-0").nics) == ("topo:PXB", ("mlx5_0",))
    # Non-contiguous names: GPU1's NIC is mlx5_3, never "NIC index == GPU index".
    assert t.pairing("h", "gpu-1").nics == ("mlx5_3",)
    assert {n.name for n in t.nics_on("h")} == {"mlx5_0", "mlx5_3", "mlx5_bond_0"}


def test_smi_gb200_all_sys_falls_back_to_numa(tmp_path: Path) -> None:
    (tmp_path / "gb200.txt").write_text(GB200_SYS)
    t = load_paths([tmp_path / "gb200.txt"])
    assert set(t.nodes) == {"gb200-host"}  # from the `# node:` line
    p = t.pairing("gb200-host", "gpu-0")
    assert p.method is None  # all SYS; NICs have no NUMA in the matrix: said, not guessed
    assert "GPU publishes no pcieRoot" in p.evidence
    doc = tmp_path / "numa.yaml"
    doc.write_text(
        "apiVersion: railtrace.io/v1alpha1\nkind: Topology\nnodes:\n- name: gb200-host\n  nics:\n"
        "  - {name: mlx5_0, numa: 0}\n  - {name: mlx5_1, numa: 1}\n"
    )
    t = load_paths([tmp_path / "gb200.txt", doc])
    assert (t.pairing("gb200-host", "gpu-1").method, t.pairing("gb200-host", "gpu-1").nics) == (
        "numa",
        ("mlx5_1",),
    )


def test_railtrace_doc_errors_are_clear(tmp_path: Path) -> None:
    bad = tmp_path / "t.yaml"
    bad.write_text("apiVersion: railtrace.io/v1alpha1\nkind: Topology\nnodes: {name: x}\n")
    with pytest.raises(TopologyError, match="`nodes` must be a list"):
        load_paths([bad])


def test_builder_replaces_and_removes_objects() -> None:
    b = TopologyBuilder()
    node = {"kind": "Node", "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.clique": "c.1"}}}
    b.add_k8s_object(node)
    assert b.build().nodes["n1"].nvlink_domain == "c.1"
    b.add_k8s_object({"kind": "Node", "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.clique": "c.2"}}})
    assert b.build().nodes["n1"].nvlink_domain == "c.2"
    b.remove_k8s_object(node)
    assert b.build().nodes == {}
    b.add_k8s_object({"metadata": {"name": "x"}})
    assert any("without `kind`" in w for w in b.build().warnings)


def test_compute_domain_status_gives_nvlink_domain() -> None:
    b = TopologyBuilder()
    b.add_k8s_object(
        {
            "kind": "ComputeDomain",
            "metadata": {"name": "cd"},
            "status": {"nodes": [{"name": "a", "cliqueID": "u.1"}, {"name": "b", "cliqueID": "u.1"}]},
        }
    )
    t = b.build()
    assert t.level_between("a", "b")[0] == "nvlink_domain"
    assert t.nodes["a"].nvlink_source == "ComputeDomain status.nodes[].cliqueID"


def test_cli_show_text_and_json(tmp_path: Path) -> None:
    from tests.topology.conftest import FIX

    paths = [str(FIX / "nvidia-smi-topo" / "h100-8gpu-8nic__sglang-issue-30401.txt")]
    out = io.StringIO()
    assert topology_command(argparse.Namespace(paths=paths, json=False), out) == 0
    assert "gpu-0" in out.getvalue() and "mlx5_0 (by topo:PIX)" in out.getvalue()
    out = io.StringIO()
    assert topology_command(argparse.Namespace(paths=paths, json=True), out) == 0
    d = json.loads(out.getvalue())
    assert set(d) >= {
        "nodes",
        "rails",
        "nvlink_domains",
        "blocks",
        "pods",
        "allocations",
        "templates",
        "discovery_gaps",
        "warnings",
        "sources",
    }
    node = d["nodes"][0]
    assert node["pairings"][0] == {
        "gpu": "gpu-0",
        "nics": ["mlx5_0"],
        "method": "topo:PIX",
        "evidence": "nvidia-smi topo -m GPU0 PIX",
    }
    assert (
        topology_command(argparse.Namespace(paths=[str(tmp_path / "none")], json=False), io.StringIO()) == 2
    )


def test_one_malformed_object_costs_nothing_else() -> None:
    b = TopologyBuilder()
    b.add_k8s_object(
        {
            "kind": "ResourceSlice",
            "metadata": {"name": "broken"},
            "spec": {"driver": "dra.net", "nodeName": "n1", "devices": "not-a-list"},
        }
    )
    b.add_k8s_object({"kind": "ResourceClaim", "metadata": {"name": "odd"}, "status": {"allocation": "x"}})
    b.add_k8s_object(
        {"kind": "Node", "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "z"}}}
    )
    t = b.build()
    assert t.nodes["n1"].zone == "z"
    assert any("ResourceSlice broken" in w and "malformed" in w for w in t.warnings)
    assert any("ResourceClaim odd" in w and "malformed" in w for w in t.warnings)


def test_pods_from_claims_only_when_the_source_lists_no_pods() -> None:
    claim = {
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "d"},
        "status": {
            "reservedFor": [{"name": "gone", "resource": "pods"}],
            "allocation": {"devices": {"results": [{"driver": "dra.net", "pool": "n1", "device": "x"}]}},
        },
    }
    b = TopologyBuilder()
    b.add_k8s_object(claim, source="claims.yaml")
    assert b.build().pods_named("gone")[0].node == "n1"  # a claims-only dump: the claim is all we know
    b = TopologyBuilder()
    b.add_k8s_object(claim, source="cluster")
    b.add_k8s_object({"kind": "Pod", "metadata": {"name": "other", "namespace": "d"}}, source="cluster")
    assert b.build().pods_named("gone") == []  # the same source lists pods: "gone" is gone


def test_a4x_subblock_is_an_nvlink_domain() -> None:
    b = TopologyBuilder()
    for name, sub in (("x1", "s1"), ("x2", "s1"), ("x3", "s2")):
        labels = {
            "cloud.google.com/gce-topology-subblock": sub,
            "cloud.google.com/gce-topology-block": "b",
            "node.kubernetes.io/instance-type": "a4x-highgpu-4g",
        }
        b.add_k8s_object({"kind": "Node", "metadata": {"name": name, "labels": labels}})
    t = b.build()
    assert t.level_between("x1", "x2")[0] == "nvlink_domain" and t.level_between("x1", "x3")[0] == "block"


def test_one_bad_railtrace_entry_costs_nothing_else() -> None:
    b = TopologyBuilder()
    b.add_railtrace_doc(
        {
            "apiVersion": "railtrace.io/v1alpha1",
            "kind": "Topology",
            "nodes": [{"name": "bad", "gpus": "gpu-0"}, "not-a-node", {"name": "good", "zone": "z"}],
            "pods": [{"name": "p", "node": "good", "ports": ["x"]}, {"name": "q", "node": "good"}],
        }
    )
    t = b.build()
    assert t.nodes["good"].zone == "z" and [p.name for p in t.pods.values()] == ["q"]
    assert any("entry bad" in w and "malformed" in w for w in t.warnings)
    assert any("entry p" in w for w in t.warnings) and any("not-a-node" in w for w in t.warnings)
