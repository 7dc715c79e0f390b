"""Cluster objects built from the project's topology fixtures, served by the stand-in API server.

The ResourceSlices and ResourceClaims carry the devices, attributes and allocations that
kubernetes-sigs/dranet published as captured on an AWS p4d node and an Azure GB300 node
(tests/fixtures/topology/dranet/PROVENANCE.md). Their Nodes and Pods were not captured, so they are
written here with the names, namespaces and claim references the captured objects point to.
The GB300 claim is moved to namespace `gb300` so its pod does not clash with the AWS pod of the
same name (both upstream examples call their pod `nccl-test-dra-worker-0`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

TOPOLOGY = Path(__file__).resolve().parents[1] / "fixtures" / "topology"

AWS_NODE = "ip-192-168-153-160.ec2.internal"
AZURE_NODE = "aks-gpu-45139532-vmss000081"
POD = "nccl-test-dra-worker-0"


def _load(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        if doc.get("kind") == "List" or (doc.get("kind") is None and "items" in doc):
            out.extend(doc["items"])
        else:
            out.append(doc)
    return out


def _fixture(name: str) -> list[dict[str, Any]]:
    return _load(TOPOLOGY / "dranet" / name)


def _node(name: str, labels: dict[str, str], address: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "status": {"addresses": [{"type": "InternalIP", "address": address}]},
    }


def _pod(namespace: str, claim_name: str, pod_claim: str, node: str, ip: str, role: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": POD,
            "namespace": namespace,
            "labels": {"llm-d.ai/role": role, "llm-d.ai/inference-serving": "true"},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "vllm", "image": "vllm/vllm-openai", "resources": {"claims": [{"name": pod_claim}]}}
            ],
            "resourceClaims": [{"name": pod_claim, "resourceClaimTemplateName": f"{pod_claim}-template"}],
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": ip,
            "resourceClaimStatuses": [{"name": pod_claim, "resourceClaimName": claim_name}],
        },
    }


def aws_objects() -> list[dict[str, Any]]:
    """One p4d node: 8 A100 + 4 EFA, a claim pairing gpu-6 with an EFA, and the pod holding it."""
    slices = _fixture("aws_eks_examples__gpu-efa__resourceslice-gpu.yaml") + _fixture(
        "aws_eks_examples__gpu-efa__resourceslice-dranet.yaml"
    )
    (claim,) = _fixture("aws_eks_examples__gpu-efa__resource-claim.yaml")
    node = _node(AWS_NODE, {"topology.k8s.aws/network-node-layer-1": "nn-1"}, "192.168.153.160")
    pod = _pod("default", claim["metadata"]["name"], "gpu-efa", AWS_NODE, "192.168.155.224", "prefill")
    return [node, *slices, claim, pod]


def azure_objects() -> list[dict[str, Any]]:
    """One GB300 node, the deliberately unaligned GPU/NIC claim, and its pod (namespace gb300)."""
    slices = _fixture("azure_aks_examples__gb300__resourceslice-gpu.yaml") + _fixture(
        "azure_aks_examples__gb300__resourceslice-dranet.yaml"
    )
    (claim,) = _fixture("azure_aks_examples__gb300__resource-claim.yaml")
    claim = copy.deepcopy(claim)
    claim["metadata"]["namespace"] = "gb300"
    node = _node(AZURE_NODE, {}, "10.0.0.81")
    pod = _pod("gb300", claim["metadata"]["name"], "gpu-nic", AZURE_NODE, "10.0.0.81", "decode")
    return [node, *slices, claim, pod]
