"""The KV shim's C hot path on the Python of vLLM's images (3.12; the suite itself runs on 3.11):
`railtrace-shims` built from source into a fresh 3.12 venv, with nixl-cu12 1.5.1, runs the
bookkeeping tests on both paths and real NIXL loopback transfers (C and Python patches), under
CPython's debug allocator and development mode (API misuse and buffer overruns abort)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _python312() -> str | None:
    for candidate in ("python3.12", str(Path.home() / ".pyenv/versions/3.12.1/bin/python")):
        exe = shutil.which(candidate)
        if exe is None:
            continue
        probe = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
        if probe.returncode == 0 and probe.stdout.startswith("Python 3.12"):
            return exe
    return None


@pytest.mark.slow
@pytest.mark.skipif(sys.version_info[:2] == (3, 12), reason="the suite itself runs on 3.12")
def test_c_hot_path_builds_and_runs_on_python_312(tmp_path: Path) -> None:
    exe = _python312()
    if exe is None:
        pytest.fail("no Python 3.12 on this machine (vLLM's images run 3.12; install python3.12)")
    src = tmp_path / "src"
    shutil.copytree(
        ROOT / "tracing", src, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "build", "*.so")
    )
    venv = tmp_path / "venv"
    subprocess.run([exe, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, str(src), "pytest", "numpy"], check=True, timeout=900)
    subprocess.run([*pip, "--no-deps", "nixl-cu12==1.5.1"], check=True, timeout=600)
    built = subprocess.run(
        [py, "-c", "import railtrace_tracing.kv_transfer._hotpath as h; print(h.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert built.returncode == 0 and "cpython-312" in built.stdout, built.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "RAILTRACE_", "NIXL_", "PYTHON"))}
    env.update({"PYTHONMALLOC": "debug", "PYTHONDEVMODE": "1"})
    tests = [
        "tests/shims/test_kv_hotpath.py",
        "tests/shims/test_kv_patches.py",
        "tests/shims/test_nixl_transfer.py::test_default_transports_give_shm_cma",
        "tests/shims/test_nixl_transfer.py::test_a_post_that_raises_ends_its_span_with_the_error",
    ]
    # The service's conftest (SQLAlchemy, PostgreSQL) is not installed there: these tests need none.
    run = subprocess.run(
        [
            py,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--noconftest",
            "-c",
            "/dev/null",
            "--rootdir",
            str(ROOT),
            *tests,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    summary = run.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, summary  # NIXL ran on 3.12
