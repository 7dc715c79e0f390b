"""The real collector for tests: built by scripts/build-otelcol, plus the configurations it runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-otelcol"

# Environment the manifests set (collector_config/README.md), with plausible values.
CONFIG_ENV = {
    "SAMPLER_HEADLESS_SERVICE": "otelcol-sampler-headless.llm-d-tracing.svc.cluster.local",
    "TRACE_STORE_OTLP_ENDPOINT": "jaeger-collector:4317",
    "POD_NAME": "otelcol-sampler-0",
}

# Components the configurations use that the built collector lacks: the Go module proxy serves no
# version of the servicegraph connector (scripts/otelcol-builder.yaml). The contrib image the
# manifests run has it. test_otelcol_validate checks that this list is exactly what is missing.
NOT_IN_BUILD: dict[str, set[str]] = {"connectors": {"servicegraph"}}

_built: list[Path] = []


def otelcol_binary() -> Path:
    """Path of the collector, building it on first use (the script's last stdout line)."""
    if not _built:
        # A cold build takes many minutes; scripts/setup-test-env builds it beforehand.
        done = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3600, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"scripts/build-otelcol failed ({done.returncode}):\n{done.stderr[-4000:]}")
        lines = done.stdout.strip().splitlines()
        assert lines, "scripts/build-otelcol printed no path"
        path = Path(lines[-1])
        assert path.is_file() and os.access(path, os.X_OK), path
        _built.append(path)
    return _built[0]


def is_collector_config(doc: Any) -> bool:
    return isinstance(doc, dict) and "receivers" in doc and "service" in doc


def deploy_collector_configs() -> dict[str, str]:
    """Every collector configuration deploy/ turns into a ConfigMap, by a readable name.

    Two shapes: files a kustomization's configMapGenerator packs, and ConfigMap objects written
    out in full whose data values are collector configurations.
    """
    found: dict[str, str] = {}
    deploy = REPO / "deploy"
    for kustomization in sorted(deploy.rglob("kustomization.yaml")):
        spec = yaml.safe_load(kustomization.read_text()) or {}
        for generator in spec.get("configMapGenerator") or []:
            for entry in generator.get("files") or []:
                key, _, rel = str(entry).rpartition("=")
                path = kustomization.parent / rel
                text = path.read_text()
                if is_collector_config(yaml.safe_load(text)):
                    name = f"{path.relative_to(REPO)} (ConfigMap {generator['name']}, key {key or path.name})"
                    found[name] = text
    for manifest in sorted(deploy.rglob("*.yaml")):
        for doc in yaml.safe_load_all(manifest.read_text()):
            if not (isinstance(doc, dict) and doc.get("kind") == "ConfigMap"):
                continue
            for key, value in (doc.get("data") or {}).items():
                if isinstance(value, str) and is_collector_config(yaml.safe_load(value)):
                    found[
                        f"{manifest.relative_to(REPO)} (ConfigMap {doc['metadata']['name']}, key {key})"
                    ] = value
    return found


def without_unbuilt(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The configuration less the NOT_IN_BUILD components, and the ids removed."""
    removed: list[str] = []
    for kind, types in NOT_IN_BUILD.items():
        section = config.get(kind) or {}
        for cid in list(section):
            if cid.split("/", 1)[0] in types:
                del section[cid]
                removed.append(cid)
    for pipeline in (config.get("service") or {}).get("pipelines", {}).values():
        for role in ("receivers", "exporters"):
            if role in pipeline:
                pipeline[role] = [c for c in pipeline[role] if c not in removed]
    return config, removed
