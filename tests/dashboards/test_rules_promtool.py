"""The rule files: promtool accepts them, their unit tests pass, every alert is tested firing
and quiet, conventions hold, and the generated PrometheusRule carries exactly the same rules."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards import build, promql

REPO = Path(__file__).resolve().parents[2]
RULE_FILES = build.rule_files()
TEST_FILES = sorted((build.HERE / "rules_test").glob("*.yaml"))
RECORD_NAME = re.compile(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+")
ALERT_NAME = re.compile(r"(?:[A-Z][a-z0-9]*|[A-Z]+(?=[A-Z][a-z]|$))+")


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_promtool(), *args], capture_output=True, text=True)


def _rules() -> list[dict[str, Any]]:
    return [
        rule
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def _alerts() -> list[dict[str, Any]]:
    return [r for r in _rules() if "alert" in r]


def test_rule_and_test_files_exist() -> None:
    assert RULE_FILES and TEST_FILES
    tested = {
        (path.parent / f).resolve()
        for path in TEST_FILES
        for f in yaml.safe_load(path.read_text())["rule_files"]
    }
    assert tested == {p.resolve() for p in RULE_FILES}, "every rule file needs a promtool test file"


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(path: Path) -> None:
    result = _run("check", "rules", "--lint=all", "--lint-fatal", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_promtool_test_rules(path: Path) -> None:
    result = _run("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_unit_tested_firing_and_quiet() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert names - firing == set(), "alerts without a firing test"
    assert names - quiet == set(), "alerts without a quiet test"


def test_alert_conventions() -> None:
    alerts = _alerts()
    assert len(alerts) >= 10
    for alert in alerts:
        name = alert["alert"]
        assert ALERT_NAME.fullmatch(name), f"{name} is not UpperCamelCase"
        assert alert["labels"]["severity"] in {"info", "warning", "critical"}
        notes = alert["annotations"]
        assert notes["summary"] and notes["description"]
        assert notes["runbook_url"] == f"docs/runbooks/{name}.md"
        runbook = REPO / notes["runbook_url"]
        assert runbook.is_file(), f"missing runbook {runbook}"
        assert name in runbook.read_text().splitlines()[0]


def test_every_alert_explains_its_threshold_in_a_comment() -> None:
    for path in RULE_FILES:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith("- alert:"):
                assert lines[i + 1].strip().startswith("#"), f"{path.name}: {line.strip()} has no comment"


def test_recording_rule_names_follow_level_metric_operations() -> None:
    for rule in _rules():
        if "record" in rule:
            assert RECORD_NAME.fullmatch(rule["record"]), rule["record"]
            assert "_total" not in rule["record"], "strip _total when rating a counter"


def test_every_metric_in_the_rules_is_registered() -> None:
    """railtrace's own families (`semconv.METRICS`), or llm-d's and vLLM's that the registry lists
    (`semconv.EXTERNAL_METRICS`, e.g. vLLM's NIXL lease-expiry counters)."""
    recorded = {r["record"] for r in _rules() if "record" in r}
    for rule in _rules():
        for name in promql.metric_names(rule["expr"]):
            assert name in recorded or promql.family(name) or promql.external_family(name), (
                f"{name} is in neither semconv.METRICS nor semconv.EXTERNAL_METRICS"
            )


def test_generated_prometheus_rule_passes_promtool(tmp_path: Path) -> None:
    """promtool rejects the CRD wrapper, so its `.spec` is extracted and checked and tested."""
    doc = yaml.safe_load((build.GENERATED / build.PROMETHEUS_RULE).read_text())
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    source = [g for path in RULE_FILES for g in yaml.safe_load(path.read_text())["groups"]]
    assert doc["spec"]["groups"] == source
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc["spec"], sort_keys=False))
    result = _run("check", "rules", str(spec))
    assert result.returncode == 0, result.stdout + result.stderr
    for path in TEST_FILES:
        test = yaml.safe_load(path.read_text())
        test["rule_files"] = [str(spec)]
        copy = tmp_path / path.name
        copy.write_text(yaml.safe_dump(test, sort_keys=False))
        result = _run("test", "rules", str(copy))
        assert result.returncode == 0, result.stdout + result.stderr


def test_runbook_base_url_makes_links_absolute() -> None:
    doc = yaml.safe_load(build.render_prometheus_rule("https://runbooks.example/railtrace/"))
    urls = [
        r["annotations"]["runbook_url"] for g in doc["spec"]["groups"] for r in g["rules"] if "alert" in r
    ]
    assert urls and all(re.fullmatch(r"https://runbooks\.example/railtrace/[A-Za-z]+\.md", u) for u in urls)
