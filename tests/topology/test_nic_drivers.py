"""NICs from DRA drivers other than dranet: the SR-IOV DRA driver and the InfiniBand DRA driver, each read
from slices written with the attribute names those drivers publish; unknown drivers are a gap."""

from __future__ import annotations

from pathlib import Path

from railtrace.topology import load_paths

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
SRIOV = FIX / "sriov"


def test_sriov_vfs_are_rdma_nics_paired_by_pcie_root() -> None:
    t = load_paths([SRIOV / "slices.yaml"])
    node = t.nodes["sriov-node-a"]
    assert node.rdma_path is True and "0000-1a-00-1" in node.rdma_reason
    vf = t.nic("sriov-node-a", "0000-1a-00-1")
    assert vf is not None
    assert (vf.rdma, vf.link_type, vf.function, vf.pf, vf.pf_pci_address) == (
        True,
        "infiniband",
        "VF",
        "ibp26s0",
        "0000:1a:00.0",
    )
    assert (vf.pci_address, vf.pcie_root, vf.numa) == ("0000:1a:00.1", "pci0000:15", 0)
    assert vf.decided_by["rdma"] == "ResourceSlice sriovnetwork.k8snetworkplumbingwg.io"
    p = t.pairing("sriov-node-a", "gpu-1")
    assert p.method == "pcieRoot" and set(p.nics) == {"0000-2c-00-1", "0000-2c-00-2"}
    assert "VF 0000:1a:00.1 of PF ibp26s0" in vf.describe()
    gpu = t.gpu("sriov-node-a", "gpu-0")
    assert gpu.decided_by == {
        "pci_bus_id": "ResourceSlice gpu.nvidia.com",
        "pcie_root": "ResourceSlice gpu.nvidia.com",
    }


def test_sriov_allocation_is_aligned_and_json_has_vf_keys() -> None:
    t = load_paths([SRIOV / "slices.yaml", SRIOV / "pods-and-claims.yaml"])
    allocs = {a.claim: a for a in t.allocations}
    assert allocs["prefill-0-net"].alignment == "aligned"
    assert allocs["prefill-0-net"].nics == ("0000-1a-00-1",)
    nic = next(n for n in t.to_dict()["nodes"][0]["nics"] if n["name"] == "0000-1a-00-1")
    assert nic["function"] == "VF" and nic["pf"] == "ibp26s0" and nic["link_type"] == "infiniband"
    assert nic["decided_by"]["pcie_root"].startswith("ResourceSlice")


def test_sriov_vf_without_rdma_is_not_a_pairing_candidate(tmp_path: Path) -> None:
    text = (SRIOV / "slices.yaml").read_text().replace("bool: true", "bool: false")
    (tmp_path / "s.yaml").write_text(text)
    t = load_paths([tmp_path / "s.yaml"])
    assert t.nodes["sriov-node-a"].rdma_path is None
    assert t.pairing("sriov-node-a", "gpu-0").method is None


def test_sriov_numa_minus_one_means_unknown(tmp_path: Path) -> None:
    text = (
        (SRIOV / "slices.yaml")
        .read_text()
        .replace("dra.net/numaNode:\n        int: 0", "dra.net/numaNode:\n        int: -1")
    )
    (tmp_path / "s.yaml").write_text(text)
    t = load_paths([tmp_path / "s.yaml"])
    assert t.nic("sriov-node-a", "0000-1a-00-1").numa is None


def test_ib_driver_ports_are_rdma_and_pair_by_numa_when_gpu_numa_known(tmp_path: Path) -> None:
    doc = tmp_path / "numa.yaml"
    doc.write_text(
        "apiVersion: railtrace.io/v1alpha1\nkind: Topology\nnodes:\n"
        "- name: ib-node\n  gpus: [{name: gpu-0, numa: 1}]\n"
    )
    t = load_paths([FIX / "ib-dra" / "slices.yaml", doc])
    vf = t.nic("ib-node", "ib-vf-1")
    assert (vf.rdma, vf.function, vf.pf, vf.rate, vf.numa, vf.link_type) == (
        True,
        "VF",
        "mlx5_4",
        "400Gb/s",
        1,
        "infiniband",
    )
    p = t.pairing("ib-node", "gpu-0")
    assert p.method == "numa" and p.nics == ("ib-vf-1",)


def test_unknown_driver_is_a_discovery_gap_not_a_nic() -> None:
    t = load_paths([FIX / "ib-dra" / "slices.yaml"])
    assert t.nic("ib-node", "port-0") is None
    gap = next(g for g in t.gaps if g.object == "driver/ib-node/nic.example.com")
    assert gap.missing == ("driver",) and "port-0" in gap.note


def test_numa_only_compat_attribute_does_not_make_a_nic(tmp_path: Path) -> None:
    """dracpu publishes dra.net/numaNode for compatibility: a CPU is not a NIC."""
    (tmp_path / "cpu.yaml").write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: c}\n"
        "spec:\n  driver: dra.cpu\n  nodeName: n1\n  pool: {name: n1}\n"
        "  devices:\n  - name: cpudev0\n    attributes:\n      dra.net/numaNode: {int: 0}\n"
    )
    t = load_paths([tmp_path / "cpu.yaml"])
    assert t.nics_on("n1") == [] and not any(g.object.startswith("driver/") for g in t.gaps)


def test_sriov_template_matching_pcie_root_is_aligned(tmp_path: Path) -> None:
    """The SR-IOV driver's resource-alignment shape: a VF and a GPU request matched on pcieRoot."""
    (tmp_path / "rct.yaml").write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\n"
        "metadata: {name: gpu-vf, namespace: llm-d}\n"
        "spec:\n  spec:\n    devices:\n      requests:\n"
        "      - {name: vf, exactly: {deviceClassName: sriovnetwork.k8snetworkplumbingwg.io}}\n"
        "      - {name: gpu, exactly: {deviceClassName: gpu.nvidia.com, count: 1}}\n"
        "      constraints:\n      - {matchAttribute: resource.kubernetes.io/pcieRoot}\n"
    )
    t = load_paths([SRIOV / "slices.yaml", tmp_path / "rct.yaml"])
    check = next(c for c in t.templates if c.name == "gpu-vf")
    assert {r["name"]: r["kind"] for r in check.requests} == {"vf": "nic", "gpu": "gpu"}
    assert check.alignment == "aligned"


def test_claim_on_an_unlisted_sriov_vf_selected_rdma_capable_is_an_rdma_nic(tmp_path: Path) -> None:
    (tmp_path / "claim.yaml").write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c1, namespace: llm-d}\n"
        "spec:\n  devices:\n    requests:\n    - name: vf\n      exactly:\n"
        "        deviceClassName: sriovnetwork.k8snetworkplumbingwg.io\n        selectors:\n"
        '        - cel: {expression: \'device.attributes["sriovnetwork.k8snetworkplumbingwg.io"]'
        ".rdmaCapable == true'}\n"
        "status:\n  allocation:\n    devices:\n      results:\n"
        "      - {request: vf, driver: sriovnetwork.k8snetworkplumbingwg.io, pool: n9,\n"
        "         device: 0000-3b-00-2}\n"
    )
    t = load_paths([tmp_path / "claim.yaml"])
    nic = t.nic("n9", "0000-3b-00-2")
    assert nic is not None and nic.rdma is True
