"""`railtrace topology collect`: what a GPU node knows about its own hardware, as railtrace topology YAML.

The Kubernetes API says which devices a pod was allocated; it often does not say which RDMA device
(`mlx5_5`, the name UCX reports) a VF is, where a NIC sits on the PCIe tree, or anything at all when
NICs come from device plugins. The node itself knows, in sysfs:

* `/sys/bus/pci/devices/<addr>`: a symlink into `/sys/devices/pciDDDD:BB/…/<addr>`; the first path
  component after `devices/` is the PCIe root complex (the value Kubernetes publishes as
  `resource.kubernetes.io/pcieRoot`). Each device has `class`, `vendor`, `device`, `numa_node`; a VF
  has a `physfn` link to its PF, a PF has `virtfn<N>` links.
* `/sys/class/infiniband/<dev>`: RDMA devices; `device` links to the PCI function, `ports/<n>/`
  holds `link_layer` (InfiniBand | Ethernet), `rate` and `state`.
* `/sys/class/net/<if>`: netdevs; `device` links to the PCI function, `type` is the ARPHRD type.

Everything is read relative to a root (`--sysfs-root`) so recorded trees can be read as well as a
live host. Nothing is inferred that sysfs does not say; what cannot be read is listed in
`collected.warnings`.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COLLECT_API_VERSION = "railtrace.io/v1alpha1"
COLLECTED_BY = "railtrace topology collect"
NVIDIA_VENDOR = "0x10de"
_GPU_CLASSES = ("0x0300", "0x0302")  # VGA / 3D controller
_NET_CLASS = "0x02"
_LINK_LAYER = {"infiniband": "infiniband", "ethernet": "ethernet"}
_ARPHRD = {"1": "ethernet", "32": "infiniband"}
# PCI ids of virtual functions, for VMs where the PF (and so `physfn`) is on the hypervisor's side:
# 15b3:101e is "ConnectX Family mlx5Gen Virtual Function" in the PCI ID database.
_VF_IDS = {("0x15b3", "0x101e")}


@dataclass
class _Pci:
    addr: str
    path: str  # resolved path below .../devices/
    cls: str = ""
    vendor: str = ""
    device: str = ""
    numa: int | None = None
    physfn: str | None = None
    virtfns: list[str] = field(default_factory=list)

    @property
    def root(self) -> str | None:
        first = self.path.split("/", 1)[0]
        return first if first.startswith("pci") else None


def _natural(p: Path) -> list[Any]:
    """mlx5_2 before mlx5_10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _devices_part(real: str) -> str:
    """`/x/sys/devices/pci0000:15/0000:15:01.0/…` → `pci0000:15/0000:15:01.0/…`."""
    marker = "/sys/devices/"
    i = real.find(marker)
    return real[i + len(marker) :] if i >= 0 else real


def _link_target_name(link: Path) -> str | None:
    try:
        return Path(os.path.realpath(link)).name if link.is_symlink() or link.exists() else None
    except OSError:
        return None


class Collector:
    """Reads one host's sysfs (under `root`) into railtrace's topology document for node `node`."""

    def __init__(self, root: str | os.PathLike[str] = "/", node: str | None = None) -> None:
        self.root = Path(root)
        self.node = node or os.environ.get("NODE_NAME") or socket.gethostname()
        self.warnings: list[str] = []

    def sys(self, *parts: str) -> Path:
        return self.root.joinpath("sys", *parts)

    # -- readers ---------------------------------------------------------------------------
    def pci_devices(self) -> dict[str, _Pci]:
        base = self.sys("bus", "pci", "devices")
        out: dict[str, _Pci] = {}
        if not base.is_dir():
            self.warnings.append(f"{base}: not found; no PCI devices read")
            return out
        for entry in sorted(base.iterdir()):
            real = os.path.realpath(entry)
            dev = _Pci(addr=entry.name, path=_devices_part(real))
            d = Path(real)
            dev.cls = (_read(d / "class") or "").lower()
            dev.vendor = (_read(d / "vendor") or "").lower()
            dev.device = (_read(d / "device") or "").lower()
            numa = _read(d / "numa_node")
            try:
                dev.numa = int(numa) if numa is not None and int(numa) >= 0 else None
            except ValueError:
                dev.numa = None
            if (d / "physfn").exists():
                dev.physfn = _link_target_name(d / "physfn")
            dev.virtfns = sorted(n for n in (_link_target_name(v) for v in d.glob("virtfn*")) if n)
            out[dev.addr] = dev
        return out

    def rdma_devices(self) -> dict[str, dict[str, Any]]:
        base = self.sys("class", "infiniband")
        out: dict[str, dict[str, Any]] = {}
        if not base.is_dir():
            return out
        for entry in sorted(base.iterdir(), key=_natural):
            d = Path(os.path.realpath(entry))
            pci = _link_target_name(d / "device")
            ports = []
            for port in sorted((d / "ports").glob("*"), key=lambda p: (len(p.name), p.name)):
                ports.append(
                    {
                        "port": int(port.name) if port.name.isdigit() else port.name,
                        "linkLayer": _read(port / "link_layer"),
                        "rate": _read(port / "rate"),
                        "state": _read(port / "state"),
                    }
                )
            out[entry.name] = {"pci": pci, "ports": ports}
        return out

    def netdevs(self) -> dict[str, dict[str, Any]]:
        base = self.sys("class", "net")
        out: dict[str, dict[str, Any]] = {}
        if not base.is_dir():
            return out
        for entry in sorted(base.iterdir(), key=_natural):
            d = Path(os.path.realpath(entry))
            if not (d / "device").exists():
                continue  # virtual: lo, veth, bridges
            out[entry.name] = {
                "pci": _link_target_name(d / "device"),
                "type": _ARPHRD.get(_read(d / "type") or ""),
            }
        return out

    def gpu_info(self, addr: str) -> dict[str, str]:
        """The NVIDIA driver's `Model` and `GPU UUID` lines for the GPU (/proc/driver/nvidia/gpus/<bus>/
        information), where the driver is loaded and /proc is part of the root; the UUID is what
        NIXL spans name the local GPU by."""
        text = _read(self.root / "proc" / "driver" / "nvidia" / "gpus" / addr / "information") or ""
        out = {}
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model", "GPU UUID") and value.strip():
                out[key.strip()] = value.strip()
        return out

    # -- the document ------------------------------------------------------------------------
    def collect(self, topo_matrix: str | None = None) -> dict[str, Any]:
        pci = self.pci_devices()
        rdma = self.rdma_devices()
        nets = self.netdevs()
        net_by_pci: dict[str, list[str]] = {}
        for name, info in nets.items():
            if info["pci"]:
                net_by_pci.setdefault(info["pci"], []).append(name)

        gpus = []
        gpu_addrs = sorted(
            a
            for a, d in pci.items()
            if d.vendor == NVIDIA_VENDOR and d.cls.startswith(_GPU_CLASSES) and d.physfn is None
        )
        # nvidia-smi numbers GPUs in PCI bus order; that is the index written here.
        for i, addr in enumerate(gpu_addrs):
            d = pci[addr]
            g: dict[str, Any] = {"name": f"gpu-{i}", "index": i, "pciBusID": addr}
            if d.root:
                g["pcieRoot"] = d.root
            if d.numa is not None:
                g["numa"] = d.numa
            info = self.gpu_info(addr)
            if info.get("GPU UUID"):
                g["uuid"] = info["GPU UUID"]
            if info.get("Model"):
                g["product"] = info["Model"]
            gpus.append(g)

        nics: list[dict[str, Any]] = []
        seen_pci: set[str] = set()
        for name, info in rdma.items():
            addr = info["pci"]
            d = pci.get(addr or "")
            if addr:
                seen_pci.add(addr)
            nic: dict[str, Any] = {"name": name, "rdma": True, "rdmaDevice": name}
            ifs = net_by_pci.get(addr or "", [])
            if len(ifs) == 1:
                nic["ifName"] = ifs[0]
            elif len(ifs) > 1:
                nic["ifNames"] = ifs
            if addr:
                nic["pciAddress"] = addr
            if d is None and addr:
                self.warnings.append(f"{name}: PCI device {addr} not under /sys/bus/pci/devices")
            nic.update(self._pci_facts(d, pci, net_by_pci, rdma))
            port = info["ports"][0] if info["ports"] else {}
            link = _LINK_LAYER.get(str(port.get("linkLayer") or "").lower())
            if link:
                nic["linkType"] = link
            if port.get("rate"):
                nic["rate"] = port["rate"]
            if len(info["ports"]) > 1:  # the first port's facts are above; UCX names it `:1`
                nic["ports"] = info["ports"]
            nics.append(nic)
        # Network functions without an RDMA device: known NICs, never RDMA candidates.
        for addr, d in sorted(pci.items()):
            if addr in seen_pci or not d.cls.startswith(_NET_CLASS):
                continue
            ifs = net_by_pci.get(addr, [])
            nic = {"name": ifs[0] if len(ifs) == 1 else addr, "rdma": False, "pciAddress": addr}
            if len(ifs) == 1:
                nic["ifName"] = ifs[0]
            link = next((nets[i]["type"] for i in ifs if nets[i]["type"]), None)
            if link:
                nic["linkType"] = link
            nic.update(self._pci_facts(d, pci, net_by_pci, rdma))
            nics.append(nic)

        node: dict[str, Any] = {"name": self.node, "gpus": gpus, "nics": nics}
        if topo_matrix:
            node["topoMatrix"] = topo_matrix
        collected: dict[str, Any] = {"by": COLLECTED_BY, "sysfsRoot": str(self.root)}
        if self.warnings:
            collected["warnings"] = list(self.warnings)
        return {
            "apiVersion": COLLECT_API_VERSION,
            "kind": "Topology",
            "collected": collected,
            "nodes": [node],
        }

    @staticmethod
    def _pci_facts(
        d: _Pci | None,
        pci: Mapping[str, _Pci],
        net_by_pci: Mapping[str, list[str]],
        rdma: Mapping[str, Mapping[str, Any]],
    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if d is None:
            return out
        if d.root:
            out["pcieRoot"] = d.root
        if d.numa is not None:
            out["numa"] = d.numa
        if d.physfn or (d.vendor, d.device) in _VF_IDS:
            out["function"] = "VF"
        if d.physfn:
            out["pfPciAddress"] = d.physfn
            pf_ifs = net_by_pci.get(d.physfn, [])
            pf_rdma = [n for n, i in rdma.items() if i["pci"] == d.physfn]
            pf = pf_ifs[0] if len(pf_ifs) == 1 else pf_rdma[0] if len(pf_rdma) == 1 else None
            if pf:
                out["pf"] = pf
        elif d.virtfns and "function" not in out:
            out["function"] = "PF"
        return out


def nvidia_smi_topo(timeout: float = 30.0) -> tuple[str | None, str | None]:
    """`nvidia-smi topo -m` of this host: (text, None), or (None, why not)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None, "nvidia-smi not found"
    try:
        run = subprocess.run(
            [exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"nvidia-smi topo -m failed: {exc}"
    if run.returncode != 0:
        return None, f"nvidia-smi topo -m exited {run.returncode}: {run.stderr.strip()[:200]}"
    return run.stdout, None


def collect(
    sysfs_root: str | os.PathLike[str] = "/",
    node: str | None = None,
    topo_matrix: str | None = None,
    run_nvidia_smi: bool = False,
) -> dict[str, Any]:
    """The node's topology document; `run_nvidia_smi` adds this host's `nvidia-smi topo -m`."""
    c = Collector(sysfs_root, node)
    if topo_matrix is None and run_nvidia_smi:
        topo_matrix, why = nvidia_smi_topo()
        if why:
            c.warnings.append(why)
    return c.collect(topo_matrix)


def publish(text: str, node: str, target: str, kubeconfig: str | None = None) -> str:
    """Store `text` as key `<node>.yaml` of ConfigMap `NAMESPACE/NAME` (created when missing).

    One key per node in one ConfigMap, mounted into the service and read as a topology folder
    beside `--topology k8s`: a merge patch touches only this node's key, so nodes publishing at
    once do not overwrite each other.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from railtrace.topology.k8s_source import load_api_client

    namespace, _, name = target.partition("/")
    if not namespace or not name:
        raise ValueError(f"--configmap wants NAMESPACE/NAME, got {target!r}")
    api = client.CoreV1Api(load_api_client(kubeconfig))
    key = f"{node}.yaml"
    try:
        api.patch_namespaced_config_map(name, namespace, {"data": {key: text}})
    except ApiException as exc:
        if exc.status != 404:
            raise
        body = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace), data={key: text}
        )
        api.create_namespaced_config_map(namespace, body)
    return f"{namespace}/{name} key {key}"
