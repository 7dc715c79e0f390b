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

The tree is read as the kernel's own tools read sysfs, because a recorded or mounted tree can
hold anything: an attribute is read only if it is a regular file (checked with `lstat` before
it is opened, and with `fstat` on the descriptor, which is opened `O_NONBLOCK` so a FIFO swapped
in between cannot block), and at most `MAX_ATTRIBUTE_BYTES` of it (a sysfs attribute is at most
a page; more is not an attribute). Symlinks are followed only when they resolve inside the
root. An entry that breaks these rules is skipped with a warning naming it; the rest of the
node is still collected, since a missing fact leaves a gap the model reports, not a wrong one.
Before, `/dev/zero` or a 2 GiB sparse file as an attribute ended in `MemoryError`, and a FIFO
blocked the collector for ever. Work is linear in the number of entries (VF to PF lookups go
through maps built once).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import stat
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
# The most of one attribute read: sysfs text attributes are at most a page (4 KiB on most hosts).
MAX_ATTRIBUTE_BYTES = 4096
# Warnings kept in the document; past them one line counts the rest.
MAX_WARNINGS = 100
_MAX_LINK_HOPS = 40  # as the kernel's MAXSYMLINKS
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


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


def _natural(name: str) -> list[Any]:
    """mlx5_2 before mlx5_10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _devices_part(real: str) -> str:
    """`/x/sys/devices/pci0000:15/0000:15:01.0/…` → `pci0000:15/0000:15:01.0/…`."""
    marker = "/sys/devices/"
    i = real.find(marker)
    return real[i + len(marker) :] if i >= 0 else real


class SysfsReader:
    """Reads attributes and links under one root, refusing what sysfs never holds (see the
    module's docstring); each refusal is one warning naming the entry."""

    def __init__(self, root: str | os.PathLike[str], warnings: list[str]) -> None:
        self.root = os.path.realpath(root)
        self._prefix = self.root.rstrip("/") + "/"
        self.warnings = warnings
        self.skipped = 0
        self.unlisted = 0  # skipped past MAX_WARNINGS warnings
        self._known: dict[str, str] = {}  # path -> its real path, for folders and links

    def refuse(self, path: str, why: str) -> None:
        self.skipped += 1
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(f"{path}: {why}; skipped")
        else:
            self.unlisted += 1

    def inside(self, real: str) -> bool:
        return real == self.root or real.startswith(self._prefix)

    def resolve(self, path: str) -> str | None:
        """The real path of `path` if it exists and stays inside the root; else None (and a
        warning when it leads outside)."""
        real = self.realpath(path)
        if real is None:
            return None
        if not self.inside(real):
            self.refuse(path, f"links outside the sysfs root (to {real})")
            return None
        return real

    def realpath(self, path: str) -> str | None:
        """`os.path.realpath` for a path that exists (else None, as for a symlink loop), with
        the folders and links already resolved remembered: each device link then costs one
        `lstat` and `readlink` instead of one `lstat` per component of its absolute path
        (most of the collector's time on a big tree)."""
        if not path.startswith("/"):
            path = os.path.join(os.getcwd(), path)
        return self._walk("/", path.split("/"), [0])

    def _walk(self, cur: str, parts: list[str], hops: list[int]) -> str | None:
        for part in parts:
            if part in ("", "."):
                continue
            if part == "..":  # `cur` is real, so its parent is too
                cur = os.path.dirname(cur)
                continue
            nxt = cur + part if cur == "/" else f"{cur}/{part}"
            known = self._known.get(nxt)
            if known is not None:
                cur = known
                continue
            try:
                mode = os.lstat(nxt).st_mode
            except OSError:
                return None
            if stat.S_ISLNK(mode):
                hops[0] += 1
                if hops[0] > _MAX_LINK_HOPS:
                    return None
                try:
                    target = os.readlink(nxt)
                except OSError:
                    return None
                real = self._walk("/" if target.startswith("/") else cur, target.split("/"), hops)
                if real is None:
                    return None
                self._known[nxt] = real
                cur = real
            else:
                if stat.S_ISDIR(mode):
                    self._known[nxt] = nxt
                cur = nxt
        return cur

    def read(self, path: str) -> str | None:
        """One attribute's text, stripped; None when missing, unreadable or refused."""
        try:
            st = os.lstat(path)
        except OSError:
            return None  # missing (an absent attribute is normal) or not reachable
        if stat.S_ISLNK(st.st_mode):
            real = self.resolve(path)
            if real is None:
                return None
            path = real
            try:
                st = os.lstat(path)
            except OSError:
                return None
        if not stat.S_ISREG(st.st_mode):
            self.refuse(path, f"{_kind(st.st_mode)}, not a sysfs attribute")
            return None
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # became a symlink since the lstat
                self.refuse(path, "changed while read")
            return None
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):  # swapped since the lstat; O_NONBLOCK kept the open from waiting
                self.refuse(path, f"{_kind(mode)}, not a sysfs attribute")
                return None
            data = os.read(fd, MAX_ATTRIBUTE_BYTES + 1)
        except OSError:
            return None  # e.g. EIO from an attribute its driver cannot answer
        finally:
            os.close(fd)
        if len(data) > MAX_ATTRIBUTE_BYTES:
            self.refuse(path, f"longer than {MAX_ATTRIBUTE_BYTES} bytes, not a sysfs attribute")
            return None
        try:
            return data.decode().strip()
        except UnicodeDecodeError:
            self.refuse(path, "not text")
            return None

    def link_name(self, link: str) -> str | None:
        """The last component of what `link` resolves to (a PCI address), if it exists inside
        the root."""
        real = self.resolve(link)
        return os.path.basename(real) if real else None

    def entries(self, path: str) -> list[str]:
        """Names in a folder (none when it is not one)."""
        try:
            with os.scandir(path) as it:
                return [e.name for e in it]
        except OSError:
            return []


class Collector:
    """Reads one host's sysfs (under `root`) into railtrace's topology document for node `node`."""

    def __init__(self, root: str | os.PathLike[str] = "/", node: str | None = None) -> None:
        self.root = Path(root)
        self.node = node or os.environ.get("NODE_NAME") or socket.gethostname()
        self.warnings: list[str] = []
        self.reader = SysfsReader(root, self.warnings)

    def sys(self, *parts: str) -> Path:
        return self.root.joinpath("sys", *parts)

    # -- readers ---------------------------------------------------------------------------
    def _folder(self, path: Path) -> str | None:
        """`path` resolved, if it is a folder inside the root."""
        real = self.reader.resolve(str(path))
        return real if real is not None and os.path.isdir(real) else None

    def _device_folders(self, base: str, order: Any = None) -> list[tuple[str, str]]:
        """(name, resolved folder) of each entry of `base`, sorted; entries that lead outside
        the root or to something other than a folder are skipped with a warning."""
        out = []
        for name in sorted(self.reader.entries(base), key=order):
            entry = os.path.join(base, name)
            real = self.reader.resolve(entry)
            if real is None:
                continue
            try:
                mode = os.stat(real).st_mode
            except OSError:
                continue
            if not stat.S_ISDIR(mode):
                self.reader.refuse(entry, f"{_kind(mode)}, not a device folder")
                continue
            out.append((name, real))
        return out

    def pci_devices(self) -> dict[str, _Pci]:
        base = self._folder(self.sys("bus", "pci", "devices"))
        out: dict[str, _Pci] = {}
        if base is None:
            self.warnings.append(f"{self.sys('bus', 'pci', 'devices')}: not found; no PCI devices read")
            return out
        read = self.reader.read
        for name, d in self._device_folders(base):
            dev = _Pci(addr=name, path=_devices_part(d))
            dev.cls = (read(d + "/class") or "").lower()
            dev.vendor = (read(d + "/vendor") or "").lower()
            dev.device = (read(d + "/device") or "").lower()
            numa = read(d + "/numa_node")
            try:
                dev.numa = int(numa) if numa is not None and int(numa) >= 0 else None
            except ValueError:
                dev.numa = None
            if os.path.lexists(d + "/physfn"):
                dev.physfn = self.reader.link_name(d + "/physfn")
            out[dev.addr] = dev
        # A PF's VFs from the VFs' `physfn` links: one pass, instead of a listing of every
        # PF's folder for its `virtfn<N>` links.
        for dev in out.values():
            if dev.physfn and dev.physfn in out:
                out[dev.physfn].virtfns.append(dev.addr)
        return out

    def rdma_devices(self) -> dict[str, dict[str, Any]]:
        base = self._folder(self.sys("class", "infiniband"))
        out: dict[str, dict[str, Any]] = {}
        if base is None:
            return out
        read = self.reader.read
        for name, d in self._device_folders(base, _natural):
            pci = self.reader.link_name(d + "/device")
            ports = []
            for port in sorted(self.reader.entries(d + "/ports"), key=lambda p: (len(p), p)):
                p = f"{d}/ports/{port}"
                ports.append(
                    {
                        "port": int(port) if port.isdigit() else port,
                        "linkLayer": read(p + "/link_layer"),
                        "rate": read(p + "/rate"),
                        "state": read(p + "/state"),
                    }
                )
            out[name] = {"pci": pci, "ports": ports}
        return out

    def netdevs(self) -> dict[str, dict[str, Any]]:
        base = self._folder(self.sys("class", "net"))
        out: dict[str, dict[str, Any]] = {}
        if base is None:
            return out
        for name, d in self._device_folders(base, _natural):
            if not os.path.lexists(d + "/device"):
                continue  # virtual: lo, veth, bridges
            out[name] = {
                "pci": self.reader.link_name(d + "/device"),
                "type": _ARPHRD.get(self.reader.read(d + "/type") or ""),
            }
        return out

    def gpu_info(self, addr: str) -> dict[str, str]:
        """The NVIDIA driver's `Model` and `GPU UUID` lines for the GPU (/proc/driver/nvidia/gpus/<bus>/
        information), where the driver is loaded and /proc is part of the root; the UUID is what
        NIXL spans name the local GPU by."""
        info = self.root / "proc" / "driver" / "nvidia" / "gpus" / addr / "information"
        text = self.reader.read(str(info)) or ""
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
        rdma_by_pci: dict[str, list[str]] = {}
        for name, info in rdma.items():
            if info["pci"]:
                rdma_by_pci.setdefault(info["pci"], []).append(name)
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
            nic.update(self._pci_facts(d, net_by_pci, rdma_by_pci))
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
            nic.update(self._pci_facts(d, net_by_pci, rdma_by_pci))
            nics.append(nic)

        node: dict[str, Any] = {"name": self.node, "gpus": gpus, "nics": nics}
        if topo_matrix:
            node["topoMatrix"] = topo_matrix
        collected: dict[str, Any] = {"by": COLLECTED_BY, "sysfsRoot": str(self.root)}
        if self.reader.unlisted:
            self.warnings.append(f"and {self.reader.unlisted} more entries skipped")
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
        net_by_pci: Mapping[str, list[str]],
        rdma_by_pci: Mapping[str, list[str]],
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
            pf_rdma = rdma_by_pci.get(d.physfn, [])
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
