"""The offline audit (topology files only) on the DRA objects of real published clusters.

What it shows: each obligation judged from real claims, slices and templates is `ok` or
`broken` for the reason an operator would give, names the objects and attributes, and the two
traffic obligations are never `ok` without traffic.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from railtrace.contract import audit
from railtrace.contract.report import BROKEN, OK, UNKNOWN
from railtrace.topology import load_paths
from tests.contract.paths import DRANET, HERE

AZURE_GB300 = [
    DRANET / "azure_aks_examples__gb300__resource-claim.yaml",
    DRANET / "azure_aks_examples__gb300__resourceslice-dranet.yaml",
    DRANET / "azure_aks_examples__gb300__resourceslice-gpu.yaml",
]
AWS_P4D = [
    DRANET / "aws_eks_examples__gpu-efa__resource-claim.yaml",
    DRANET / "aws_eks_examples__gpu-efa__resourceslice-dranet.yaml",
    DRANET / "aws_eks_examples__gpu-efa__resourceslice-gpu.yaml",
]
NIXL_ALIGNED = DRANET / "nixl-kv-transfer__resource-claim-template-aligned.yaml"
NIXL_UNALIGNED = DRANET / "nixl-kv-transfer__resource-claim-template-unaligned.yaml"


def _report(paths: list[Path]):
    return audit(load_paths([str(p) for p in paths]))


def _subject(report, name: str):
    return next(s for s in report.subjects if s.name == name)


def test_azure_gb300_misaligned_claim_breaks_preserved_and_names_both_devices() -> None:
    report = _report(AZURE_GB300)
    pod = _subject(report, "nccl-test-dra-worker-0")
    preserved = pod.obligations["preserved"]
    assert preserved.status == BROKEN
    text = " ".join(e.message for e in preserved.evidence)
    # Both devices of the unaligned pair, and the NIC the GPU should have had.
    assert "0008:06:00.0" in text and "mlx5_2" in text and "NUMA 1" in text
    assert "mlx5_0" in text
    assert preserved.evidence[0].object.startswith("claim/default/nccl-test-dra-worker-0-gpu-nic")
    assert report.fleet.obligations["preserved"]["status"] == BROKEN


def test_aws_p4d_claim_on_shared_pcie_root_preserves_pairing() -> None:
    report = _report(AWS_P4D)
    preserved = _subject(report, "nccl-test-dra-worker-0").obligations["preserved"]
    assert preserved.status == OK
    assert "pcieRoot" in preserved.evidence[0].message
    assert "gpu-6" in preserved.evidence[0].message and "rdmap160s27" in preserved.evidence[0].message


def test_offline_audit_never_calls_traffic_obligations_ok() -> None:
    report = _report(AWS_P4D)
    for subject in report.subjects:
        assert subject.obligations["verified"].status == UNKNOWN
        assert subject.obligations["consumed"].status == UNKNOWN
    assert report.mode == "offline"


def test_nixl_templates_judged_by_numa_with_the_tested_node() -> None:
    report = _report([NIXL_ALIGNED, NIXL_UNALIGNED, HERE / "nixl-kv-transfer-h100-node.yaml"])
    aligned = _subject(report, "h100-4gpu-4nic-numa-aligned").obligations["preserved"]
    unaligned = _subject(report, "h100-4gpu-4nic-numa-unaligned").obligations["preserved"]
    assert aligned.status == OK
    assert unaligned.status == BROKEN
    assert "NUMA 1" in unaligned.summary and "0001:00:00.0 NUMA 0" in unaligned.summary


def test_nixl_templates_alone_cannot_be_ok() -> None:
    """Without the GPUs' NUMA nodes the NIC NUMA pin proves nothing either way."""
    report = _report([NIXL_ALIGNED, NIXL_UNALIGNED])
    for name in ("h100-4gpu-4nic-numa-aligned", "h100-4gpu-4nic-numa-unaligned"):
        preserved = _subject(report, name).obligations["preserved"]
        assert preserved.status == UNKNOWN
        assert "NUMA" in preserved.summary


def test_aws_templates_with_and_without_pcie_root_constraint() -> None:
    report = _report([*AWS_P4D, DRANET / "aws_eks_examples__gpu-efa__resource-claim-template.yaml"])
    assert _subject(report, "gpu-efa-aligned").obligations["preserved"].status == OK
    assert _subject(report, "gpu-efa-unaligned").obligations["preserved"].status == BROKEN


def test_azure_gb300_templates_pinning_nics() -> None:
    report = _report([*AZURE_GB300, DRANET / "azure_aks_examples__gb300__resource-claim-template.yaml"])
    assert _subject(report, "1nic-aligned").obligations["preserved"].status == OK
    assert _subject(report, "1nic-unaligned").obligations["preserved"].status == BROKEN


def test_slice_without_pcie_root_or_numa_breaks_discovered(tmp_path: Path) -> None:
    """The real Azure GB300 NIC slice, with `dra.net/numaNode` removed from one VF NIC.

    Those VF NICs already publish no pcieRoot; without NUMA nothing can pair them.
    """
    doc = yaml.safe_load((DRANET / "azure_aks_examples__gb300__resourceslice-dranet.yaml").read_text())
    device = doc["spec"]["devices"][2]
    del device["attributes"]["dra.net/numaNode"]
    (tmp_path / "slice.yaml").write_text(yaml.safe_dump(doc))
    gpus = DRANET / "azure_aks_examples__gb300__resourceslice-gpu.yaml"
    report = _report([tmp_path / "slice.yaml", gpus])
    node = "aks-gpu-45139532-vmss000081"
    check = report.node_findings[node]
    assert check.status == BROKEN
    bad = next(e for e in check.evidence if e.object == f"nic/{node}/{device['name']}")
    assert "resource.kubernetes.io/pcieRoot" in bad.missing and "dra.net/numaNode" in bad.missing
    assert report.fleet.obligations["discovered"]["status"] == BROKEN


def test_untouched_slice_lists_only_missing_rail_and_unknown_node_labels() -> None:
    """The real GB300 slices pair (NUMA) but publish no rail; no Node object was given."""
    report = _report(AZURE_GB300)
    check = report.node_findings["aks-gpu-45139532-vmss000081"]
    nic_missing = {m for e in check.evidence if e.object.startswith("nic/") for m in e.missing}
    assert not any("pcieRoot" in m or "numaNode" in m for m in nic_missing)
    assert any("rail" in m for m in nic_missing)
    node_items = [e for e in check.evidence if e.object.startswith("node/")]
    assert node_items and "not among the inputs" in node_items[0].message
