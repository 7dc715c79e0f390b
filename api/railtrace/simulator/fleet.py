"""The modelled P/D fleet: GPU machines, their PCIe/NIC layout, pods and DRA allocations.

The fleet is written out as the Kubernetes objects a real GKE cluster would show (Nodes,
Pods, ResourceSlices, ResourceClaims) so that the demo builds its topology through the same
loaders as production. Ground truth (which scenario a pod serves, which NIC it really uses)
stays in these Python objects; the correlator only ever sees the written objects and spans.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from railtrace.topology import k8s_keys as K

NAMESPACE = "llm-d"
ZONE = "us-central1-b"
REGION = "us-central1"
MODEL_NAME = "meta-llama/Llama-3.3-70B-Instruct"
VLLM_PORT = 8000
SIDECAR_PORT = 8200
GPU_DRIVER = K.NVIDIA_GPU_DRIVER
NIC_DRIVER = K.DRANET_DRIVER
PCIE_ROOT = K.PCIE_ROOT
PCI_BUS_ID = K.PCI_BUS_ID


@dataclass(frozen=True, slots=True)
class Shape:
    """A GPU machine type as GKE sells it (reference: topology-and-transport.md §1.1)."""

    name: str
    machine_type: str
    accelerator: str  # cloud.google.com/gke-accelerator value
    product: str  # gpu.nvidia.com productName
    architecture: str
    compute_capability: str
    gpu_memory: str
    arch: str  # kubernetes.io/arch
    gpus: int
    nics: int
    nic_naming: str  # "pci": dranet pci-<dom>-<bus>-<dev>-<fn>; "gpu": GKE gpu{i}rdma0
    pcie_pairing: bool  # False on Grace: GPU and NIC roots never match, pair by NUMA
    nvlink_scope: str  # "host" (NVSwitch inside the node) or "subblock" (NVL72 clique)
    nodes_per_subblock: int
    gpu_bus: tuple[str, ...]  # PCI bus numbers of the GPUs


SHAPES: dict[str, Shape] = {
    "a3-ultra": Shape(
        "a3-ultra",
        "a3-ultragpu-8g",
        "nvidia-h200-141gb",
        "NVIDIA H200",
        "Hopper",
        "9.0.0",
        "141Gi",
        "amd64",
        8,
        8,
        "pci",
        True,
        "host",
        2,
        ("0c", "1d", "2e", "3f", "8c", "9d", "ae", "bf"),
    ),
    "a4": Shape(
        "a4",
        "a4-highgpu-8g",
        "nvidia-b200",
        "NVIDIA B200",
        "Blackwell",
        "10.0.0",
        "180Gi",
        "amd64",
        8,
        8,
        "gpu",
        True,
        "host",
        2,
        ("8f", "90", "96", "97", "c4", "c5", "cb", "cc"),  # bus ids published for GKE A4
    ),
    "a4x": Shape(
        "a4x",
        "a4x-highgpu-4g",
        "nvidia-gb200",
        "NVIDIA GB200",
        "Blackwell",
        "10.0.0",
        "186Gi",
        "arm64",
        4,
        4,
        "pci",  # dranet pci-* names: no name hint, so pairing falls back to NUMA
        False,
        "subblock",
        4,
        ("01", "01", "01", "01"),  # Grace: one GPU per domain pci0008..pci0019
    ),
}


@dataclass(slots=True)
class GPU:
    index: int
    name: str  # gpu.nvidia.com device name, gpu-<i>
    uuid: str
    pci_bus_id: str
    pcie_root: str
    numa: int


@dataclass(slots=True)
class NIC:
    name: str  # dra.net device name
    rdma_device: str  # mlx5_N (what UCX logs show)
    if_name: str
    pci_address: str
    pcie_root: str
    numa: int
    rail: int  # the rail switch this NIC is cabled to
    ipv4: str
    gpu_index: int  # the GPU sharing its PCIe root (or NUMA pair)


@dataclass(slots=True)
class Node:
    name: str
    block: str
    subblock: str
    host: str
    clique: str | None
    address: str
    gpus: list[GPU]
    nics: list[NIC]  # in slice order, which is not GPU order
    block_index: int
    subblock_index: int

    def paired_nic(self, gpu_index: int) -> NIC:
        return next(n for n in self.nics if n.gpu_index == gpu_index)


@dataclass(slots=True)
class Pod:
    """One vLLM model-server pod (prefill or decode) with one GPU and its allocated NICs."""

    name: str
    role: str  # prefill | decode
    scenario: str
    node: Node
    gpu: GPU
    nics: list[NIC]  # allocated NICs, first is the one UCX is pinned to
    ip: str
    uid: str
    claim_name: str
    aligned: bool
    sidecar_version: str = "current"  # decode pods run the P/D sidecar
    rdma_ok: bool = True  # False: UCX cannot open the verbs devices and falls back to TCP
    engine_id: str = ""

    @property
    def endpoint(self) -> str:
        return f"{self.ip}:{VLLM_PORT}"

    @property
    def nic(self) -> NIC:
        return self.nics[0]

    @property
    def topology_key(self) -> str:
        n = self.node
        return f"{ZONE}/{n.block}/{n.subblock}/{n.host}"


@dataclass(slots=True)
class Fleet:
    shape: Shape
    nodes: list[Node]
    pods: list[Pod] = field(default_factory=list)

    def pods_of(self, scenario: str, role: str) -> list[Pod]:
        return [p for p in self.pods if p.scenario == scenario and p.role == role]

    def pod_by_name(self, name: str) -> Pod:
        return next(p for p in self.pods if p.name == name)

    # -- Kubernetes objects ----------------------------------------------------------------

    def k8s_objects(self) -> list[dict[str, Any]]:
        objs: list[dict[str, Any]] = []
        for node in self.nodes:
            objs.append(_node_obj(self.shape, node))
            objs.append(_gpu_slice(self.shape, node))
            objs.append(_nic_slice(self.shape, node))
        for pod in self.pods:
            objs.append(_pod_obj(self.shape, pod))
            objs.append(_claim_obj(self.shape, pod))
        return objs

    def write(self, folder: str | Path) -> list[Path]:
        """Write the objects as `kubectl get -o yaml` would: one List file per kind."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for obj in self.k8s_objects():
            by_kind.setdefault(obj["kind"], []).append(obj)
        paths = []
        for kind, items in by_kind.items():
            path = out / f"{kind.lower()}s.yaml"
            doc = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
            paths.append(path)
        path = out / "railtrace-topology.yaml"
        path.write_text(yaml.safe_dump(railtrace_doc(self), sort_keys=False))
        paths.append(path)
        return paths


# ---------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------


def _hex(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def _uuid(rng: random.Random) -> str:
    h = _hex(rng, 32)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _nic_numbers(shape: Shape, variant: int) -> list[int]:
    """mlx5_N per GPU index. Real hosts number NICs non-contiguously or in reverse."""
    n = shape.nics
    if n == 8 and variant == 1:
        return [0, 3, 4, 5, 6, 7, 8, 9]  # a management NIC took mlx5_1/mlx5_2
    if variant == 2:
        return [n - i for i in range(n)]  # reversed rails: GPU0 <-> mlx5_8 ... GPU7 <-> mlx5_1
    return list(range(n))


def build_nodes(
    shape: Shape, rng: random.Random, blocks: int = 2, subblocks_per_block: int = 2
) -> list[Node]:
    nodes: list[Node] = []
    pool_id = _hex(rng, 8)
    cluster_uuid = _uuid(rng)
    half = shape.gpus // 2
    for b in range(blocks):
        block = _hex(rng, 32)
        for s in range(subblocks_per_block):
            subblock = _hex(rng, 32)
            clique = (
                f"{cluster_uuid}.{b * subblocks_per_block + s}" if shape.nvlink_scope == "subblock" else None
            )
            for _ in range(shape.nodes_per_subblock):
                idx = len(nodes)
                name = f"gke-railtrace-{shape.name}-pool-{pool_id}-{_hex(rng, 4)}"
                gpus: list[GPU] = []
                nics: list[NIC] = []
                numbers = _nic_numbers(shape, idx % 3)
                for g in range(shape.gpus):
                    numa = 0 if g < half else 1
                    if shape.pcie_pairing:
                        bus = shape.gpu_bus[g]
                        gpu_root = f"pci0000:{bus}"
                        gpu_bdf = f"0000:{bus}:00.0"
                        nic_bus = f"{int(bus, 16) + 1:02x}"
                        nic_root = gpu_root  # same root complex, one switch per GPU/NIC pair
                    else:
                        dom = ("0008", "0009", "0018", "0019")[g]
                        gpu_root = f"pci{dom}:00"
                        gpu_bdf = f"{dom}:01:00.0"
                        nic_bus = f"{0x03 + 0x10 * g:02x}"
                        nic_root = f"pci0000:{nic_bus}"  # Grace: never equal to the GPU's root
                    gpus.append(GPU(g, f"gpu-{g}", f"GPU-{_uuid(rng)}", gpu_bdf, gpu_root, numa))
                    nic_addr = f"0000:{nic_bus}:00.0"
                    dev = f"pci-0000-{nic_bus}-00-0" if shape.nic_naming == "pci" else f"gpu{g}rdma0"
                    if_name = f"eth{g + 1}" if shape.nic_naming == "pci" else f"gpu{g}rdma0"
                    nics.append(
                        NIC(
                            dev,
                            f"mlx5_{numbers[g]}",
                            if_name,
                            nic_addr,
                            nic_root,
                            numa,
                            g,
                            f"192.168.{g}.{idx + 10}/32",
                            g,
                        )
                    )
                rng.shuffle(nics)  # slices list devices in PCI/inventory order, not GPU order
                nodes.append(
                    Node(
                        name, block, subblock, _hex(rng, 32), clique, f"10.128.0.{idx + 10}", gpus, nics, b, s
                    )
                )
    return nodes


def pod_uid(name: str) -> str:
    h = hashlib.sha1(name.encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _slots(shape: Shape, scenarios: list[Any]) -> dict[str, tuple[int, int, int | None, int | None]]:
    """Per scenario: (node pair, GPU index, unconstrained NIC's GPU, second-rail NIC's GPU).

    Scenarios whose pods use a NIC of another GPU get a slot whose node pair has a free
    GPU on the other NUMA node, so that no NIC is ever allocated twice (as DRA guarantees).
    """
    slots = [divmod(i, shape.gpus) for i in range(len(scenarios))]
    numa = [0 if g < shape.gpus // 2 else 1 for g in range(shape.gpus)]
    free = {p: [g for g in range(shape.gpus) if (p, g) not in slots] for p, _ in slots}
    out: dict[str, tuple[int, int, int | None, int | None]] = {}
    special = [s for s in scenarios if not s.aligned or s.second_rail]
    for sc in special:
        for slot in slots:
            p, g = slot
            remote = [f for f in free[p] if numa[f] != numa[g]]
            if remote:
                slots.remove(slot)
                free[p].remove(remote[-1])
                borrowed = remote[-1]
                out[sc.name] = (p, g, None if sc.aligned else borrowed, borrowed if sc.second_rail else None)
                break
        else:
            raise ValueError(f"no free NIC for scenario {sc.name} on shape {shape.name}")
    for sc in scenarios:
        if sc.name not in out:
            p, g = slots.pop(0)
            out[sc.name] = (p, g, None, None)
    return out


def place_pods(fleet: Fleet, scenarios: Iterable[Any], rng: random.Random) -> None:
    """One prefill and one decode pod per scenario in every subblock, on the same GPU index
    (hence the same rail) of two different nodes, so every pool can pair near or far."""
    shape = fleet.shape
    scenarios = list(scenarios)
    slots = _slots(shape, scenarios)
    subblocks: dict[tuple[int, int], list[Node]] = {}
    for node in fleet.nodes:
        subblocks.setdefault((node.block_index, node.subblock_index), []).append(node)
    ip_next: dict[str, int] = {}
    for scenario in scenarios:
        pair, gpu_index, wrong_nic, second_nic = slots[scenario.name]
        for (b, sb), nodes in sorted(subblocks.items()):
            if 2 * pair + 1 >= len(nodes):
                raise ValueError(f"too many scenarios for shape {shape.name}")
            for role, node in (("prefill", nodes[2 * pair]), ("decode", nodes[2 * pair + 1])):
                gpu = node.gpus[gpu_index]
                # Unconstrained allocation hands out a free NIC on the other NUMA node.
                nics = [node.paired_nic(gpu_index if wrong_nic is None else wrong_nic)]
                if second_nic is not None:
                    nics.append(node.paired_nic(second_nic))
                name = f"{scenario.short}-{role}-{b}{sb}-{_hex(rng, 5)}"
                k = ip_next.get(node.name, 2)
                ip_next[node.name] = k + 1
                ip = f"10.{64 + node.block_index}.{fleet.nodes.index(node)}.{k}"
                rdma_ok = not (scenario.tcp_nodes and role == "decode" and (b + sb) % 2 == 1)
                fleet.pods.append(
                    Pod(
                        name=name,
                        role=role,
                        scenario=scenario.name,
                        node=node,
                        gpu=gpu,
                        nics=nics,
                        ip=ip,
                        uid=pod_uid(name),
                        claim_name=f"{name}-gpu-nic-{_hex(rng, 5)}",
                        aligned=wrong_nic is None,
                        sidecar_version=scenario.sidecar,
                        rdma_ok=rdma_ok,
                        engine_id=_uuid(rng),
                    )
                )


def build_fleet(shape_name: str, scenarios: Iterable[Any], seed: int) -> Fleet:
    try:
        shape = SHAPES[shape_name]
    except KeyError:
        raise ValueError(f"unknown shape {shape_name!r}; choose one of {', '.join(SHAPES)}") from None
    rng = random.Random(f"fleet-{seed}-{shape_name}")
    fleet = Fleet(shape, build_nodes(shape, rng))
    place_pods(fleet, list(scenarios), rng)
    return fleet


# ---------------------------------------------------------------------------------------
# Object writers
# ---------------------------------------------------------------------------------------


def _node_obj(shape: Shape, node: Node) -> dict[str, Any]:
    labels = {
        K.BETA_ARCH_LABEL: shape.arch,
        K.ARCH_LABEL: shape.arch,
        K.HOSTNAME_LABEL: node.name,
        K.OS_LABEL: "linux",
        K.INSTANCE_TYPE_LABEL: shape.machine_type,
        K.REGION_LABEL: REGION,
        K.ZONE_LABEL: ZONE,
        K.GKE_MACHINE_FAMILY_LABEL: shape.machine_type.split("-")[0],
        K.GKE_NODEPOOL_LABEL: f"{shape.name}-pool",
        K.GKE_ACCELERATOR_LABEL: shape.accelerator,
        K.GKE_NETWORKING_DRA_LABEL: "true",
        K.GKE_ACCELERATOR_NETWORK_PROFILE_LABEL: "auto",
        K.GCE_BLOCK_LABEL: node.block,
        K.GCE_SUBBLOCK_LABEL: node.subblock,
        K.GCE_HOST_LABEL: node.host,
        K.NVIDIA_GPU_PRESENT_LABEL: "true",
        K.NVIDIA_GPU_PRODUCT_LABEL: shape.product.replace(" ", "-"),
        K.NVIDIA_GPU_COUNT_LABEL: str(shape.gpus),
    }
    if node.clique:
        labels[K.NVIDIA_CLIQUE_LABEL] = node.clique
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels},
        "spec": {"providerID": f"gce://railtrace-demo/{ZONE}/{node.name}"},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": node.address},
                {"type": "Hostname", "address": node.name},
            ],
            "nodeInfo": {"architecture": shape.arch, "operatingSystem": "linux"},
        },
    }


def _owner(node: Node) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "controller": True, "kind": "Node", "name": node.name, "uid": pod_uid(node.name)}
    ]


def _gpu_slice(shape: Shape, node: Node) -> dict[str, Any]:
    devices = []
    for g in node.gpus:
        devices.append(
            {
                "name": g.name,
                "attributes": {
                    "type": {"string": "gpu"},
                    "uuid": {"string": g.uuid},
                    "productName": {"string": shape.product},
                    "brand": {"string": "Nvidia"},
                    "architecture": {"string": shape.architecture},
                    "cudaComputeCapability": {"version": shape.compute_capability},
                    "driverVersion": {"version": "580.126.9"},
                    "cudaDriverVersion": {"version": "13.0.0"},
                    "addressingMode": {"string": "ATS" if not shape.pcie_pairing else "None"},
                    PCI_BUS_ID: {"string": g.pci_bus_id},
                    PCIE_ROOT: {"string": g.pcie_root},
                },
                "capacity": {"memory": {"value": shape.gpu_memory}},
            }
        )
    return _slice(node, GPU_DRIVER, devices)


def _nic_slice(shape: Shape, node: Node) -> dict[str, Any]:
    devices = []
    for n in node.nics:
        attrs: dict[str, Any] = {
            K.DRANET_IF_NAME: {"string": n.if_name},
            K.DRANET_PCI_ADDRESS: {"string": n.pci_address},
            K.DRANET_PCI_VENDOR: {"string": "Mellanox Technologies"},
            K.DRANET_PCI_DEVICE: {"string": "MT2910 Family [ConnectX-7]"},
            K.DRANET_NUMA_NODE: {"int": n.numa},
            K.DRANET_MTU: {"int": 8896},
            K.DRANET_RDMA: {"bool": True},
            K.DRANET_RDMA_DEVICE: {"string": n.rdma_device},
            K.DRANET_IPV4: {"string": n.ipv4},
            K.DRANET_STATE: {"string": "up"},
            K.DRANET_TYPE: {"string": "device"},
            K.DRANET_VIRTUAL: {"bool": False},
            K.GCE_NETWORK_NAME: {"string": f"railtrace-rdma-sub-{n.rail}"},
            K.GCE_BLOCK: {"string": node.block},
            K.GCE_SUBBLOCK: {"string": node.subblock},
            K.GCE_HOST: {"string": node.host},
            K.GCE_MACHINE_TYPE: {"string": shape.machine_type},
            PCIE_ROOT: {"string": n.pcie_root},
        }
        devices.append({"name": n.name, "attributes": attrs})
    # The gVNIC: the path UCX takes when it cannot open the RDMA devices.
    devices.append(
        {
            "name": "pci-0000-00-04-0" if shape.nic_naming == "pci" else "eth0",
            "attributes": {
                K.DRANET_IF_NAME: {"string": "eth0"},
                K.DRANET_PCI_ADDRESS: {"string": "0000:00:04.0"},
                K.DRANET_PCI_DEVICE: {"string": "Compute Engine Virtual Ethernet [gVNIC]"},
                K.DRANET_NUMA_NODE: {"int": 0},
                K.DRANET_MTU: {"int": 8896},
                K.DRANET_RDMA: {"bool": False},
                K.DRANET_IPV4: {"string": f"{node.address}/32"},
                K.DRANET_STATE: {"string": "up"},
                K.DRANET_TYPE: {"string": "device"},
                K.DRANET_VIRTUAL: {"bool": False},
                PCIE_ROOT: {"string": "pci0000:00"},
            },
        }
    )
    return _slice(node, NIC_DRIVER, devices)


def _slice(node: Node, driver: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    suffix = hashlib.sha1(f"{node.name}{driver}".encode()).hexdigest()[:5]
    return {
        "apiVersion": f"{K.RESOURCE_GROUP}/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": f"{node.name}-{driver.replace('.', '-')}-{suffix}",
            "generateName": f"{node.name}-{driver}-",
            "ownerReferences": _owner(node),
        },
        "spec": {
            "driver": driver,
            "nodeName": node.name,
            "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _pod_obj(shape: Shape, pod: Pod) -> dict[str, Any]:
    containers: list[dict[str, Any]] = [
        {
            "name": "vllm",
            "image": "ghcr.io/llm-d/llm-d-cuda:v0.4.0",
            "command": ["vllm", "serve", MODEL_NAME],
            "ports": [{"containerPort": VLLM_PORT, "name": "http"}],
            "env": [
                {"name": "OTEL_SERVICE_NAME", "value": f"vllm-{pod.role}"},
                {"name": "UCX_NET_DEVICES", "value": ",".join(f"{n.rdma_device}:1" for n in pod.nics)},
            ],
            "resources": {"claims": [{"name": "gpu-nic"}]},
        }
    ]
    if pod.role == "decode":
        containers.insert(
            0,
            {
                "name": "routing-proxy",
                "image": f"ghcr.io/llm-d/llm-d-routing-sidecar:{pod.sidecar_version}",
                "ports": [{"containerPort": SIDECAR_PORT, "name": "sidecar"}],
            },
        )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": NAMESPACE,
            "uid": pod.uid,
            "labels": {
                K.ROLE_LABEL: pod.role,
                K.INFERENCE_SERVING_LABEL: "true",
                K.APP_NAME_LABEL: f"{pod.scenario}-{pod.role}",
            },
        },
        "spec": {
            "nodeName": pod.node.name,
            "containers": containers,
            "resourceClaims": [{"name": "gpu-nic", "resourceClaimName": pod.claim_name}],
        },
        "status": {
            "phase": "Running",
            "hostIP": pod.node.address,
            "podIP": pod.ip,
            "podIPs": [{"ip": pod.ip}],
            "resourceClaimStatuses": [{"name": "gpu-nic", "resourceClaimName": pod.claim_name}],
        },
    }


def _claim_obj(shape: Shape, pod: Pod) -> dict[str, Any]:
    requests: list[dict[str, Any]] = [
        {"name": "gpu", "exactly": {"deviceClassName": K.NVIDIA_GPU_DRIVER, "count": 1}},
        {"name": "nic", "exactly": {"deviceClassName": K.GKE_RDMA_DRIVER, "count": 1}},
    ]
    constraints: list[dict[str, Any]] = []
    if pod.aligned:
        if shape.pcie_pairing:
            constraints.append({"requests": ["gpu", "nic"], "matchAttribute": PCIE_ROOT})
        else:
            requests[1]["exactly"]["selectors"] = [
                {"cel": {"expression": f'device.attributes["{K.DRANET_DRIVER}"].numaNode == {pod.gpu.numa}'}}
            ]
    results = [
        {
            "request": "gpu",
            "driver": GPU_DRIVER,
            "pool": pod.node.name,
            "device": pod.gpu.name,
            "adminAccess": None,
        },
        {
            "request": "nic",
            "driver": NIC_DRIVER,
            "pool": pod.node.name,
            "device": pod.nics[0].name,
            "adminAccess": None,
        },
    ]
    if len(pod.nics) > 1:
        requests.append({"name": "nic-extra", "exactly": {"deviceClassName": K.GKE_RDMA_DRIVER, "count": 1}})
        results.append(
            {
                "request": "nic-extra",
                "driver": NIC_DRIVER,
                "pool": pod.node.name,
                "device": pod.nics[1].name,
                "adminAccess": None,
            }
        )
    return {
        "apiVersion": f"{K.RESOURCE_GROUP}/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": pod.claim_name,
            "namespace": NAMESPACE,
            "annotations": {K.POD_CLAIM_ANNOTATION: "gpu-nic"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "blockOwnerDeletion": True,
                    "controller": True,
                    "kind": "Pod",
                    "name": pod.name,
                    "uid": pod.uid,
                }
            ],
        },
        "spec": {"devices": {"requests": requests, "constraints": constraints}},
        "status": {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [pod.node.name]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": pod.name, "uid": pod.uid}],
        },
    }


def engine_entries(fleet: Fleet) -> list[dict[str, Any]]:
    """Each pod's address, role and vLLM engine id, as railtrace's topology YAML lists them."""
    return [
        {
            "name": p.name,
            "namespace": NAMESPACE,
            "node": p.node.name,
            "ip": p.ip,
            "port": VLLM_PORT,
            "role": p.role,
            "engineId": p.engine_id,
        }
        for p in fleet.pods
    ]


def railtrace_doc(fleet: Fleet) -> dict[str, Any]:
    """railtrace's own topology YAML (docs/topology.md) for what the cluster does not publish:
    GPU NUMA nodes (the NVIDIA DRA driver has no NUMA attribute for full GPUs) and the vLLM
    engine id of each pod (what KV spans name as `remote.engine_id`)."""
    return {
        "apiVersion": "railtrace.io/v1alpha1",
        "kind": "Topology",
        "nodes": [
            {"name": n.name, "gpus": [{"name": g.name, "numa": g.numa} for g in n.gpus]} for n in fleet.nodes
        ],
        "pods": engine_entries(fleet),
    }
