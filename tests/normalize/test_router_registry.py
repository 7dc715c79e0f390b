"""llm-d-router's own registry of names is the oracle for railtrace's table, checked mechanically.

The router publishes the spans and attributes it emits as a Weaver registry; railtrace keeps a
reduced copy per release in tests/fixtures/llmd_router_registry/ (`scripts/refresh-router-
registry`, docs/normalisation.md section 9). Every span name a release declares must be classified
by the normalisation table, and every `llm_d.*` attribute railtrace reads must be declared by a
kept release or listed below as a name of an older release, with the release named.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from railtrace.model import Span
from railtrace.normalize import normalize_span
from railtrace.normalize.table import PARALLEL_DISPATCH_ATTRS, lookup
from railtrace_tracing import semconv

ROOT = Path(__file__).resolve().parents[2]
REGISTRIES = ROOT / "tests" / "fixtures" / "llmd_router_registry"
SCRIPT = ROOT / "scripts" / "refresh-router-registry"
SOURCES = ROOT / "api" / "railtrace"
EPP_SCHEDULING_SCOPE = "llm-d-router/pkg/epp/scheduling"  # pkg/epp/scheduling/constants.go

# `llm_d.*` attributes railtrace reads that no kept registry declares: names of releases before
# the registry existed (docs/normalisation.md section 7 cites each), read so those still work.
OLDER_RELEASES: dict[str, str] = {
    "llm_d.profile_handler.decision": "v0.8.0 (disagg_profile_handler.go, before the `llm_d.epp.` prefix)",
}
# Attributes under `llm_d.` that railtrace itself defines (its shims), not llm-d.
OWN = {a.key for a in semconv.ATTRIBUTES if a.origin == "railtrace"}
ATTRIBUTE_NAME = re.compile(r"llm_d\.[a-z0-9_]+(?:\.[a-z0-9_]+)+")


def _registries() -> dict[str, dict[str, object]]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted(REGISTRIES.glob("*/registry.json"))}


def _declared_attributes() -> set[str]:
    return {k for reg in _registries().values() for k in reg["attributes"]}  # type: ignore[attr-defined]


def _read_by_railtrace() -> set[str]:
    """Every `llm_d.*` attribute key railtrace reads: the llm-d names of its registry of names,
    and any such key written as a literal in the service's code (not a span name)."""
    keys = {a.key for a in semconv.ATTRIBUTES if a.origin == "llm-d" and a.key.startswith("llm_d.")}
    keys |= set(PARALLEL_DISPATCH_ATTRS)
    for path in SOURCES.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                value = node.value
                span_name = lookup(value) is not None or value in semconv.SPAN_NAMES
                if ATTRIBUTE_NAME.fullmatch(value) and not span_name:
                    keys.add(value)
    return {k for k in keys if k not in OWN and not k.startswith(semconv.SPAN_KV_TRANSFER + ".")}


def test_a_registry_is_kept_with_its_provenance() -> None:
    registries = _registries()
    assert registries, "no release of llm-d-router's registry kept"
    provenance = (REGISTRIES / "PROVENANCE.md").read_text()
    for release, reg in registries.items():
        assert reg["repository"] == "llm-d/llm-d-router" and reg["commit"] and reg["date"], release
        assert f"`{release}/registry.json`" in provenance and str(reg["commit"]) in provenance, release
        assert reg["spans"] and reg["attributes"], release


@pytest.mark.parametrize("release", sorted(_registries()))
def test_every_declared_span_is_classified(release: str) -> None:
    for span in _registries()[release]["spans"]:  # type: ignore[attr-defined]
        name = span["name"]
        assert lookup(name) is not None, f"{release}: span {name!r} is in no row of normalize/table.py"
        received = Span(
            trace_id="0af7651916cd43dd8448eb211c80319c",
            span_id="b7ad6b7169203331",
            parent_span_id=None,
            name=name,
            kind=1,
            start_ns=1,
            end_ns=2,
            service_name="llm-d-router/epp",
            scope_name=EPP_SCHEDULING_SCOPE,
        )
        normalize_span(received)
        assert received.role != semconv.ROLE.OTHER, f"{release}: {name!r} from the EPP is unclassified"


def test_every_llm_d_attribute_railtrace_reads_is_declared() -> None:
    declared = _declared_attributes()
    read = _read_by_railtrace()
    assert read, "found no llm_d.* attribute read by railtrace: the scan is broken"
    unknown = sorted(k for k in read if k not in declared and k not in OLDER_RELEASES)
    assert not unknown, (
        f"read by railtrace, declared by no kept llm-d-router registry and not listed as an older "
        f"release's name: {unknown}"
    )


def test_older_release_names_are_not_declared_now() -> None:
    """A name listed as an older release's must really be gone from the kept registries."""
    declared = _declared_attributes()
    assert not [k for k in OLDER_RELEASES if k in declared]


def test_the_refresh_script_reduces_a_weaver_checkout(tmp_path: Path) -> None:
    """The script on a checkout laid out like the router's: a git repository with the registry."""
    checkout = tmp_path / "router"
    registry = checkout / "pkg" / "common" / "observability" / "semconv" / "registry"
    registry.mkdir(parents=True)
    span_group = {
        "id": "span.example",
        "type": "span",
        "span_kind": "internal",
        "annotations": {"span.name": "example_span"},
        "attributes": [{"ref": "llm_d.example.count", "requirement_level": "required"}],
    }
    attr_group = {
        "id": "registry.example",
        "type": "attribute_group",
        "attributes": [{"id": "llm_d.example.count", "type": "int", "brief": "not kept"}],
    }
    (registry / "spans.yaml").write_text(yaml.safe_dump({"groups": [span_group]}))
    (registry / "attributes.yaml").write_text(yaml.safe_dump({"groups": [attr_group]}))
    (registry / "manifest.yaml").write_text(yaml.safe_dump({"schema_url": "https://example.invalid/1"}))
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "registry"], check=True)
    out = tmp_path / "fixtures"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(checkout), "v9.9.9", str(out)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    reg = json.loads((out / "v9.9.9" / "registry.json").read_text())
    want = {"name": "example_span", "kind": "internal", "attributes": ["llm_d.example.count"]}
    assert reg["spans"] == [want]
    assert reg["attributes"] == {"llm_d.example.count": "int"}
    assert len(reg["commit"]) == 40 and reg["schema_url"] == "https://example.invalid/1"
    assert "`v9.9.9/registry.json`" in (out / "PROVENANCE.md").read_text()
    nothing = [sys.executable, str(SCRIPT), str(tmp_path / "nothing"), "v0", str(out)]
    missing = subprocess.run(nothing, capture_output=True, text=True)
    assert missing.returncode == 1 and "missing" in missing.stderr
