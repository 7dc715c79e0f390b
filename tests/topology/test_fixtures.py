"""Every file in the topology fixtures loads, with the specific facts it shows."""

from __future__ import annotations

from pathlib import Path

from railtrace.topology import load_paths
from railtrace.topology.model import ALIGNED, MISALIGNED, NOT_APPLICABLE, UNKNOWN

AWS_NODE = "ip-192-168-153-160.ec2.internal"
AZ_NODE = "aks-gpu-45139532-vmss000081"
OCI_NODE = "10.140.65.248"
GKE_NODE = "gke-dra-1-gpu-nodes-2-e5f6f579-7je4"


def _d(fix: Path) -> Path:
    return fix / "dranet"


def _template(t, name):
    return next(x for x in t.templates if x.name == name)


# -- AWS p4d (EFA) ---------------------------------------------------------------------------
def test_aws_p4d_gpu_slice(fix: Path) -> None:
    t = load_paths([_d(fix) / "aws_eks_examples__gpu-efa__resourceslice-gpu.yaml"])
    gpus = t.gpus_on(AWS_NODE)
    assert [g.name for g in gpus] == [f"gpu-{i}" for i in range(8)]
    roots = [g.pcie_root for g in gpus]
    assert roots == ["pci0000:10"] * 2 + ["pci0000:20"] * 2 + ["pci0000:90"] * 2 + ["pci0000:a0"] * 2
    assert gpus[0].product == "NVIDIA A100-SXM4-40GB" and gpus[0].numa is None  # the driver publishes no NUMA
    assert all(p.method is None for p in t.pairings)  # no NIC known: nothing paired, and it says so
    assert any("could not be paired" in w for w in t.warnings)


def test_aws_p4d_dranet_slice(fix: Path) -> None:
    t = load_paths([_d(fix) / "aws_eks_examples__gpu-efa__resourceslice-dranet.yaml"])
    nics = t.nics_on(AWS_NODE)
    efa = [n for n in nics if n.rdma]
    ena = [n for n in nics if n.rdma is False]
    assert sorted(n.rdma_device for n in efa) == ["rdmap144s27", "rdmap160s27", "rdmap16s27", "rdmap32s27"]
    assert sorted(n.if_name for n in ena) == ["ens129", "ens161", "ens65"]
    assert all(n.if_name is None for n in efa)  # RDMA-only devices have no interface
    assert t.nodes[AWS_NODE].rdma_path is True


def test_aws_p4d_two_gpus_per_pcie_root(fix: Path) -> None:
    t = load_paths(
        [
            _d(fix) / "aws_eks_examples__gpu-efa__resourceslice-gpu.yaml",
            _d(fix) / "aws_eks_examples__gpu-efa__resourceslice-dranet.yaml",
        ]
    )
    by_nic: dict[str, list[str]] = {}
    for p in t.pairings:
        assert p.method == "pcieRoot"
        assert len(p.nics) == 1
        by_nic.setdefault(t.nic(AWS_NODE, p.nics[0]).rdma_device, []).append(p.gpu)
    assert by_nic == {
        "rdmap16s27": ["gpu-0", "gpu-1"],
        "rdmap32s27": ["gpu-2", "gpu-3"],
        "rdmap144s27": ["gpu-4", "gpu-5"],
        "rdmap160s27": ["gpu-6", "gpu-7"],
    }
    # The ENA on pci0000:20 shares the root but is not an RDMA NIC: never paired.
    assert all("pci-0000-20-01-0" not in p.nics for p in t.pairings)


def test_aws_p4d_claim_is_aligned(fix: Path) -> None:
    t = load_paths(
        [
            _d(fix) / "aws_eks_examples__gpu-efa__resourceslice-gpu.yaml",
            _d(fix) / "aws_eks_examples__gpu-efa__resourceslice-dranet.yaml",
            _d(fix) / "aws_eks_examples__gpu-efa__resource-claim.yaml",
        ]
    )
    (a,) = t.allocations
    assert (a.claim, a.pods, a.node) == (
        "nccl-test-dra-worker-0-gpu-efa-example",
        ("nccl-test-dra-worker-0",),
        AWS_NODE,
    )
    assert a.gpus == ("gpu-6",) and a.nics == ("pci-0000-a0-1b-0",) and a.pod_claim_name == "gpu-efa"
    assert a.alignment == ALIGNED and "pcieRoot pci0000:a0" in a.evidence[0]
    assert t.pods_named("nccl-test-dra-worker-0")[0].node == AWS_NODE


def test_aws_claim_alone_says_what_is_missing(fix: Path) -> None:
    t = load_paths([_d(fix) / "aws_eks_examples__gpu-efa__resource-claim.yaml"])
    (a,) = t.allocations
    assert a.gpus == () and a.alignment == NOT_APPLICABLE
    assert any("gpu-6 is in no ResourceSlice" in w for w in t.warnings)


def test_aws_claim_templates_aligned_vs_unaligned(fix: Path) -> None:
    t = load_paths(
        [
            _d(fix) / "aws_eks_examples__gpu-efa__resource-claim-template.yaml",
            _d(fix) / "aws_eks_examples__gpu-efa__device-class.yaml",
        ]
    )
    assert _template(t, "gpu-efa-aligned").alignment == ALIGNED
    assert _template(t, "gpu-efa-unaligned").alignment == MISALIGNED
    assert "pcieRoot" in _template(t, "gpu-efa-aligned").evidence[0]


def test_aws_device_class(fix: Path) -> None:
    t = load_paths(
        [
            _d(fix) / "aws_eks_examples__gpu-efa__device-class.yaml",
            _d(fix) / "aws_eks_examples__gpu-efa__resource-claim-template.yaml",
        ]
    )
    req = next(r for r in _template(t, "gpu-efa-aligned").requests if r["request"] == "efa")
    assert req["deviceClassName"] == "efa.networking.k8s.aws" and req["kind"] == "nic"
    assert t.nodes == {}


# -- Azure ND GB300 v6 (Grace, VF NICs without pcieRoot) -------------------------------------
def test_azure_gb300_gpu_slice(fix: Path) -> None:
    t = load_paths([_d(fix) / "azure_aks_examples__gb300__resourceslice-gpu.yaml"])
    gpus = t.gpus_on(AZ_NODE)
    assert [g.pcie_root for g in gpus] == ["pci0008:00", "pci0009:00", "pci0018:00", "pci0019:00"]
    assert [g.numa for g in gpus] == [0, 0, 1, 1]  # Grace: socket from the PCI domain, and it says so
    assert all("Grace PCI domain" in (g.numa_source or "") for g in gpus)


def test_azure_gb300_dranet_slice(fix: Path) -> None:
    t = load_paths([_d(fix) / "azure_aks_examples__gb300__resourceslice-dranet.yaml"])
    nics = t.nics_on(AZ_NODE)
    assert [(n.rdma_device, n.numa, n.pcie_root) for n in nics] == [
        ("mlx5_0", 0, None),
        ("mlx5_1", 0, None),
        ("mlx5_2", 1, None),
        ("mlx5_3", 1, None),
    ]
    assert t.nodes[AZ_NODE].machine_type == "Standard_ND128isr_GB300_v6"
    assert {g.object for g in t.gaps if "pcieRoot" in g.missing} >= {f"nic/{AZ_NODE}/mlx5_0"}


def test_azure_gb300_pairs_by_numa_and_claim_is_misaligned(fix: Path) -> None:
    t = load_paths(
        [
            _d(fix) / "azure_aks_examples__gb300__resourceslice-gpu.yaml",
            _d(fix) / "azure_aks_examples__gb300__resourceslice-dranet.yaml",
            _d(fix) / "azure_aks_examples__gb300__resource-claim.yaml",
        ]
    )
    p0 = t.pairing(AZ_NODE, "gpu-0")
    assert p0.method == "numa"  # no NIC pcieRoot, GPU roots never equal NIC roots
    assert [t.nic(AZ_NODE, n).rdma_device for n in p0.nics] == ["mlx5_0", "mlx5_1"]
    (a,) = t.allocations
    assert a.alignment == MISALIGNED
    assert (
        "gpu-0 (0008:06:00.0, NUMA 0)" in a.evidence[0]
        and "mlx5_2 (pci-0103-00-00-0, NUMA 1)" in a.evidence[0]
    )


def test_azure_gb300_claim_templates(fix: Path) -> None:
    t = load_paths(
        [
            _d(fix) / "azure_aks_examples__gb300__resource-claim-template.yaml",
            _d(fix) / "azure_aks_examples__gb300__resourceslice-gpu.yaml",
            _d(fix) / "azure_aks_examples__gb300__resourceslice-dranet.yaml",
        ]
    )
    assert _template(t, "1nic-aligned").alignment == ALIGNED  # mlx5_0, NUMA 0
    assert _template(t, "1nic-unaligned").alignment == MISALIGNED  # mlx5_2, NUMA 1
    assert _template(t, "2nic-aligned").alignment == ALIGNED
    assert _template(t, "ib-same-fabric").alignment == NOT_APPLICABLE


def test_azure_gb300_claim_alone(fix: Path) -> None:
    t = load_paths([_d(fix) / "azure_aks_examples__gb300__resource-claim.yaml"])
    (a,) = t.allocations
    assert a.node == AZ_NODE and a.pods == ("nccl-test-dra-worker-0",)
    assert {r["device"] for r in a.results} == {"gpu-0", "pci-0103-00-00-0"}


# -- Azure MI300X ------------------------------------------------------------------------------
def test_azure_mi300x_dranet_slice(fix: Path) -> None:
    t = load_paths([_d(fix) / "azure_aks_examples__mi300x__resourceslice-dranet.yaml"])
    node = "aks-gpu-37973606-vmss000000"
    nics = t.nics_on(node)
    assert len(nics) == 8 and all(n.rdma and n.pcie_root is None for n in nics)
    assert [n.numa for n in nics] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert t.nodes[node].rdma_path is True and t.gpus_on(node) == []


def test_azure_mi300x_templates(fix: Path) -> None:
    t = load_paths([_d(fix) / "azure_aks_examples__mi300x__resource-claim-template.yaml"])
    assert {x.name: x.alignment for x in t.templates} == {
        "4nic-same-numa": NOT_APPLICABLE,
        "4nic-cross-numa": NOT_APPLICABLE,
        "8nic-all": NOT_APPLICABLE,
    }
    assert _template(t, "4nic-cross-numa").requests[0]["numaNode"] == 1


# -- OCI GB200 ---------------------------------------------------------------------------------
def test_oci_gb200_dranet_slice(fix: Path) -> None:
    t = load_paths([_d(fix) / "oci_oke_examples__BM.GPU.GB200-v3.4__resourceslice-dranet.yaml"])
    nics = t.nics_on(OCI_NODE)
    assert [n.if_name for n in nics] == [f"rdma{i}" for i in range(8)]
    assert [n.numa for n in nics] == [0, 0, 0, 0, 1, 1, 1, 1]
    node = t.nodes[OCI_NODE]
    # Published topology ids are "redacted": never used as real block/domain values.
    assert node.block is None and node.subblock is None and node.nvlink_domain is None
    gap = next(g for g in t.gaps if g.object == f"node/{OCI_NODE}")
    assert "redacted" in gap.note


def test_oci_gb200_gpu_slice(fix: Path) -> None:
    t = load_paths([_d(fix) / "oci_oke_examples__BM.GPU.GB200-v3.4__resourceslice-gpu.yaml"])
    assert [(g.pci_bus_id, g.numa) for g in t.gpus_on(OCI_NODE)] == [
        ("0008:06:00.0", 0),
        ("0009:06:00.0", 0),
        ("0018:06:00.0", 1),
        ("0019:06:00.0", 1),
    ]


def test_oci_gb200_all_sys_pairs_by_numa(fix: Path) -> None:
    t = load_paths(
        [
            _d(fix) / "oci_oke_examples__BM.GPU.GB200-v3.4__resourceslice-gpu.yaml",
            _d(fix) / "oci_oke_examples__BM.GPU.GB200-v3.4__resourceslice-dranet.yaml",
        ]
    )
    gpu_roots = {g.pcie_root for g in t.gpus_on(OCI_NODE)}
    nic_roots = {n.pcie_root for n in t.nics_on(OCI_NODE)}
    assert gpu_roots.isdisjoint(nic_roots)  # Grace C2C: pcieRoot can never pair
    for p in t.pairings:
        assert p.method == "numa"
    assert [t.nic(OCI_NODE, n).if_name for n in t.pairing(OCI_NODE, "gpu-2").nics] == [
        "rdma4",
        "rdma5",
        "rdma6",
        "rdma7",
    ]


def test_oci_gb200_claim_templates(fix: Path) -> None:
    t = load_paths(
        [
            _d(fix) / "oci_oke_examples__BM.GPU.GB200-v3.4__resource-claim-template.yaml",
            _d(fix) / "oci_oke_examples__BM.GPU.GB200-v3.4__resourceslice-gpu.yaml",
            _d(fix) / "oci_oke_examples__BM.GPU.GB200-v3.4__deviceclass.yaml",
        ]
    )
    got = {x.name: x.alignment for x in t.templates}
    assert (
        got["1nic-aligned"] == ALIGNED and got["2nic-aligned"] == ALIGNED and got["4nic-aligned"] == ALIGNED
    )
    assert got["1nic-unaligned"] == MISALIGNED
    assert got["4gpu-8nic"] == MISALIGNED  # without the NIC slice nothing shows 8 is every NIC
    t = load_paths(
        [
            _d(fix) / "oci_oke_examples__BM.GPU.GB200-v3.4__resource-claim-template.yaml",
            _d(fix) / "oci_oke_examples__BM.GPU.GB200-v3.4__resourceslice-dranet.yaml",
        ]
    )
    assert _template(t, "4gpu-8nic").alignment == ALIGNED  # 8 = every RDMA NIC of the GB200 node


def test_oci_gb200_placement_group_templates(fix: Path) -> None:
    t = load_paths(
        [_d(fix) / "oci_oke_examples__BM.GPU.GB200-v3.4__placement-group__resource-claim-template.yaml"]
    )
    names = [x.name for x in t.templates]
    assert names == ["2nic-aligned-local-block", "2nic-aligned-network-block", "2nic-aligned-gpu-fabric"]
    # Without the GPU slice the GPU's NUMA is unknown: said, not guessed.
    assert all(x.alignment == UNKNOWN for x in t.templates)
    assert all(x.requests[1]["numaNode"] == 0 for x in t.templates)


def test_oci_gb200_compute_domain(fix: Path) -> None:
    t = load_paths([_d(fix) / "oci_oke_examples__BM.GPU.GB200-v3.4__compute-domain.yaml"])
    assert t.compute_domains == ("nccl-test-compute-domain",)
    assert t.nodes == {}  # a spec without status names no nodes


def test_oci_gb200_deviceclass(fix: Path) -> None:
    t = load_paths([_d(fix) / "oci_oke_examples__BM.GPU.GB200-v3.4__deviceclass.yaml"])
    assert t.nodes == {} and t.templates == ()
    assert not any("not valid" in w for w in t.warnings)


def test_oci_h100_template_and_class(fix: Path) -> None:
    t = load_paths(
        [
            _d(fix) / "oci_oke_examples__BM.GPU.H100.8__resource-claim-template.yaml",
            _d(fix) / "oci_oke_examples__BM.GPU.H100.8__deviceclass.yaml",
        ]
    )
    (x,) = t.templates
    assert x.name == "1gpu-1nic" and x.alignment == MISALIGNED  # any GPU with any rdma* NIC
    assert x.requests[1]["ifNamePrefix"] == "rdma"


# -- nixl-kv-transfer, distributed training, demos -----------------------------------------
NIXL_NUMA = """
apiVersion: railtrace.io/v1alpha1
kind: Topology
nodes:
- name: h100-a
  gpus:
  - {name: gpu-0, pciBusID: "0001:00:00.0", numa: 0}
  - {name: gpu-1, pciBusID: "0002:00:00.0", numa: 0}
  - {name: gpu-2, pciBusID: "0003:00:00.0", numa: 0}
  - {name: gpu-3, pciBusID: "0008:00:00.0", numa: 0}
"""


def test_nixl_aligned_template(fix: Path, tmp_path: Path) -> None:
    path = _d(fix) / "nixl-kv-transfer__resource-claim-template-aligned.yaml"
    alone = load_paths([path])
    (x,) = alone.templates
    assert x.alignment == UNKNOWN and "NUMA of GPU 0001:00:00.0" in x.evidence[0]
    (tmp_path / "numa.yaml").write_text(NIXL_NUMA)
    (x,) = load_paths([path, tmp_path / "numa.yaml"]).templates
    assert x.alignment == ALIGNED


def test_nixl_unaligned_template(fix: Path, tmp_path: Path) -> None:
    path = _d(fix) / "nixl-kv-transfer__resource-claim-template-unaligned.yaml"
    (x,) = load_paths([path]).templates
    assert x.alignment == UNKNOWN and x.requests[1]["numaNode"] == 1
    (tmp_path / "numa.yaml").write_text(NIXL_NUMA)
    (x,) = load_paths([path, tmp_path / "numa.yaml"]).templates
    assert x.alignment == MISALIGNED and "NICs pinned to NUMA 1" in x.evidence[0]


def test_distributed_training_templates(fix: Path) -> None:
    t = load_paths([_d(fix) / "distributed_training__resource-claim-template.yaml"])
    a, u = t.templates
    assert (a.name, u.name) == ("h100-4gpu-4nic-numa-aligned", "h100-4gpu-4nic-numa-unaligned")
    assert a.requests[0]["pciBusIDs"] == ["0001:00:00.0", "0002:00:00.0", "0003:00:00.0", "0008:00:00.0"]
    assert (a.requests[1]["numaNode"], u.requests[1]["numaNode"]) == (0, 1)


def test_demo_nvidia_dranet_claims(fix: Path) -> None:
    t = load_paths(
        [
            _d(fix) / "demo_nvidia_dranet__resourceclaims.yaml",
            _d(fix) / "demo_nvidia_dranet__deviceclass.yaml",
        ]
    )
    (x,) = t.templates
    assert x.name == "2-gpu-nic-aligned" and x.alignment == ALIGNED
    # The documented pitfall: matchAttribute without `requests` and count 2.
    assert any("without `requests`" in e for e in x.evidence)


def test_demo_nvidia_dranet_deviceclass(fix: Path) -> None:
    t = load_paths([_d(fix) / "demo_nvidia_dranet__deviceclass.yaml"])
    assert t.nodes == {} and not t.templates


def test_demo_gke_multinetwork(fix: Path) -> None:
    t = load_paths(
        [
            _d(fix) / "demo_gke_multinetwork__resourceclaimtemplate.yaml",
            _d(fix) / "demo_gke_multinetwork__deviceclass.yaml",
        ]
    )
    (x,) = t.templates
    assert (
        x.name == "phy-interfaces-template"
        and x.requests[0]["kind"] == "nic"
        and x.alignment == NOT_APPLICABLE
    )
    assert any("Deployment" in w for w in t.warnings)  # read, reported as not used


def test_demo_gke_multinetwork_deviceclass(fix: Path) -> None:
    t = load_paths([_d(fix) / "demo_gke_multinetwork__deviceclass.yaml"])
    assert t.nodes == {}


# -- GKE ------------------------------------------------------------------------------------------
def _g(fix: Path) -> Path:
    return fix / "gke"


def test_gke_a4_claim_status(fix: Path) -> None:
    t = load_paths([_g(fix) / "dranet-doc__gke-a4-b200__resourceclaim-status.yaml"])  # a v1 List without kind
    (a,) = t.allocations
    assert a.pods == ("nccl-gib-test-0",) and a.node == GKE_NODE
    assert a.nics == tuple(f"gpu{i}rdma0" for i in range(8))
    nics = t.nics_on(GKE_NODE)
    assert [n.rail for n in nics] == [f"rdma-{i}" for i in range(8)]  # rail from the GPU-named NIC
    assert all(n.rdma for n in nics)  # the request selects rdma == true
    assert t.pods_named("nccl-gib-test-0")[0].node == GKE_NODE


def test_gke_a4_nccl_devices(fix: Path) -> None:
    t = load_paths([_g(fix) / "dranet-doc__gke-a4-b200__nccl-devices.txt"])
    gpus = t.gpus_on("nccl-gib-test-0")
    assert [g.pci_bus_id for g in gpus] == [
        "0000:8f:00.0",
        "0000:90:00.0",
        "0000:96:00.0",
        "0000:97:00.0",
        "0000:c4:00.0",
        "0000:c5:00.0",
        "0000:cb:00.0",
        "0000:cc:00.0",
    ]
    assert gpus[0].product == "NVIDIA B200"
    assert any("not a known pod or node" in w for w in t.warnings)


def test_gke_a4_claim_and_nccl_pair_by_name(fix: Path) -> None:
    t = load_paths(
        [
            _g(fix) / "dranet-doc__gke-a4-b200__resourceclaim-status.yaml",
            _g(fix) / "dranet-doc__gke-a4-b200__nccl-devices.txt",
        ]
    )
    # The nccl host is the pod; its GPUs land on the pod's node and pair with gpu{i}rdma0 by name.
    assert len(t.gpus_on(GKE_NODE)) == 8
    for i in range(8):
        p = t.pairing(GKE_NODE, f"gpu-{i}")
        assert (p.method, p.nics) == ("name", (f"gpu{i}rdma0",))
    # The bus ids come in adjacent pairs: two GPUs per PCIe switch.
    buses = [int(g.pci_bus_id.split(":")[1], 16) for g in t.gpus_on(GKE_NODE)]
    assert all(buses[i + 1] - buses[i] == 1 for i in range(0, 8, 2))


def test_gke_a4_grep_fragment_is_reported_not_guessed(fix: Path) -> None:
    t = load_paths([_g(fix) / "dranet-doc__gke-a4__resourceslice-grep-rdma.txt"])
    assert t.nodes == {} and t.nics == ()
    assert any("not a recognised topology input" in w for w in t.warnings)


def test_gke_a4x_network_crds_helm(fix: Path) -> None:
    t = load_paths([_g(fix) / "aicr__gke-network-crds-gb200.helm.yaml"])
    assert dict(t.networks) == {"gvnic-1": "NetDevice", "rdma-0": "RDMA"}


def test_gke_a4xmax_all_mrdma(fix: Path) -> None:
    t = load_paths([_g(fix) / "aicr-doc__a4x-max__computedomain-and-all-mrdma.yaml"])
    assert t.compute_domains == ("a4x-max-compute-domain",)
    (x,) = t.templates
    assert x.name == "all-mrdma" and x.requests[0]["count"] == 8 and x.requests[0]["kind"] == "nic"


def test_gke_a4xmax_claim_by_ifname_prefix(fix: Path) -> None:
    t = load_paths([_g(fix) / "vcave-llm-d__a4xmax__gke-rdma-claim-gb300.yaml"])
    (x,) = t.templates
    assert [r["ifNamePrefix"] for r in x.requests] == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert all(r["count"] == 2 for r in x.requests)  # two logical NICs per physical gpuN


def test_gke_rdma_template(fix: Path) -> None:
    (x,) = load_paths([_g(fix) / "llm-d-doc__gke-rdma-template.yaml"]).templates
    assert x.alignment == ALIGNED and {r["deviceClassName"] for r in x.requests} == {
        "gpu.nvidia.com",
        "mrdma.google.com",
    }


def test_gke_dynamo_per_rank_constraints(fix: Path) -> None:
    (x,) = load_paths([_g(fix) / "dynamo-pr13596__gke-a4__prefill-rct.excerpt.yaml"]).templates
    assert x.alignment == ALIGNED
    assert "gpu-0+rdma-0, gpu-1+rdma-1" in x.evidence[0] and "gpu-0+rdma-1" not in x.evidence[0]


def test_gke_ucx_env_excerpt_is_not_topology(fix: Path) -> None:
    t = load_paths([_g(fix) / "llm-d__a4x-a4xmax__ucx-env.excerpt.yaml"])
    assert t.nodes == {} and any("without `kind`" in w for w in t.warnings)


def test_gke_topology_label_keys_are_all_read(fix: Path) -> None:
    import re

    from railtrace.topology import k8s_keys

    text = (_g(fix) / "llm-d-doc__gke-topology-label-keys.md").read_text()
    keys = set(re.findall(r"`([a-z0-9.\-]+/[a-zA-Z0-9.\-]+)`", text)) | set(
        re.findall(r'"([a-z0-9.\-]+/[a-z\-.]+)"', text)
    )
    known = set(
        k8s_keys.ZONE_LABELS
        + k8s_keys.BLOCK_LABELS
        + k8s_keys.SUBBLOCK_LABELS
        + k8s_keys.HOST_LABELS
        + k8s_keys.NVLINK_LABELS
    ) | {"kubernetes.io/hostname", "cloud.google.com/gke-nodepool"}
    assert keys and keys <= known, keys - known
    t = load_paths([_g(fix) / "llm-d-doc__gke-topology-label-keys.md"])  # documentation: skipped, said so
    assert any("not a recognised" in w for w in t.warnings)


# -- NVIDIA DRA demos ----------------------------------------------------------------------------
def test_nvidia_gpu_test1(fix: Path) -> None:
    t = load_paths([fix / "nvidia-dra" / "quickstart__v1__gpu-test1.yaml"])
    assert sorted(p.name for p in t.pods.values()) == ["pod1", "pod2"]
    assert all(p.namespace == "gpu-test1" and p.node is None for p in t.pods.values())
    assert _template(t, "single-gpu").alignment == NOT_APPLICABLE


def test_nvidia_gpu_test4_mig(fix: Path) -> None:
    t = load_paths([fix / "nvidia-dra" / "quickstart__v1__gpu-test4.yaml"])
    x = _template(t, "mig-devices")
    assert [r["request"] for r in x.requests] == [
        "mig-1g-5gb-0",
        "mig-1g-5gb-1",
        "mig-2g-10gb",
        "mig-3g-20gb",
    ]
    assert x.constraints[0]["matchAttribute"] == "gpu.nvidia.com/parentUUID"
    assert x.alignment == NOT_APPLICABLE


def test_nvidia_imex_channel(fix: Path) -> None:
    t = load_paths([fix / "nvidia-dra" / "imex__channel-injection.yaml"])
    assert t.compute_domains == ("imex-channel-injection",)
    assert [p.name for p in t.pods.values()] == ["imex-channel-injection"]


# -- nvidia-smi topo -m -------------------------------------------------------------------------
def test_h100_topo_matrix_pix_pairs(fix: Path) -> None:
    t = load_paths([fix / "nvidia-smi-topo" / "h100-8gpu-8nic__sglang-issue-30401.txt"])
    (node,) = t.nodes
    for i in range(8):
        p = t.pairing(node, f"gpu-{i}")
        assert (p.method, p.nics) == ("topo:PIX", (f"mlx5_{i}",))
    assert [g.numa for g in t.gpus_on(node)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [n.numa for n in t.nics_on(node)] == [0, 0, 0, 0, 1, 1, 1, 1]  # NODE to a GPU of that NUMA
    assert any("node name taken from the file name" in w for w in t.warnings)


# -- The whole folder ------------------------------------------------------------------------------
def test_every_fixture_file_loads_together(fix: Path) -> None:
    t = load_paths([fix])
    assert {AWS_NODE, AZ_NODE, OCI_NODE, GKE_NODE} <= set(t.nodes)
    assert {a.alignment for a in t.allocations} == {ALIGNED, MISALIGNED, NOT_APPLICABLE}
    assert len(t.templates) >= 20
