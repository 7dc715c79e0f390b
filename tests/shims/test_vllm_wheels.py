"""The KV shim against vLLM's real source: the oldest, a middle and the newest supported release.

The wheels come from PyPI (`pip download --no-deps`, cached by tests.shims.vllm_wheels, which
scripts/setup-test-env runs). Under `CI=true` a missing wheel fails the run instead of skipping.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

from railtrace_tracing.kv_transfer import vllm as hook
from tests.shims import vllm_wheels

ROOT = Path(__file__).resolve().parents[2]


def _tree(version: str) -> Path:
    if vllm_wheels.have(version):
        return vllm_wheels.tree(version)
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"vLLM {version} wheel missing from {vllm_wheels.CACHE}: run scripts/setup-test-env")
    try:
        return vllm_wheels.fetch(version)
    except Exception as exc:  # offline developer machine
        pytest.skip(f"vLLM {version} wheel not available: {exc}")


def _v(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split(".")[:2])


def _methods(path: Path) -> dict[tuple[str, str], tuple[str, ...]]:
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    out[(node.name, item.name)] = tuple(a.arg for a in item.args.args)
    return out


@pytest.mark.parametrize("version", vllm_wheels.versions())
def test_every_patched_symbol_exists_with_the_expected_signature(version: str) -> None:
    tree = _tree(version)
    known = []
    for layout in ("module", "package"):
        kinds = hook.groups(layout)
        ok = {}
        for kind, targets in kinds.items():
            if kind not in hook.REQUIRED_KINDS:
                continue
            present = []
            for target in targets:
                file = (tree / Path(*target.module.split("."))).with_suffix(".py")
                params = _methods(file).get((target.cls, target.method)) if file.exists() else None
                if params is not None:  # a method the hook wraps must have the parameters it reads
                    assert params[: len(target.params)] == target.params, (version, target, params)
                    present.append(target.method)
            ok[kind] = bool(present)
        if all(ok.values()):
            known.append(layout)
    assert known == ["module" if _v(version) < (0, 20) else "package"], (version, known)


@pytest.mark.parametrize("version", vllm_wheels.versions())
def test_real_connector_imports_patches_and_calls_through(version: str) -> None:
    tree = _tree(version)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.shims.vllm_probe", str(tree)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RTPROBE "))
    out: dict[str, Any] = json.loads(line[8:])
    targets = [t for t in hook.TARGETS if t.layout == out["layout"]]
    assert all(file.startswith(str(tree)) for _, file in out["imported"])  # vLLM's own files
    called = [t for t in targets if f"{t.cls}.{t.method}" in out["calls"]]
    # Each method wrapped once, on the class that defines it (aliases share it).
    assert out["patched"] == sorted({out["calls"][f"{t.cls}.{t.method}"]["owner"] for t in called})
    kinds = {t.kind for t in called}
    assert set(hook.REQUIRED_KINDS) <= kinds
    assert ("worker_push" in kinds) is (_v(version) >= (0, 24))
    public = "cmpl-abc-0" if out["adds_suffix"] else "cmpl-abc-0-1a2b3c4d"
    for t in called:
        call = out["calls"][f"{t.cls}.{t.method}"]
        assert call["wrapped"]
        if t.kind == "metadata":
            assert call["real_req_meta"] == t.module and call["headers_on_meta"]
            continue
        # vLLM's own body ran inside the wrapper (the probe object raised from within it).
        owner_file = call["owner"].rsplit(".", 2)[0].replace(".", "/") + ".py"
        assert call["raised_in"] and call["raised_in"][-1].endswith(owner_file)
        if t.kind == "scheduler":
            assert call["headers_in_params"]["traceparent"].startswith("00-0af76519")
            continue
        scope = call["scope"]
        assert scope["request_id"] == public and scope["parent"] is True
        assert scope["remote_engine_id"] == "prefill-engine-7" and scope["remote_host"] == "10.0.0.7"
        attrs = scope["attributes"]
        assert attrs["llm_d.kv_transfer.vllm.request_id"] == "cmpl-abc-0-1a2b3c4d"
        assert attrs["llm_d.kv_transfer.mode"] == ("push" if t.kind == "worker_push" else "pull")
        if t.kind == "worker_push":
            assert call["thread"] == "push-writer"


def test_unknown_layout_logs_one_warning_naming_the_version(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake_vllm = types.ModuleType("vllm")
    fake_vllm.__version__ = "0.99.0"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm)
    hook.uninstall()
    try:
        caplog.set_level(logging.WARNING, logger="railtrace_tracing")
        renamed = types.ModuleType(hook.PACKAGE + ".pull_worker")
        renamed.NixlPullConnectorWorker = type("NixlPullConnectorWorker", (), {"_read_blocks": lambda s: 0})
        assert hook.patch_module(renamed) == []
        assert hook.patch_module(renamed) == []
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "0.99.0" in warnings[0].getMessage()
        assert "NixlPullConnectorWorker._read_blocks_for_req" in warnings[0].getMessage()
    finally:
        hook.uninstall()


PLUGIN_CHECK = textwrap.dedent(
    """
    import json, os, sys, types
    tree = sys.argv[1]
    # vLLM's real plugin loader and envs.py from the wheel; the package's __init__ (which imports
    # torch and the engine) is replaced by a namespace carrying the version only.
    pkg = types.ModuleType("vllm"); pkg.__path__ = [tree + "/vllm"]; pkg.__version__ = sys.argv[2]
    sys.modules["vllm"] = pkg
    import vllm.plugins as plugins
    assert plugins.__file__.startswith(tree)
    env_before = dict(os.environ)
    modules_before = set(sys.modules)
    meta_before = list(sys.meta_path)
    import wrapt.importer as wi
    hooks_before = {k: len(v or []) for k, v in wi._post_import_hooks.items()}
    plugins.load_general_plugins()
    loaded = sorted(m for m in set(sys.modules) - modules_before)
    from railtrace_tracing.kv_transfer import NixlKVTransferInstrumentor
    print("RTPLUGIN " + json.dumps({
        "env_changed": sorted(
            k for k in set(os.environ) | set(env_before) if os.environ.get(k) != env_before.get(k)
        ),
        "nixl_imported": [m for m in sys.modules if m.startswith(("nixl", "nixl_cu12"))],
        "meta_path_same": list(sys.meta_path) == meta_before or [type(f).__name__ for f in sys.meta_path],
        "hooks_added": sorted(
            k for k, v in wi._post_import_hooks.items() if len(v or []) != hooks_before.get(k, 0)
        ),
        "instrumented": NixlKVTransferInstrumentor().is_instrumented_by_opentelemetry,
        "railtrace_loaded": [m for m in loaded if m.startswith("railtrace_tracing.kv_transfer.vllm")],
    }))
    """
)


@pytest.mark.parametrize("version", [hook.MATRIX[0], hook.MATRIX[-1]])
@pytest.mark.parametrize("enabled", [False, True])
def test_vllm_plugin_loader_is_inert_until_enabled(version: str, enabled: bool) -> None:
    tree = _tree(version)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAILTRACE_", "UCX_", "VLLM_", "OTEL_"))}
    if enabled:
        env["RAILTRACE_SHIMS"] = "nixl"
    proc = subprocess.run(
        [sys.executable, "-c", PLUGIN_CHECK, str(tree), version],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RTPLUGIN "))[9:])
    assert out["railtrace_loaded"], "the railtrace entry point was not loaded by vLLM's loader"
    assert out["env_changed"] == [] and out["nixl_imported"] == []
    if not enabled:
        assert out["hooks_added"] == [] and out["instrumented"] is False and out["meta_path_same"] is True
    else:  # import hooks only: nixl and the connector are patched when vLLM imports them
        assert out["instrumented"] is True
        assert set(hook.MODULES) <= set(out["hooks_added"]) and "nixl_cu12._api" in out["hooks_added"]


def test_nixl_agent_in_a_vllm_process_with_nothing_hooked_warns_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A future vLLM that moved its connector elsewhere: no watched module is ever imported, so
    the first NIXL agent is where the shim notices, and says which vLLM it is."""
    fake_vllm = types.ModuleType("vllm")
    fake_vllm.__version__ = "0.99.1"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake_vllm)
    for name in hook.MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    hook.uninstall()
    hook.install()
    try:
        caplog.set_level(logging.WARNING, logger="railtrace_tracing")
        hook.check_layout_used()
        hook.check_layout_used()
        [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert "vLLM 0.99.1" in warning.getMessage() and "was imported" in warning.getMessage()
    finally:
        hook.uninstall()
