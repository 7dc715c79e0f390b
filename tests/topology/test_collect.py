"""`railtrace topology collect` on recorded sysfs trees (H100 + ConnectX-7 behind PCIe switches with
SR-IOV, Grace GB200, an Azure VM with VFs), and the collected YAML merged with the Kubernetes view."""

from __future__ import annotations

import json
import os
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from railtrace.cli import main
from railtrace.model import Endpoint, KVFacts, RequestFacts
from railtrace.topology import load_paths
from railtrace.topology.collect import nvidia_smi_topo
from railtrace.topology.sysfs_record import expand, load_record
from railtrace.verdicts import judge

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
SYSFS = FIX / "sysfs"
RECORDS = ("h100-cx7-sriov", "grace-gb200", "azure-gb300-vm")


def collect_record(name: str, tmp_path: Path, *extra: str) -> Path:
    record = load_record(SYSFS / f"{name}.yaml")
    root = expand(record, tmp_path / "root")
    out = tmp_path / f"{name}.collected.yaml"
    rc = main(
        ["topology", "collect", "--sysfs-root", str(root), "--node", record["node"], "-o", str(out), *extra]
    )
    assert rc == 0
    return out


@pytest.mark.parametrize("name", RECORDS)
def test_collect_gives_the_expected_yaml(name: str, tmp_path: Path) -> None:
    out = collect_record(name, tmp_path)
    got = yaml.safe_load(out.read_text())
    assert got["collected"]["sysfsRoot"] == str(tmp_path / "root")
    got["collected"]["sysfsRoot"] = "RECORD"
    assert got == yaml.safe_load((SYSFS / f"{name}.expected.yaml").read_text())


def test_h100_switches_pair_each_gpu_with_its_nic_and_vfs(tmp_path: Path) -> None:
    t = load_paths([collect_record("h100-cx7-sriov", tmp_path)])
    node = t.nodes["h100-cx7"]
    assert node.rdma_path is True
    for k in range(8):
        p = t.pairing("h100-cx7", f"gpu-{k}")
        assert p.method == "pcieRoot"
        assert f"mlx5_{k}" in p.nics
    assert set(t.pairing("h100-cx7", "gpu-0").nics) == {"mlx5_0", "mlx5_8", "mlx5_9"}
    vf = t.nic("h100-cx7", "mlx5_10")
    assert (vf.function, vf.pf, vf.pf_pci_address, vf.link_type) == (
        "VF",
        "ibp44s0",
        "0000:2c:00.0",
        "infiniband",
    )
    eno = t.nic("h100-cx7", "eno1")
    assert eno.rdma is False and "eno1" not in t.pairing("h100-cx7", "gpu-7").nics
    assert vf.decided_by["rdma_device"] == "node (railtrace topology collect)"


def test_grace_pairs_by_numa(tmp_path: Path) -> None:
    t = load_paths([collect_record("grace-gb200", tmp_path)])
    p = t.pairing("gb200-oci", "gpu-2")
    assert p.method == "numa" and set(p.nics) == {"mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"}
    assert t.nic("gb200-oci", "mlx5_0").link_type == "ethernet"
    assert t.nic("gb200-oci", "eth0").rdma is False


def test_vm_vfs_have_no_pcie_root_and_pair_by_numa(tmp_path: Path) -> None:
    t = load_paths([collect_record("azure-gb300-vm", tmp_path)])
    nic = t.nic("azure-gb300-vm", "mlx5_2")
    assert nic.pcie_root is None and nic.function == "VF" and nic.numa == 1
    assert t.pairing("azure-gb300-vm", "gpu-0").nics == ("mlx5_0", "mlx5_1")
    assert any(g.object == "nic/azure-gb300-vm/mlx5_2" and "pcieRoot" in g.missing for g in t.gaps)


def test_collected_yaml_merges_with_sriov_slices_and_judges_lanes(tmp_path: Path) -> None:
    """API decides allocation, the node decides hardware: the VF the claim holds gets its mlx5 name."""
    collected = collect_record("h100-cx7-sriov", tmp_path)
    doc = yaml.safe_load(collected.read_text())
    doc["nodes"][0]["name"] = "sriov-node-b"
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(doc))
    t = load_paths(
        [
            FIX / "sriov" / "slices.yaml",
            FIX / "sriov" / "pods-and-claims.yaml",
            FIX / "sriov" / "rails.yaml",
            tmp_path / "b.yaml",
        ]
    )
    vf = t.nic("sriov-node-b", "0000-1a-00-1")
    assert vf.rdma_device == "mlx5_8" and vf.rail == "rail-0"
    assert vf.decided_by["rdma_device"] == "node (railtrace topology collect)"
    assert vf.decided_by["pcie_root"] == "node (railtrace topology collect)"
    gpu = t.gpu("sriov-node-b", "gpu-0")
    assert gpu.decided_by["numa"] == "node (railtrace topology collect)"  # the slice has no GPU NUMA
    assert gpu.numa == 0 and gpu.uuid == "GPU-00000000-h100"  # identity stays the slice's
    alloc = next(a for a in t.allocations if a.claim == "decode-0-net")
    assert alloc.nics == ("0000-1a-00-1",) and alloc.alignment == "aligned"  # allocation: the API's
    assert t.nic("sriov-node-b", "mlx5_8") is None  # merged by PCI address, not duplicated
    kv = KVFacts(
        span_id="00000000000000aa",
        operation="read",
        connector="nixl",
        backend="UCX",
        bytes=48_000_000,
        duration_s=0.0066,
        transport="rdma",
        devices=["rc_mlx5/mlx5_10:1"],
        local_gpu="0",
        remote_host="10.1.0.1",
        pod="decode-0",
        node="sriov-node-b",
    )
    facts = RequestFacts(
        trace_id="0" * 31 + "1",
        trace_ids=["0" * 31 + "1"],
        request_id="r",
        model="m",
        start_ns=0,
        end_ns=10**9,
        ttft_s=0.3,
        e2e_s=1.0,
        breakdown_s={},
        prefill=Endpoint(address="10.1.0.1:8000"),
        decode=Endpoint(address="10.1.0.2:8000"),
        kv=kv,
        picks=[],
        flags=[],
        span_count=8,
        complete=True,
    )
    s = judge(facts, t)
    flags = {f.name: f.evidence for f in s.flags}
    assert "mlx5_10 (VF 0000:2c:00.1 of PF ibp44s0)" in flags["gpu_nic_mismatch"]
    assert s.kv_transfer.path_class == "rdma_cross_rail"


def test_topo_matrix_is_embedded_and_read(tmp_path: Path) -> None:
    matrix = tmp_path / "topo.txt"
    matrix.write_text(
        "\tGPU0\tNIC0\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tPIX\t0-47\t0\n"
        "NIC0\tPIX\t X \n\nNIC Legend:\n\n  NIC0: mlx5_0\n"
    )
    out = collect_record("grace-gb200", tmp_path, "--topo-matrix", str(matrix))
    doc = yaml.safe_load(out.read_text())
    assert "NIC0: mlx5_0" in doc["nodes"][0]["topoMatrix"]
    t = load_paths([out])
    assert any("topoMatrix" in s for s in t.nodes["gb200-oci"].sources)


def test_nvidia_smi_is_run_when_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = tmp_path / "nvidia-smi"
    exe.write_text('#!/bin/sh\necho "\tGPU0\tNIC0"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    text, why = nvidia_smi_topo()
    assert why is None and "GPU0" in text
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert nvidia_smi_topo() == (None, "nvidia-smi not found")


def test_collect_without_sys_folder_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["topology", "collect", "--sysfs-root", str(tmp_path), "--node", "n"]) == 2
    assert "no sys/ folder" in capsys.readouterr().err


def test_collect_to_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = expand(load_record(SYSFS / "azure-gb300-vm.yaml"), tmp_path / "root")
    assert main(["topology", "collect", "--sysfs-root", str(root), "--node", "vm-1"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["kind"] == "Topology" and doc["nodes"][0]["name"] == "vm-1"


class _ConfigMaps(BaseHTTPRequestHandler):
    """The two ConfigMap calls `--configmap` makes (merge PATCH, POST when missing), nothing else."""

    store: dict[str, dict[str, str]] = {}

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, code: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, object]:
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def do_PATCH(self) -> None:
        name = self.path.split("?")[0].rsplit("/", 1)[-1]
        body = self._body()
        if name not in self.store:
            self._reply(
                404,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "code": 404,
                    "reason": "NotFound",
                },
            )
            return
        self.store[name].update(body["data"])  # type: ignore[arg-type]
        self._reply(
            200,
            {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": name}, "data": self.store[name]},
        )

    def do_POST(self) -> None:
        body = self._body()
        name = body["metadata"]["name"]  # type: ignore[index]
        self.store[name] = dict(body["data"])  # type: ignore[arg-type]
        self._reply(201, body)


def test_collect_publishes_one_key_per_node_into_a_configmap(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ConfigMaps)
    _ConfigMaps.store = {}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
                    ],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        root = expand(load_record(SYSFS / "azure-gb300-vm.yaml"), tmp_path / "root")
        for node in ("vm-1", "vm-2"):
            argv = ["topology", "collect", "--sysfs-root", str(root), "--node", node]
            argv += [
                "--configmap",
                "llm-d-tracing/railtrace-collected-topology",
                "--kubeconfig",
                str(kubeconfig),
            ]
            assert main(argv) == 0
        data = _ConfigMaps.store["railtrace-collected-topology"]
        assert set(data) == {"vm-1.yaml", "vm-2.yaml"}
        folder = tmp_path / "mounted"
        folder.mkdir()
        for key, text in data.items():
            (folder / key).write_text(text)
        t = load_paths([folder])
        assert set(t.nodes) == {"vm-1", "vm-2"} and t.nodes["vm-2"].rdma_path is True
    finally:
        server.shutdown()
        server.server_close()


def test_collected_gpus_join_slice_gpus_by_bus_id_not_name(tmp_path: Path) -> None:
    """The collector numbers GPUs in PCI order; a GPU driver may name them otherwise."""
    (tmp_path / "c.yaml").write_text(
        "apiVersion: railtrace.io/v1alpha1\nkind: Topology\ncollected: {by: railtrace topology collect}\n"
        "nodes:\n- name: sriov-node-a\n  gpus:\n"
        "  - {name: gpu-0, index: 0, pciBusID: '0000:2a:00.0', numa: 1}\n"
        "  - {name: gpu-1, index: 1, pciBusID: '0000:99:00.0', numa: 1}\n"
    )
    t = load_paths([FIX / "sriov" / "slices.yaml", tmp_path / "c.yaml"])
    gpu1 = t.gpu("sriov-node-a", "gpu-1")
    assert gpu1.numa == 1 and gpu1.index == 1  # the slice's gpu-1 is at 0000:2a:00.0; its index stays
    assert t.gpu("sriov-node-a", "gpu-0").numa is None
    assert any("gpu-1 at 0000:99:00.0 is not the known gpu-1" in w for w in t.warnings)
