"""Expand a compact sysfs record into a directory tree shaped like a host's /sys: real device folders
under sys/devices, relative symlinks from sys/bus/pci/devices, sys/class/infiniband and sys/class/net,
`physfn`/`virtfnN` links between VFs and PFs. `railtrace topology collect --sysfs-root` reads the tree
as it reads a host, so recorded hosts (tests/fixtures/topology/sysfs/) and simulated fleets (the demo)
go through the same collector.

Record shape::

    node: NAME
    pci:            # address -> parent path below /sys/devices, ids, NUMA; `vfs` are created beside the PF;
                    # `nvidia: {Model: …, GPU UUID: …}` writes the NVIDIA driver's /proc information file
      "0000:1a:00.0": {parent: pci0000:15/0000:15:01.0, class: "0x020700", vendor: "0x15b3",
                       device: "0x1021", numa: 0, vfs: ["0000:1a:00.1"], vfDevice: "0x101e"}
    infiniband:     # RDMA device -> PCI function and ports
      mlx5_0: {pci: "0000:1a:00.0", ports: {1: {link_layer: InfiniBand, rate: "400 Gb/sec (4X NDR)",
                                                state: "4: ACTIVE"}}}
    net:            # netdev -> PCI function (none: virtual) and ARPHRD type
      ibp26s0: {pci: "0000:1a:00.0", type: 32}
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml


def _write(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, link.parent), link)


def load_record(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def expand(record: dict[str, Any], root: Path) -> Path:
    """Write the tree under `root` (which becomes the --sysfs-root) and return it."""
    devices = root / "sys" / "devices"
    where: dict[str, Path] = {}
    pci: dict[str, dict[str, Any]] = dict(record.get("pci") or {})
    for addr, d in list(pci.items()):
        for vf in d.get("vfs") or []:
            pci.setdefault(
                vf,
                {
                    "parent": d["parent"],
                    "class": d["class"],
                    "vendor": d["vendor"],
                    "device": d.get("vfDevice", d["device"]),
                    "numa": d.get("numa", -1),
                    "physfn": addr,
                },
            )
    for addr, d in pci.items():
        dev = devices / d["parent"] / addr
        where[addr] = dev
        _write(dev / "class", d["class"])
        _write(dev / "vendor", d["vendor"])
        _write(dev / "device", d["device"])
        _write(dev / "numa_node", d.get("numa", -1))
        _link(root / "sys" / "bus" / "pci" / "devices" / addr, dev)
        if d.get("nvidia"):  # the NVIDIA driver's /proc/driver/nvidia/gpus/<bus>/information
            lines = "".join(f"{k}:\t\t {v}\n" for k, v in d["nvidia"].items())
            info = root / "proc" / "driver" / "nvidia" / "gpus" / addr / "information"
            info.parent.mkdir(parents=True, exist_ok=True)
            info.write_text(lines)
    for addr, d in pci.items():
        if d.get("physfn"):
            _link(where[addr] / "physfn", where[d["physfn"]])
        for i, vf in enumerate(d.get("vfs") or []):
            _link(where[addr] / f"virtfn{i}", where[vf])
    for name, d in (record.get("infiniband") or {}).items():
        dev = where[d["pci"]] / "infiniband" / name
        _link(dev / "device", where[d["pci"]])
        for port, p in (d.get("ports") or {}).items():
            for key, value in p.items():
                _write(dev / "ports" / str(port) / key, value)
        _link(root / "sys" / "class" / "infiniband" / name, dev)
    for name, d in (record.get("net") or {}).items():
        if d.get("pci"):
            dev = where[d["pci"]] / "net" / name
            _link(dev / "device", where[d["pci"]])
        else:
            dev = devices / "virtual" / "net" / name
        _write(dev / "type", d.get("type", 1))
        _link(root / "sys" / "class" / "net" / name, dev)
    return root
