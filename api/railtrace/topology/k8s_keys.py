"""Every Kubernetes and DRA name railtrace reads from a cluster, spelled once.

Node labels, DRA drivers and their device attributes, and pod annotations, as the topology
builder, the contract audit and the CEL templates read them and the simulator writes them
(docs/topology.md; each driver's source is named beside it). A name belongs here
when railtrace reads it, or when the simulator writes it so that its nodes look like real ones.
`tests/topology/test_k8s_keys.py` fails when such a name is spelled anywhere else in `api/`.
"""

from __future__ import annotations

# -- DRA (resource.k8s.io) -------------------------------------------------------------------
RESOURCE_GROUP = "resource.k8s.io"
# Standard device attributes (published by gpu.nvidia.com, dra.net and GKE): equal pcieRoot = GPU and
# NIC under one PCIe root, the key claims pair devices with (`matchAttribute`).
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"

NVIDIA_GPU_DRIVER = "gpu.nvidia.com"
AMD_GPU_DRIVER = "gpu.amd.com"
GPU_DRIVERS = (NVIDIA_GPU_DRIVER, AMD_GPU_DRIVER)
DRANET_DRIVER = "dra.net"  # google/dranet: one device per network interface
GKE_RDMA_DRIVER = "mrdma.google.com"  # GKE managed DRANET DeviceClass for RDMA NICs
GKE_NETDEV_DRIVER = "netdev.google.com"  # … and for other netdevs
# SR-IOV DRA driver (k8snetworkplumbingwg/dra-driver-sriov, pkg/consts/consts.go): publishes VFs.
SRIOV_DRIVER = "sriovnetwork.k8snetworkplumbingwg.io"
# InfiniBand DRA driver (README "Device Attributes"): one device per IB port, PFs and VFs.
IB_DRIVER = "ib.sigs.k8s.io"
NIC_DRIVERS = (DRANET_DRIVER, GKE_RDMA_DRIVER, GKE_NETDEV_DRIVER, SRIOV_DRIVER, IB_DRIVER)
# Drivers known to publish no NICs: their devices are not a discovery gap.
NON_NIC_DRIVERS = ("compute-domain.nvidia.com", "dra.cpu", "dra.memory", "tpu.google.com")


def driver_attribute(driver: str, name: str) -> str:
    """A driver's device attribute as a ResourceSlice qualifies it: `<driver>/<name>`."""
    return f"{driver}/{name}"


# DRANET's device attributes (dranet `pkg/apis/attributes.go`).
DRANET_IF_NAME = driver_attribute(DRANET_DRIVER, "ifName")
DRANET_PCI_ADDRESS = driver_attribute(DRANET_DRIVER, "pciAddress")
DRANET_PCI_VENDOR = driver_attribute(DRANET_DRIVER, "pciVendor")
DRANET_PCI_DEVICE = driver_attribute(DRANET_DRIVER, "pciDevice")
DRANET_NUMA_NODE = driver_attribute(DRANET_DRIVER, "numaNode")
DRANET_MTU = driver_attribute(DRANET_DRIVER, "mtu")
DRANET_RDMA = driver_attribute(DRANET_DRIVER, "rdma")
DRANET_RDMA_DEVICE = driver_attribute(DRANET_DRIVER, "rdmaDevice")
DRANET_IPV4 = driver_attribute(DRANET_DRIVER, "ipv4")
DRANET_STATE = driver_attribute(DRANET_DRIVER, "state")
DRANET_TYPE = driver_attribute(DRANET_DRIVER, "type")
DRANET_VIRTUAL = driver_attribute(DRANET_DRIVER, "virtual")
DRANET_SRIOV = driver_attribute(DRANET_DRIVER, "sriov")
DRANET_IS_SRIOV_VF = driver_attribute(DRANET_DRIVER, "isSriovVf")
# dra.net/numaNode alone does not make a NIC: dracpu and the SR-IOV driver publish it for compatibility.
DRANET_NIC_KEYS = (DRANET_IF_NAME, DRANET_PCI_ADDRESS, DRANET_RDMA, DRANET_RDMA_DEVICE)

# Cloud providers' DRANET attributes: the network (rail) of a NIC, and node-level placement.
GCE_NETWORK_NAME = "gce.dra.net/networkName"
GCE_BLOCK = "gce.dra.net/block"
GCE_SUBBLOCK = "gce.dra.net/subBlock"
GCE_HOST = "gce.dra.net/host"
GCE_MACHINE_TYPE = "gce.dra.net/machineType"
# Each node-level device attribute and the node field it fills (GCE, OCI, Azure DRANET).
NODE_DEVICE_ATTRIBUTES = {
    GCE_BLOCK: "block",
    GCE_SUBBLOCK: "subblock",
    GCE_HOST: "host",
    "oke.dra.net/networkBlockId": "block",
    "oke.dra.net/localBlockId": "subblock",
    "oke.dra.net/gpuMemoryFabricId": "nvlink_domain",
    "azure.dra.net/interconnectGroupId": "block",
    "azure.dra.net/interconnectSubgroupId": "subblock",
    GCE_MACHINE_TYPE: "machine_type",
    "azure.dra.net/vmSize": "machine_type",
}

# -- Node labels, per hierarchy level, nearest meaning first -----------------------------------
HOSTNAME_LABEL = "kubernetes.io/hostname"
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
ZONE_LABELS = (ZONE_LABEL, "failure-domain.beta.kubernetes.io/zone")
GCE_BLOCK_LABEL = "cloud.google.com/gce-topology-block"
GCE_SUBBLOCK_LABEL = "cloud.google.com/gce-topology-subblock"
GCE_HOST_LABEL = "cloud.google.com/gce-topology-host"
EKS_BLOCK_LABEL = "topology.k8s.aws/network-node-layer-3"
BLOCK_LABELS = (GCE_BLOCK_LABEL, EKS_BLOCK_LABEL)
SUBBLOCK_LABELS = (GCE_SUBBLOCK_LABEL,)
HOST_LABELS = (GCE_HOST_LABEL,)
NVIDIA_CLIQUE_LABEL = "nvidia.com/gpu.clique"  # GPU feature discovery: the NVLink domain
EKS_ULTRASERVER_LABEL = "topology.k8s.aws/ultraserver-id"
NVLINK_LABELS = (NVIDIA_CLIQUE_LABEL, EKS_ULTRASERVER_LABEL, "ds.coreweave.com/nvlink.domain")
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
MACHINE_LABELS = (INSTANCE_TYPE_LABEL, "beta.kubernetes.io/instance-type")

# -- Pod labels: llm-d's role of a serving pod -------------------------------------------------
ROLE_LABEL = "llm-d.ai/role"
INFERENCE_SERVING_LABEL = "llm-d.ai/inferenceServing"
ROLE_LABELS = (ROLE_LABEL, "llm-d.ai/inferenceServing-role", "role")
APP_NAME_LABEL = "app.kubernetes.io/name"

# -- Written by the simulator only, so that its nodes carry what a GKE A3 Ultra node does ------
ARCH_LABEL = "kubernetes.io/arch"
BETA_ARCH_LABEL = "beta.kubernetes.io/arch"
OS_LABEL = "kubernetes.io/os"
GKE_MACHINE_FAMILY_LABEL = "cloud.google.com/machine-family"
GKE_NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
GKE_NETWORKING_DRA_LABEL = "cloud.google.com/gke-networking-dra-driver"
GKE_ACCELERATOR_NETWORK_PROFILE_LABEL = "gke.networks.io/accelerator-network-profile"
NVIDIA_GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
NVIDIA_GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
NVIDIA_GPU_COUNT_LABEL = "nvidia.com/gpu.count"
