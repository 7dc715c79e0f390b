"""The real collector's own `validate` on every configuration railtrace ships.

The binary comes from scripts/build-otelcol (OpenTelemetry Collector Builder, one pinned release,
modules from the Go module proxy). Each file in collector_config/ and each collector ConfigMap in
deploy/ is validated as shipped, less only the components in NOT_IN_BUILD, which the Go module
proxy does not serve; test_components_cover_the_configs keeps that list honest.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.collector.otelcol import (
    CONFIG_ENV,
    NOT_IN_BUILD,
    REPO,
    deploy_collector_configs,
    is_collector_config,
    otelcol_binary,
    without_unbuilt,
)

KINDS = ("receivers", "processors", "exporters", "connectors", "extensions")
# From the pinned release on, some components have lower_snake_case names and keep the old ones
# as deprecated aliases. The configurations use the old names: the contrib image they target
# (0.120.0) knows no other, and validate above shows the release still takes them.
RENAMED = {
    "processors": {"k8sattributes": "k8s_attributes"},
    "exporters": {"loadbalancing": "load_balancing", "otlp": "otlp_grpc", "otlphttp": "otlp_http"},
    "connectors": {"spanmetrics": "span_metrics"},
}


def _shipped_configs() -> dict[str, str]:
    configs = {
        str(p.relative_to(REPO)): p.read_text()
        for p in sorted((REPO / "collector_config").rglob("*"))
        if p.suffix in (".yaml", ".yml") and is_collector_config(yaml.safe_load(p.read_text()))
    }
    configs.update(deploy_collector_configs())
    return configs


SHIPPED = _shipped_configs()


@pytest.fixture(scope="module")
def otelcol() -> Path:
    return otelcol_binary()


def _validate(otelcol: Path, config: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return subprocess.run(
        [str(otelcol), "validate", f"--config={path}"],
        env={**os.environ, **CONFIG_ENV},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_every_shipped_configuration_is_found() -> None:
    # Both tiers, each in collector_config/ and as the ConfigMap deploy/ generates from its copy.
    assert any(name.startswith("collector_config/tier1") for name in SHIPPED)
    assert any(name.startswith("collector_config/tier2") for name in SHIPPED)
    assert sum(name.startswith("deploy/") for name in SHIPPED) >= 2, sorted(SHIPPED)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_otelcol_validate_accepts(name: str, otelcol: Path, tmp_path: Path) -> None:
    config, removed = without_unbuilt(yaml.safe_load(SHIPPED[name]))
    done = _validate(otelcol, config, tmp_path)
    assert done.returncode == 0, (
        f"otelcol validate rejected {name} (less {removed}):\n{done.stderr}{done.stdout}"
    )


def test_otelcol_validate_rejects_a_broken_configuration(otelcol: Path, tmp_path: Path) -> None:
    # validate must judge component settings, not only parse YAML: an unknown routing key for the
    # load balancer and an OTTL statement that does not parse each fail it.
    tier1 = yaml.safe_load((REPO / "collector_config" / "tier1-loadbalancer.yaml").read_text())
    tier1["exporters"]["loadbalancing"]["routing_key"] = "traceId"
    assert _validate(otelcol, tier1, tmp_path).returncode != 0
    tier2, _ = without_unbuilt(yaml.safe_load((REPO / "collector_config" / "tier2-sampler.yaml").read_text()))
    tier2["processors"]["transform/mark"]["trace_statements"][0]["statements"].append(
        'set(attributes["llm_d.sampling.keep"], "x") where name =='
    )
    assert _validate(otelcol, tier2, tmp_path).returncode != 0


def test_components_cover_the_configs(otelcol: Path) -> None:
    done = subprocess.run(
        [str(otelcol), "components"], capture_output=True, text=True, timeout=60, check=True
    )
    listing = yaml.safe_load(done.stdout)
    built = {kind: {c["name"] for c in listing.get(kind) or []} for kind in KINDS}
    used: dict[str, set[str]] = {kind: set() for kind in KINDS}
    for text in SHIPPED.values():
        config = yaml.safe_load(text)
        for kind in KINDS:
            types = {cid.split("/", 1)[0] for cid in config.get(kind) or {}}
            used[kind] |= {RENAMED.get(kind, {}).get(t, t) for t in types}
    for kind in KINDS:
        gap = NOT_IN_BUILD.get(kind, set())
        assert used[kind] - gap <= built[kind], f"{kind} used but not built: {used[kind] - gap - built[kind]}"
        # Once a NOT_IN_BUILD component can be built, it must be validated like the rest.
        assert not gap & built[kind], f"{kind} now built, drop from NOT_IN_BUILD: {gap & built[kind]}"
        assert gap <= used[kind], f"{kind} in NOT_IN_BUILD but no configuration uses it: {gap - used[kind]}"
