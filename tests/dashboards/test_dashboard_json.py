"""The committed dashboards: regenerated unchanged, decodable, well formed, every query parses
(promtool) and every metric it reads is a registered name or recording rule."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard as DashboardModel

from dashboards import build, common, promql
from dashboards.boards import DASHBOARDS
from railtrace_tracing import semconv

GENERATED = build.GENERATED
FILES = sorted(f"{name}.json" for name in DASHBOARDS)
REQUIRED_VARIABLES = {common.V_DATASOURCE, common.V_NAMESPACE, common.V_MODEL, common.V_NODE}
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__value", "__field", "__from", "__to"}


def _load(name: str) -> dict[str, Any]:
    return json.loads((GENERATED / name).read_text())


def _recorded() -> set[str]:
    names = set()
    for path in build.rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            names |= {r["record"] for r in group["rules"] if "record" in r}
    return names


def test_regenerating_changes_nothing() -> None:
    for name, text in build.render_all().items():
        committed = GENERATED / name
        assert committed.is_file(), f"{name} not committed; run python -m dashboards.build"
        assert committed.read_text() == text, f"{name} is stale; run python -m dashboards.build"


def test_file_names_follow_llm_d() -> None:
    assert FILES and all(re.fullmatch(r"llm-d-tracing-[a-z0-9-]+\.json", f) for f in FILES)
    assert sorted(p.name for p in GENERATED.glob("*.json")) == FILES


@pytest.mark.parametrize("name", FILES)
def test_round_trip_through_the_sdk_model_is_exact(name: str) -> None:
    register_default_plugins()
    raw = (GENERATED / name).read_text()
    model = DashboardModel.from_json(json.loads(raw))
    assert JSONEncoder(sort_keys=True, indent=2).encode(model) + "\n" == raw


def test_uids_unique_and_short() -> None:
    uids = [_load(f)["uid"] for f in FILES]
    assert len(set(uids)) == len(uids)
    assert all(0 < len(u) <= 40 for u in uids)


@pytest.mark.parametrize("name", FILES)
def test_dashboard_invariants(name: str) -> None:
    board = _load(name)
    assert board["schemaVersion"] == 42
    assert "llm-d" in board["tags"]
    panels = list(promql.panels(board))
    ids = [p["id"] for p in panels]
    assert len(set(ids)) == len(ids) and None not in ids
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        uid = (panel.get("datasource") or {}).get("uid")
        assert uid is None or uid.startswith("${"), f"hard-coded datasource uid in {panel['title']}"
    for target in promql.targets(board):
        assert target.ref_id, target
        assert target.expr, target
    declared = {v["name"] for v in board["templating"]["list"]}
    assert declared >= REQUIRED_VARIABLES
    used = promql.variables_used(json.dumps(board)) - GRAFANA_BUILTINS
    assert used <= declared, f"undeclared variables {used - declared}"
    datasource_vars = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    assert {v["query"] for v in datasource_vars} == {"prometheus", "tempo"}


@pytest.mark.parametrize("name", FILES)
def test_metric_names_are_registered(name: str) -> None:
    """Railtrace series come from semconv.METRICS, recorded ones from the rule files, and the
    rest are llm-d/vLLM families listed in semconv.EXTERNAL_METRICS."""
    recorded = _recorded()
    for target in promql.prometheus_targets(_load(name)):
        names = promql.metric_names(target.expr)
        assert names, target
        for metric in names:
            assert metric in recorded or promql.family(metric) or promql.external_family(metric), (
                f"{target.panel}: {metric} is not a registered metric or recording rule"
            )


def test_recording_rules_named_by_dashboards_exist() -> None:
    assert set(common.RECORDING_RULES) <= _recorded()


@pytest.mark.parametrize("name", FILES)
def test_label_matchers_exist_on_the_metric(name: str) -> None:
    """A matcher on a label the family does not have would silently match nothing."""
    target_labels = {common.NAMESPACE_LABEL, "instance", "job", "pod"}
    for target in promql.prometheus_targets(_load(name)):
        for metric, label in promql.label_matchers(target.expr):
            fam = promql.family(metric)
            if fam is None:
                continue
            allowed = set(semconv.METRICS_BY_NAME[fam].labels) | target_labels
            if metric.endswith("_bucket"):
                allowed.add("le")
            assert label in allowed, f"{target.panel}: {metric} has no label {label}"


def test_histogram_panels_ask_for_exemplars() -> None:
    """Exemplars (trace ids) are what links a latency spike to the request behind it."""
    for name in FILES:
        for target in promql.prometheus_targets(_load(name)):
            raw = [m for m in promql.metric_names(target.expr) if m.endswith("_bucket") and promql.family(m)]
            if (
                raw
                and "histogram_quantile" in target.expr
                and promql.family(raw[0])
                in {
                    semconv.M_TTFT,
                    semconv.M_KV_DURATION,
                    semconv.M_KV_BANDWIDTH,
                }
            ):
                board = _load(name)
                exemplar = [
                    t.get("exemplar")
                    for p in promql.panels(board)
                    for t in p.get("targets", []) or []
                    if t.get("expr") == target.expr
                ]
                assert all(exemplar), target.panel


def test_exemplar_links_reach_trace_store_and_railtrace() -> None:
    doc = yaml.safe_load((GENERATED / build.DATASOURCES).read_text())
    dest = doc["datasources"][0]["jsonData"]["exemplarTraceIdDestinations"]
    assert {d["name"] for d in dest} == {semconv.EXEMPLAR_TRACE_ID_LABEL}
    assert {d.get("datasourceUid") for d in dest} >= {build.TEMPO_UID, build.JAEGER_UID}
    assert build.RAILTRACE_UID in {d.get("datasourceUid") for d in dest}  # Grafana's trace view
    assert any(d.get("url", "").endswith("/requests/$${__value.raw}") for d in dest)  # the UI page
    railtrace = next(d for d in doc["datasources"] if d["uid"] == build.RAILTRACE_UID)
    assert railtrace["type"] == "tempo" and railtrace["url"] == "${RAILTRACE_URL}"


def test_trace_store_panel_links_to_railtrace_request_page() -> None:
    overview = json.dumps(_load("llm-d-tracing-overview.json"))
    assert "/requests/${__value.raw}" in overview
    assert semconv.KV_TRANSPORT in overview


def test_contract_dashboard_reads_the_contract_gauge() -> None:
    board = _load("llm-d-tracing-contract.json")
    exprs = " ".join(t.expr for t in promql.prometheus_targets(board))
    assert semconv.M_CONTRACT in exprs
    assert all(status.value in json.dumps(board) for status in semconv.ContractStatus)


def test_every_query_parses_with_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    rules = []
    for name in FILES:
        for i, target in enumerate(promql.prometheus_targets(_load(name))):
            record = f"dash:{name.removesuffix('.json').replace('-', '_')}:expr{i}"
            rules.append({"record": record, "expr": promql.substitute(target.expr)})
    for name in FILES:
        for variable in _load(name)["templating"]["list"]:
            query = variable.get("query")
            if variable["type"] == "query" and isinstance(query, str):
                match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
                assert match, query
                rules.append(
                    {
                        "record": f"dash:{name.removesuffix('.json').replace('-', '_')}:{variable['name']}",
                        "expr": f"count by ({match[2]}) ({promql.substitute(match[1])})",
                    }
                )
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout
