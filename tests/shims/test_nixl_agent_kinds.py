"""Only the KV connector's NIXL agents make KV spans; NIXL loaded as `nixl_rocm`; N×5 lists.

Real NIXL transfers between processes (tests/shims/nixl_kinds.py); the vLLM code that creates
each agent is a stand-in named like vLLM's module (vLLM needs a GPU).
"""

from __future__ import annotations

import ast
import json
import logging
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from railtrace_tracing import semconv as sc
from railtrace_tracing.kv_transfer import vllm as vllm_hook
from railtrace_tracing.kv_transfer.recorder import StridedDescriptors, descriptor_bytes
from tests.shims import vllm_wheels
from tests.shims.test_nixl_transfer import run_nixl_module

try:
    import nixl_cu12

    HAVE_NIXL = True
except Exception:
    HAVE_NIXL = False


# How vLLM's code calls NIXL's agent class: `NixlWrapper` (vllm.distributed.nixl_utils) or the
# local alias `nixl_wrapper_cls` (from 0.21.0).
AGENT_FACTORIES = frozenset({"NixlWrapper", "nixl_wrapper_cls", "nixl_agent"})


def _result(proc: Any) -> dict[str, Any]:
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RTRESULT "))
    return json.loads(line.split(" ", 1)[1])  # type: ignore[no-any-return]


@pytest.mark.nixl
@pytest.mark.skipif(not HAVE_NIXL, reason="nixl_cu12 not importable")
@pytest.mark.parametrize("hot_path", ["auto", "python"])  # the C hot path where built, and without
def test_only_the_kv_connector_makes_kv_spans_and_the_ec_connector_its_own(
    tmp_path: Path, hot_path: str
) -> None:
    result = _result(run_nixl_module("tests.shims.nixl_kinds", tmp_path, **{sc.ENV_KV_HOT_PATH: hot_path}))
    assert {u: t["state"] for u, t in result["transfers"].items()} == dict.fromkeys(
        ("eplb", "offload", "kv", "ec"), "DONE"
    )
    assert result["verified"] is True
    assert result["dlists_after_eplb"] == 0  # nothing kept of EPLB's per-transfer lists
    names = sorted(s["name"] for s in result["spans"])
    assert names == [sc.SPAN_EC_TRANSFER, sc.SPAN_KV_TRANSFER]  # nothing from EPLB or KV offload
    [kv] = [s for s in result["spans"] if s["name"] == sc.SPAN_KV_TRANSFER]
    [ec] = [s for s in result["spans"] if s["name"] == sc.SPAN_EC_TRANSFER]
    assert kv["parent_span_id"] == result["request_span_id"]
    assert kv["attributes"][sc.KV_REQUEST_ID] == "kv-kinds-0"
    # N×5 prepped lists: five blocks of 4 KiB picked by index in the expanded list.
    assert kv["attributes"][sc.KV_BYTES] == result["transfers"]["kv"]["bytes"] == 5 * 4096
    assert kv["attributes"][sc.KV_DESCRIPTORS] == 5
    # The EC span has the KV span's transport and peer facts, and no request of its own.
    assert ec["attributes"][sc.KV_TRANSPORT] == "shm" and ec["attributes"][sc.KV_DEVICES] == ["cma/memory"]
    assert ec["attributes"][sc.KV_BYTES] == result["transfers"]["ec"]["bytes"]
    assert sc.KV_REQUEST_ID not in ec["attributes"]


def rocm_package(root: Path) -> Path:
    """A `nixl_rocm` package made of nixl-cu12's own files (NIXL's ROCm wheel has the same
    layout: `_api`, `_bindings`, `_utils`, `logging`), its bundled libraries beside it."""
    src = Path(nixl_cu12.__file__).parent
    pkg = root / "nixl_rocm"
    pkg.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix in (".py", ".so"):
            (pkg / f.name).symlink_to(f)
    # The extension's RPATH: $ORIGIN/../.nixl_cu12.mesonpy.libs and $ORIGIN/../nixl_cu12.libs.
    for libs in (".nixl_cu12.mesonpy.libs", "nixl_cu12.libs"):
        if (src.parent / libs).exists():
            (root / libs).symlink_to(src.parent / libs)
    return root


@pytest.mark.nixl
@pytest.mark.skipif(not HAVE_NIXL, reason="nixl_cu12 not importable")
def test_nixl_loaded_as_nixl_rocm_is_patched_and_traced(tmp_path: Path) -> None:
    proc = _run_rocm(tmp_path, rocm_package(tmp_path / "rocm"))
    result = _result(proc)
    assert result["backend"] == "nixl_rocm" and result["nixl_agent_module"] == "nixl_rocm._api"
    assert result["patched"] == ["nixl_rocm._api.nixl_agent"]
    [kv] = result["spans"]
    assert kv["name"] == sc.SPAN_KV_TRANSFER and kv["attributes"][sc.KV_BYTES] == 5 * 4096
    assert "patched no NIXL module" not in proc.stderr


def _run_rocm(tmp_path: Path, root: Path) -> Any:
    from tests.shims.test_nixl_transfer import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "RAILTRACE_", "NIXL_"))}
    env.update({"UCX_NET_DEVICES": "lo", "RAILTRACE_UCX_LOG": str(tmp_path / "ucx.%p.log")})
    return subprocess.run(
        [sys.executable, "-m", "tests.shims.nixl_kinds", "--rocm", str(root)],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    )


# -- logic (no NIXL) ------------------------------------------------------------------------


def test_agent_kind_by_creating_module(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    assert vllm_hook.agent_kind("my_service.kv") == vllm_hook.KIND_KV  # outside vLLM: every agent
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    v1 = "vllm.distributed.kv_transfer.kv_connector.v1"
    for creator in (f"{v1}.nixl_connector", f"{v1}.nixl.worker", f"{v1}.nixl.base_worker"):
        assert vllm_hook.agent_kind(creator) == vllm_hook.KIND_KV
    assert vllm_hook.agent_kind("vllm.distributed.ec_transfer.ec_connector.cpu.data.nixl") == "ec"
    caplog.set_level(logging.INFO, logger="railtrace_tracing")
    for creator in (
        "vllm.distributed.eplb.eplb_communicator",
        "vllm.v1.kv_offload.tiering.obj.manager",
        "vllm.v1.kv_offload.tiering.p2p.data.nixl",
        f"{v1}.nixl_connector_extra",  # a sibling of the connector module is not it
        "ray.experimental.rdt",
        None,
    ):
        assert vllm_hook.agent_kind(creator) is None
    assert vllm_hook.agent_kind("vllm.distributed.eplb.eplb_communicator") is None
    logged = [r.getMessage() for r in caplog.records if "not traced" in r.getMessage()]
    assert len(logged) == 6 and "eplb_communicator" in logged[0]  # once per creating module
    vllm_hook.uninstall()


def test_warns_once_when_nixl_is_loaded_and_nothing_could_be_patched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NIXL's meta package aliasing a backend the shim does not watch (here `nixl_cu99`)."""
    (tmp_path / "nixl_cu99").mkdir()
    (tmp_path / "nixl_cu99" / "__init__.py").write_text("")
    (tmp_path / "nixl_cu99" / "_api.py").write_text("class nixl_agent:\n    pass\n")
    (tmp_path / "nixl").mkdir()
    (tmp_path / "nixl" / "__init__.py").write_text(
        "import importlib, sys\nsys.modules['nixl._api'] = importlib.import_module('nixl_cu99._api')\n"
    )
    code = (
        "import logging, sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "from railtrace_tracing.kv_transfer import NixlKVTransferInstrumentor\n"
        "inst = NixlKVTransferInstrumentor(); inst.instrument(vllm_hook=False)\n"
        "import nixl\n"
        "inst._check_patched()\n"
        "print('PATCHED', len(inst._patched))\n"
    )
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "PATCHED 0" in proc.stdout
    assert proc.stderr.count("patched no NIXL module") == 1, proc.stderr
    assert "nixl._api" in proc.stderr


def test_strided_descriptor_bytes() -> None:
    rows = np.array([[0x1000, 4096, 0, 4096, 3], [0x9000, 512, 0, 1024, 2]], dtype=np.uint64)
    strided = StridedDescriptors(rows)
    assert strided.count == 5 and strided.total() == 3 * 4096 + 2 * 512
    assert strided.take([0, 2, 3, 4]) == 2 * 4096 + 2 * 512
    assert strided.take(np.array([4, 4])) == 1024
    assert strided.take([5]) is None and strided.take([-1]) is None
    assert descriptor_bytes(rows) == (3 * 4096 + 2 * 512, 5)
    assert descriptor_bytes(rows, [1, 3]) == (4096 + 512, 2)
    # N×3 lists keep their per-row reading
    assert descriptor_bytes(np.array([[0, 100, 0], [0, 50, 0]])) == (150, 2)


@pytest.mark.parametrize("version", vllm_wheels.versions())
def test_the_kv_connector_agent_of_every_release_is_traced_as_kv(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In each release's own source (the wheel), every module of the KV-transfer tree that creates
    a NIXL agent (`NixlWrapper(...)` or vLLM's `nixl_wrapper_cls(...)`) is one the shim traces
    as KV, and there is at least one."""
    if not vllm_wheels.have(version):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"vLLM {version} wheel missing from {vllm_wheels.CACHE}: run scripts/setup-test-env")
        pytest.skip(f"vLLM {version} not in {vllm_wheels.CACHE} (scripts/setup-test-env fetches it)")
    root = vllm_wheels.tree(version)
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    creators = []
    for path in sorted((root / "vllm" / "distributed" / "kv_transfer").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        calls = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in AGENT_FACTORIES
        ]
        if calls:
            creators.append(".".join(path.relative_to(root).with_suffix("").parts))
    assert creators, f"vLLM {version}: no NIXL agent created in the KV-transfer tree"
    for module in creators:
        assert vllm_hook.agent_kind(module) == vllm_hook.KIND_KV, (version, module)
