"""`railtrace topology collect` on sysfs trees that are not what sysfs holds: a FIFO, a device
(or a link to one), a huge sparse file where an attribute should be, links leading out of the
root, and 50,000 PCI functions. Each hostile entry is skipped with a warning naming it; the rest
of the node is still collected, and nothing blocks or reads more than a page."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from railtrace.cli import main
from railtrace.topology.collect import MAX_ATTRIBUTE_BYTES, SysfsReader, collect
from railtrace.topology.sysfs_record import expand, load_record

SYSFS = Path(__file__).resolve().parents[1] / "fixtures" / "topology" / "sysfs"
GPU0 = "0000:18:00.0"  # the h100-cx7-sriov record's first GPU
NIC0 = "0000:1a:00.0"  # its first NIC (a PF with two VFs)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return expand(load_record(SYSFS / "h100-cx7-sriov.yaml"), tmp_path / "root")


def device(root: Path, addr: str) -> Path:
    return Path(os.path.realpath(root / "sys" / "bus" / "pci" / "devices" / addr))


def replace(path: Path, make: object) -> None:
    path.unlink()
    make(path)  # type: ignore[operator]


def node_of(doc: dict) -> dict:  # type: ignore[type-arg]
    return doc["nodes"][0]  # type: ignore[no-any-return]


def warnings_of(doc: dict) -> list[str]:  # type: ignore[type-arg]
    return list(doc["collected"].get("warnings", []))


@pytest.mark.timeout(60)
def test_a_fifo_attribute_is_skipped_not_waited_on(root: Path) -> None:
    fifo = device(root, GPU0) / "numa_node"
    replace(fifo, os.mkfifo)
    doc = collect(root, node="n")
    assert [w for w in warnings_of(doc) if str(fifo) in w] == [
        f"{fifo}: a FIFO, not a sysfs attribute; skipped"
    ]
    gpu = node_of(doc)["gpus"][0]
    assert gpu["pciBusID"] == GPU0 and "numa" not in gpu  # the rest of the GPU is still read
    assert len(node_of(doc)["gpus"]) == 8


@pytest.mark.timeout(60)
def test_a_fifo_swapped_in_after_the_check_does_not_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the `lstat` and the `open` a regular file becomes a FIFO: the open does not wait
    for a writer (O_NONBLOCK) and the descriptor's own type refuses it."""
    fifo = tmp_path / "sys" / "class"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    regular = os.lstat(__file__)
    real_lstat = os.lstat
    monkeypatch.setattr(os, "lstat", lambda p: regular if str(p) == str(fifo) else real_lstat(p))
    warnings: list[str] = []
    assert SysfsReader(tmp_path, warnings).read(str(fifo)) is None
    assert warnings == [f"{fifo}: a FIFO, not a sysfs attribute; skipped"]


@pytest.mark.timeout(60)
def test_a_link_to_dev_zero_is_refused(root: Path) -> None:
    vendor = device(root, GPU0) / "vendor"
    replace(vendor, lambda p: os.symlink("/dev/zero", p))
    doc = collect(root, node="n")
    assert f"{vendor}: links outside the sysfs root (to /dev/zero); skipped" in warnings_of(doc)
    assert len(node_of(doc)["gpus"]) == 7  # a GPU without its vendor is not taken for NVIDIA's


@pytest.mark.timeout(60)
def test_a_character_device_inside_the_root_is_refused(root: Path) -> None:
    zero = root / "sys" / "devices" / "zero"
    try:
        os.mknod(zero, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero's numbers
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    cls = device(root, NIC0) / "class"
    replace(cls, lambda p: os.symlink(os.path.relpath(zero, p.parent), p))
    doc = collect(root, node="n")
    assert f"{zero}: a character device, not a sysfs attribute; skipped" in warnings_of(doc)
    nic = next(n for n in node_of(doc)["nics"] if n.get("pciAddress") == NIC0)
    assert nic["name"] == "mlx5_0" and nic["pcieRoot"] == "pci0000:15"  # its other facts still read


@pytest.mark.timeout(60)
def test_a_huge_sparse_attribute_is_refused_after_one_page(root: Path) -> None:
    cls = device(root, GPU0) / "class"
    with open(cls, "r+b") as f:
        f.truncate(2 << 30)  # 2 GiB, sparse: reading it whole ended in MemoryError
    doc = collect(root, node="n")
    assert f"{cls}: longer than {MAX_ATTRIBUTE_BYTES} bytes, not a sysfs attribute; skipped" in warnings_of(
        doc
    )
    assert len(node_of(doc)["gpus"]) == 7


@pytest.mark.timeout(60)
def test_entries_that_are_not_device_folders_or_leave_the_root(root: Path, tmp_path: Path) -> None:
    bus = root / "sys" / "bus" / "pci" / "devices"
    os.mkfifo(bus / "0000:ff:00.0")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "class").write_text("0x030200\n")
    os.symlink(outside, bus / "0000:fe:00.0")
    os.symlink("0000:fd:00.0", bus / "0000:fd:00.0")  # a link to itself
    doc = collect(root, node="n")
    warnings = warnings_of(doc)
    assert f"{bus / '0000:ff:00.0'}: a FIFO, not a device folder; skipped" in warnings
    assert f"{bus / '0000:fe:00.0'}: links outside the sysfs root (to {outside}); skipped" in warnings
    addrs = {g["pciBusID"] for g in node_of(doc)["gpus"]} | {
        n.get("pciAddress") for n in node_of(doc)["nics"]
    }
    assert not addrs & {"0000:ff:00.0", "0000:fe:00.0", "0000:fd:00.0"}


def test_links_inside_the_root_are_followed_as_before(root: Path) -> None:
    """The recorded host's own links (device, physfn, class links) give the expected YAML."""
    doc = collect(root, node="h100-cx7")
    doc["collected"]["sysfsRoot"] = "RECORD"
    assert doc == yaml.safe_load((SYSFS / "h100-cx7-sriov.expected.yaml").read_text())


def test_warnings_are_bounded(root: Path) -> None:
    bus = root / "sys" / "bus" / "pci" / "devices"
    for i in range(150):
        os.mkfifo(bus / f"0001:00:{i >> 3:02x}.{i & 7}")
    warnings = warnings_of(collect(root, node="n"))
    assert len(warnings) == 101 and warnings[-1] == "and 50 more entries skipped"


def many_vfs(root: Path, n: int) -> Path:
    """One ConnectX PF and `n - 1` VFs, each with its RDMA device: the shape whose VF-to-PF
    lookup went through every RDMA device for every NIC."""
    bus = root / "sys" / "bus" / "pci" / "devices"
    ib = root / "sys" / "class" / "infiniband"
    top = root / "sys" / "devices" / "pci0000:15"
    for d in (bus, ib, top):
        d.mkdir(parents=True)
    for i in range(n):
        addr = f"{i >> 16:04x}:{(i >> 8) & 0xFF:02x}:{(i >> 3) & 0x1F:02x}.{i & 7}"
        dev = top / addr
        dev.mkdir()
        for name, value in (
            ("class", "0x020700"),
            ("vendor", "0x15b3"),
            ("device", "0x101e" if i else "0x1021"),
        ):
            (dev / name).write_text(value + "\n")
        os.symlink(f"../../../devices/pci0000:15/{addr}", bus / addr)
        if i:
            os.symlink("../0000:00:00.0", dev / "physfn")
        rd = dev / "infiniband" / f"mlx5_{i}"
        rd.mkdir(parents=True)
        os.symlink("../..", rd / "device")
        os.symlink(f"../../devices/pci0000:15/{addr}/infiniband/mlx5_{i}", ib / f"mlx5_{i}")
    return root


@pytest.mark.slow
# Writing the tree takes most of the time; before, the collector's lookups took tens of minutes.
@pytest.mark.timeout(900)
def test_50000_pci_functions_finish(tmp_path: Path) -> None:
    root = many_vfs(tmp_path / "root", 50_000)
    out = tmp_path / "big.yaml"
    rc = main(
        ["topology", "collect", "--sysfs-root", str(root), "--node", "big", "--no-nvidia-smi", "-o", str(out)]
    )
    assert rc == 0
    nics = node_of(yaml.load(out.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))["nics"]
    assert len(nics) == 50_000
    assert nics[0]["function"] == "PF" and nics[-1]["pf"] == "mlx5_0"
