"""railtrace-shims installs alone (as into a vLLM image) and pulls in OpenTelemetry, wrapt and their
own dependencies only, never the service's (FastAPI, SQLAlchemy, the Kubernetes client …)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What the shims' five requirements bring with them (OpenTelemetry's own dependency tree).
ALLOWED = {
    "railtrace-shims",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-instrumentation",
    "opentelemetry-semantic-conventions",
    "opentelemetry-exporter-otlp-proto-http",
    "opentelemetry-exporter-otlp-proto-common",
    "opentelemetry-exporter-otlp-common",
    "opentelemetry-exporter-http-transport",
    "opentelemetry-proto",
    "protobuf",
    "googleapis-common-protos",
    "wrapt",
    "deprecated",
    "importlib-metadata",
    "zipp",
    "typing-extensions",
    "packaging",
    "requests",
    "urllib3",
    "idna",
    "certifi",
    "charset-normalizer",
    "pip",
    "setuptools",
}
SERVICE_ONLY = {
    "railtrace",
    "fastapi",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "kubernetes",
    "pydantic",
    "grpcio",
    "orjson",
    "httpx",
    "prometheus-client",
    "numpy",
}

CHECK = textwrap.dedent(
    """
    import importlib.util, json, os, sys
    from importlib.metadata import entry_points
    before = dict(os.environ)
    from railtrace_tracing.kv_transfer import vllm
    vllm.register()  # RAILTRACE_SHIMS unset: nothing happens
    print(json.dumps({
        "plugins": [e.value for e in entry_points(group="vllm.general_plugins")],
        "instrumentors": sorted(e.name for e in entry_points(group="opentelemetry_instrumentor")),
        "env_same": dict(os.environ) == before,
        "service_imported": "railtrace" in sys.modules,
        "hot_path_built": importlib.util.find_spec("railtrace_tracing.kv_transfer._hotpath") is not None,
    }))
    """
)


INSTALLED_FILES = """
from importlib.metadata import files
print("\\n".join(str(f) for f in files("railtrace-shims") or []))
"""


@pytest.mark.slow
def test_shims_install_alone_with_opentelemetry_and_wrapt_only(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(
        ROOT / "tracing", src, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "build", "*.so")
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(src)],
        check=True,
        timeout=600,
    )
    listed = subprocess.run(
        [str(py), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    names = {p["name"].lower().replace("_", "-") for p in json.loads(listed)}
    assert "railtrace-shims" in names and "wrapt" in names and "opentelemetry-sdk" in names
    assert not names & SERVICE_ONLY, names & SERVICE_ONLY
    assert names <= ALLOWED, f"unexpected dependencies: {sorted(names - ALLOWED)}"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run(
        [str(py), "-c", CHECK], cwd=tmp_path, env=env, check=True, capture_output=True, text=True, timeout=60
    ).stdout
    result = json.loads(out)
    assert result["plugins"] == ["railtrace_tracing.kv_transfer.vllm:register"]
    assert result["instrumentors"] == ["railtrace_gateway", "railtrace_nixl"]
    assert result["env_same"] and not result["service_imported"]
    assert result["hot_path_built"]  # compiled from kv_transfer/_hotpath.c at install
    # Nothing of the build (pyproject, a setup script, a doc generator) lands in the image as a module:
    # every installed file is the package's own or the distribution's metadata.
    installed = subprocess.run(
        [str(py), "-c", INSTALLED_FILES], check=True, capture_output=True, text=True, timeout=60
    ).stdout.split()
    strays = [
        f
        for f in installed
        if not f.startswith(("railtrace_tracing/", "railtrace_shims-"))
        or f.rsplit("/", 1)[-1] in {"setup.py", "docgen.py", "pyproject.toml"}
    ]
    assert installed and not strays, strays

    # An image without a C compiler: the install still succeeds, and the shim uses its Python patches.
    shutil.rmtree(src / "build", ignore_errors=True)  # else setuptools reuses the first build
    subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--force-reinstall",
            str(src),
        ],
        check=True,
        timeout=600,
        env={**os.environ, "CC": "/bin/false"},
    )
    out = subprocess.run(
        [str(py), "-c", CHECK], cwd=tmp_path, env=env, check=True, capture_output=True, text=True, timeout=60
    ).stdout
    result = json.loads(out)
    assert not result["hot_path_built"] and result["env_same"] and not result["service_imported"]
