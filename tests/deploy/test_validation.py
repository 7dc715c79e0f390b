"""Offline validation of deploy/: the real tools a cluster operator's CI would run.

`kubectl kustomize` builds every overlay; `kubernetes-validate --strict` checks every core
object against the Kubernetes OpenAPI schemas (unknown fields are errors); the
prometheus-operator objects are checked with `check-jsonschema` against the vendored CRD
schemas in tests/deploy/schemas/; the rules inside the PrometheusRule go through `promtool`.
Each gate is also shown to reject a broken object, so a green run means something.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.deploy_render import OVERLAYS, REPO, SCHEMAS, by_kind, find_tool, render, render_text

KUBERNETES_VERSIONS = ("1.30.0", "1.34.0")
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


def _run(cmd: list[str], timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def _kubernetes_validate(path: Path, version: str) -> subprocess.CompletedProcess[str]:
    tool = find_tool("kubernetes-validate")
    if tool is None:
        pytest.skip("kubernetes-validate not installed (pip install kubernetes-validate)")
    return _run([tool, "--strict", "-k", version, str(path)])


def _check_jsonschema(
    schema: Path, docs: list[dict[str, Any]], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    tool = find_tool("check-jsonschema")
    if tool is None:
        pytest.skip("check-jsonschema not installed (pip install check-jsonschema)")
    files = []
    for i, doc in enumerate(docs):
        path = tmp_path / f"{doc['kind']}-{i}.json"
        path.write_text(json.dumps(doc))
        files.append(str(path))
    return _run([tool, "--schemafile", str(schema), *files])


@pytest.mark.parametrize("target", ["base", *(f"overlays/{o}" for o in OVERLAYS)])
def test_base_and_every_overlay_build(target: str) -> None:
    docs = render(target)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ServiceAccount", "ClusterRole", "NetworkPolicy"} <= kinds
    names = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), "an object is defined twice"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_objects_pass_kubernetes_validate_strict(overlay: str, version: str, tmp_path: Path) -> None:
    rendered = tmp_path / f"{overlay}.yaml"
    rendered.write_text(render_text(f"overlays/{overlay}"))
    result = _kubernetes_validate(rendered, version)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "ERROR" not in output, output
    # Only the CRD-backed kinds may go unvalidated here; they are checked against their schemas below.
    for line in output.splitlines():
        if "Couldn't find schema" in line:
            assert any(f"kind {kind} " in line for kind in CRD_KINDS), line


def test_kubernetes_validate_strict_rejects_a_misspelt_field(tmp_path: Path) -> None:
    deployment = copy.deepcopy(by_kind(render("overlays/dev"), "Deployment")[0])
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbez"] = container.pop("readinessProbe")
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(deployment))
    result = _kubernetes_validate(path, KUBERNETES_VERSIONS[-1])
    assert result.returncode != 0
    assert "readinessProbez" in result.stdout + result.stderr


@pytest.mark.parametrize("kind", sorted(CRD_KINDS))
def test_custom_resources_match_their_crd_schemas(kind: str, tmp_path: Path) -> None:
    docs = by_kind(render("overlays/production"), kind)
    assert docs, f"production renders no {kind}"
    result = _check_jsonschema(SCHEMAS / f"{kind.lower()}.schema.yaml", docs, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_crd_schemas_reject_broken_objects(tmp_path: Path) -> None:
    docs = render("overlays/production")
    monitor = copy.deepcopy(by_kind(docs, "ServiceMonitor")[0])
    monitor["spec"]["endpoints"][0]["interval"] = "30 seconds"
    result = _check_jsonschema(SCHEMAS / "servicemonitor.schema.yaml", [monitor], tmp_path)
    assert result.returncode != 0, "a malformed scrape interval passed"

    rule = copy.deepcopy(by_kind(docs, "PrometheusRule")[0])
    first = rule["spec"]["groups"][0]["rules"][0]
    first["record"] = "also:a_recording_rule"  # alert and record at once
    result = _check_jsonschema(SCHEMAS / "prometheusrule.schema.yaml", [rule], tmp_path)
    assert result.returncode != 0, "a rule that is both alert and record passed"


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not found (Debian package `prometheus`): rules not checked")
    return path


def test_prometheusrule_rules_pass_promtool(tmp_path: Path) -> None:
    promtool = _promtool()
    (rule,) = by_kind(render("overlays/production"), "PrometheusRule")
    # promtool reads a plain rule file, which is exactly the CRD's spec.
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    result = _run([promtool, "check", "rules", str(rules_file)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    promtool = _promtool()
    broken = {"groups": [{"name": "g", "rules": [{"alert": "Broken", "expr": "sum by (namespace ("}]}]}
    rules_file = tmp_path / "broken.yaml"
    rules_file.write_text(yaml.safe_dump(broken))
    assert _run([promtool, "check", "rules", str(rules_file)]).returncode != 0


def test_generated_copies_are_in_sync() -> None:
    """collector_config/ and dashboards/generated/ are copied into deploy/components/."""
    result = _run([sys.executable, str(REPO / "deploy" / "sync_generated.py"), "--check"])
    assert result.returncode == 0, result.stderr
