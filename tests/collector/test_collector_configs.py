"""Structural gate for collector_config/*.yaml, beside the real collector's validate
(test_otelcol_validate.py).

Checks what `otelcol validate` would, plus what it cannot: every attribute key is in the
registry, every renamed span name is in railtrace's normalisation table, and llm-d's own
scrape filter is kept verbatim.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from railtrace.normalize.table import EXACT
from railtrace_tracing import semconv

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "collector_config"
TIER1 = CONFIG_DIR / "tier1-loadbalancer.yaml"
TIER2 = CONFIG_DIR / "tier2-sampler.yaml"
LLMD_RECIPE = REPO / "tests" / "fixtures" / "llmd" / "otel-collector-recipe.yaml"
CONTRIB_VERSION = "0.120.0"

# Environment the manifests must set (documented in collector_config/README.md).
TEST_ENV = {
    "SAMPLER_HEADLESS_SERVICE": "otelcol-sampler-headless.llm-d-tracing.svc.cluster.local",
    "TRACE_STORE_OTLP_ENDPOINT": "jaeger-collector:4317",
    "POD_NAME": "otelcol-sampler-0",
}

# Component types shipped in opentelemetry-collector-contrib 0.120.0 that a tracing setup
# would reach for. Not in it any more: the `logging` exporter (use `debug`), the `jaeger`
# exporter (Jaeger takes OTLP) and the `routing` processor (now a connector).
KNOWN_TYPES: dict[str, set[str]] = {
    "receivers": {"otlp", "jaeger", "zipkin", "prometheus", "kafka", "filelog", "hostmetrics"},
    "processors": {
        "batch",
        "memory_limiter",
        "filter",
        "transform",
        "tail_sampling",
        "k8sattributes",
        "resource",
        "resourcedetection",
        "attributes",
        "probabilistic_sampler",
        "groupbytrace",
        "redaction",
        "span",
    },
    "exporters": {
        "otlp",
        "otlphttp",
        "loadbalancing",
        "prometheus",
        "prometheusremotewrite",
        "debug",
        "file",
    },
    "connectors": {"forward", "spanmetrics", "servicegraph", "routing", "count"},
    "extensions": {"health_check", "pprof", "zpages", "file_storage"},
}
# connector type -> (signal it consumes, signal it produces)
CONNECTOR_SIGNALS = {
    "forward": ("same", "same"),
    "spanmetrics": ("traces", "metrics"),
    "servicegraph": ("traces", "metrics"),
    "routing": ("same", "same"),
    "count": ("any", "metrics"),
}
TAIL_POLICY_TYPES = {
    "always_sample",
    "latency",
    "numeric_attribute",
    "probabilistic",
    "status_code",
    "string_attribute",
    "trace_state",
    "rate_limiting",
    "span_count",
    "boolean_attribute",
    "ottl_condition",
    "and",
    "composite",
    "drop",
}
ENV_REF = re.compile(r"\$\{env:([A-Z0-9_]+)\}")
ATTRIBUTE_REF = re.compile(r'attributes\["([^"]+)"\]')
DELETE_KEY = re.compile(r'delete_key\(attributes,\s*"([^"]+)"\)')
NAME_EQ = re.compile(r'name == "([^"]+)"')
RENAME = re.compile(
    r'^set\(name, "([^"]+)"\) where name == "([^"]+)"'
    r'(?: and IsMatch\(instrumentation_scope\.name, "\^llm-d-router/pkg/epp"\))?$'
)


def _load(path: Path) -> dict[str, Any]:
    text = path.read_text()
    missing = set(ENV_REF.findall(text)) - set(TEST_ENV)
    assert not missing, f"{path.name} reads undocumented environment {missing}"
    return yaml.safe_load(ENV_REF.sub(lambda m: TEST_ENV[m.group(1)], text))


CONFIGS = {p.name: _load(p) for p in (TIER1, TIER2)}


def _type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def _signal(pipeline_id: str) -> str:
    return _type(pipeline_id)


def _strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for v in node.values() for s in _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return []


def _ottl(config: dict[str, Any]) -> list[str]:
    """Every OTTL statement or condition in transform and filter processors."""
    out: list[str] = []
    for cid, body in (config.get("processors") or {}).items():
        if _type(cid) in {"transform", "filter"}:
            out.extend(s for s in _strings(body) if s not in {"ignore", "silent", "propagate"})
            out = [s for s in out if s not in {"span", "spanevent", "datapoint", "metric", "resource"}]
    return out


def _attribute_keys(config: dict[str, Any]) -> set[str]:
    keys: set[str] = set()
    for statement in _ottl(config):
        keys |= set(ATTRIBUTE_REF.findall(statement)) | set(DELETE_KEY.findall(statement))
    processors = config.get("processors") or {}
    for cid, body in processors.items():
        if _type(cid) == "tail_sampling":
            for policy in body["policies"]:
                for sub in policy.values():
                    if isinstance(sub, dict) and "key" in sub:
                        keys.add(sub["key"])
        if _type(cid) == "k8sattributes":
            keys |= set(body["extract"]["metadata"])
            for assoc in body.get("pod_association", []):
                keys |= {s["name"] for s in assoc["sources"] if "name" in s}
    for body in (config.get("connectors") or {}).values():
        for dim in (body or {}).get("dimensions", []):
            keys.add(dim["name"] if isinstance(dim, dict) else dim)
    return keys


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_component_defined_is_used_and_every_used_is_defined(name: str) -> None:
    config = CONFIGS[name]
    service = config["service"]
    used: dict[str, set[str]] = {k: set() for k in ("receivers", "processors", "exporters")}
    for pipeline in service["pipelines"].values():
        for kind in used:
            used[kind] |= set(pipeline.get(kind, []))
    connectors = set(config.get("connectors") or {})
    for kind in ("receivers", "exporters"):
        defined = set(config.get(kind) or {}) | connectors
        assert used[kind] <= defined, f"{name}: {kind} used but not defined: {used[kind] - defined}"
    assert set(config.get("receivers") or {}) <= used["receivers"]
    assert set(config.get("exporters") or {}) <= used["exporters"]
    assert set(config.get("processors") or {}) == used["processors"]
    assert connectors <= used["receivers"] & used["exporters"]
    assert set(service.get("extensions", [])) == set(config.get("extensions") or {})


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_component_types_exist_in_contrib_0_120(name: str) -> None:
    config = CONFIGS[name]
    for kind, known in KNOWN_TYPES.items():
        for cid in config.get(kind) or {}:
            assert re.fullmatch(r"[a-z0-9_]+(/[A-Za-z0-9_.-]+)?", cid), cid
            assert _type(cid) in known, f"{name}: {kind} type {_type(cid)!r} not in contrib {CONTRIB_VERSION}"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_pipelines_are_well_formed(name: str) -> None:
    config = CONFIGS[name]
    pipelines = config["service"]["pipelines"]
    connectors = config.get("connectors") or {}
    for pid, pipeline in pipelines.items():
        assert _signal(pid) in {"traces", "metrics", "logs"}, pid
        assert pipeline.get("receivers") and pipeline.get("exporters"), pid
        processors = pipeline.get("processors", [])
        assert len(processors) == len(set(processors)), pid
        fed_by_receiver = any(r not in connectors for r in pipeline["receivers"])
        if fed_by_receiver:
            assert processors and processors[0] == "memory_limiter", f"{pid}: memory_limiter must come first"
        if "tail_sampling" in processors:
            assert "batch" in processors[processors.index("tail_sampling") :], (
                f"{pid}: batch after tail_sampling"
            )
            assert not fed_by_receiver or name == TIER2.name
        for i, p in enumerate(processors):
            if _type(p) == "batch":
                assert "tail_sampling" not in processors[i:], f"{pid}: batch before tail_sampling"
    for cid in connectors:
        exporting = [pid for pid, p in pipelines.items() if cid in p.get("exporters", [])]
        receiving = [pid for pid, p in pipelines.items() if cid in p.get("receivers", [])]
        assert len(exporting) == 1, f"{cid} must be exported by exactly one pipeline: {exporting}"
        assert receiving, f"{cid} feeds no pipeline"
        consumes, produces = CONNECTOR_SIGNALS[_type(cid)]
        src = _signal(exporting[0])
        assert consumes in {"same", "any", src}, f"{cid} cannot consume {src}"
        for dst in map(_signal, receiving):
            assert dst == (src if produces == "same" else produces), f"{cid}: {src} -> {dst}"


def test_tier1_routes_by_trace_id_to_tier2() -> None:
    config = CONFIGS[TIER1.name]
    lb = config["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "traceID"
    assert "endpoint" not in lb["protocol"]["otlp"], "the loadbalancing template must not set endpoint"
    assert lb["resolver"]["dns"]["hostname"] == TEST_ENV["SAMPLER_HEADLESS_SERVICE"]
    assert config["service"]["pipelines"]["traces"]["exporters"] == ["loadbalancing"]
    assert "tail_sampling" not in (config.get("processors") or {})


def test_tier2_sends_railtrace_a_pre_sampling_copy() -> None:
    config = CONFIGS[TIER2.name]
    pipelines = config["service"]["pipelines"]
    exporter = config["exporters"]["otlphttp/railtrace"]
    assert exporter["endpoint"] == "http://railtrace:4318"
    to_railtrace = [pid for pid, p in pipelines.items() if "otlphttp/railtrace" in p["exporters"]]
    assert len(to_railtrace) == 1
    assert "tail_sampling" not in pipelines[to_railtrace[0]]["processors"]
    sampled = [pid for pid, p in pipelines.items() if "tail_sampling" in p.get("processors", [])]
    assert len(sampled) == 1 and "otlp/tracestore" in pipelines[sampled[0]]["exporters"]


def test_tail_sampling_policies_are_complete() -> None:
    ts = CONFIGS[TIER2.name]["processors"]["tail_sampling"]
    names = [p["name"] for p in ts["policies"]]
    assert len(names) == len(set(names))
    for policy in ts["policies"]:
        assert policy["type"] in TAIL_POLICY_TYPES
        assert policy["type"] in policy, f"policy {policy['name']} lacks its {policy['type']} block"
    types = {p["type"] for p in ts["policies"]}
    assert {"status_code", "probabilistic", "string_attribute"} <= types
    assert ts["decision_cache"]["sampled_cache_size"] >= 10 * ts["num_traces"]


def test_every_sampling_mark_is_kept_by_a_policy() -> None:
    config = CONFIGS[TIER2.name]
    allowed = set(semconv.ATTRIBUTES_BY_KEY[semconv.SAMPLING_KEEP].allowed)
    marks = {
        m
        for s in _ottl(config)
        for m in re.findall(rf'set\(attributes\["{re.escape(semconv.SAMPLING_KEEP)}"\], "([^"]+)"\)', s)
    }
    assert marks == allowed
    policy = next(p for p in config["processors"]["tail_sampling"]["policies"] if p["name"] == "marked")
    assert policy["string_attribute"]["key"] == semconv.SAMPLING_KEEP
    assert set(policy["string_attribute"]["values"]) == allowed


def test_tcp_transfers_are_marked_before_sampling() -> None:
    config = CONFIGS[TIER2.name]
    mark = [
        s
        for s in config["processors"]["transform/mark"]["trace_statements"][0]["statements"]
        if f'attributes["{semconv.KV_TRANSPORT}"] == "{semconv.Transport.TCP}"' in s
    ]
    assert len(mark) == 1 and f'name == "{semconv.SPAN_KV_TRANSFER}"' in mark[0]
    pipelines = config["service"]["pipelines"]
    normalize = next(p for p in pipelines.values() if "transform/mark" in p.get("processors", []))
    assert "forward/sample" in normalize["exporters"]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_attribute_key_is_in_the_registry(name: str) -> None:
    keys = _attribute_keys(CONFIGS[name])
    assert keys
    unknown = {k for k in keys if k not in semconv.ATTRIBUTES_BY_KEY}
    assert not unknown, f"{name}: keys not in tracing/railtrace_tracing/semconv.py: {sorted(unknown)}"


def test_llm_d_key_prefixes_in_patterns_exist_in_the_registry() -> None:
    for statement in _ottl(CONFIGS[TIER2.name]):
        for prefix in re.findall(r'"(llm_d\.[a-z_.]+\.)"', statement):
            assert any(k.startswith(prefix) for k in semconv.ATTRIBUTES_BY_KEY), prefix


def test_content_is_stripped_from_railtrace_copy() -> None:
    statements = " ".join(_strings(CONFIGS[TIER2.name]["processors"]["transform/strip-content"]))
    assert set(DELETE_KEY.findall(statements)) == set(semconv.CONTENT_ATTRIBUTES)


def test_renames_follow_railtrace_normalisation_table() -> None:
    """The collector's rename map and railtrace's table must agree, name for name."""
    statements = CONFIGS[TIER2.name]["processors"]["transform/normalize"]["trace_statements"][0]["statements"]
    renames = {m[2]: m[1] for s in statements if (m := RENAME.match(s))}
    table = {
        name: rule.canonical for name, rule in EXACT.items() if rule.canonical and rule.canonical != name
    }
    assert renames == table


def test_span_names_in_conditions_are_known() -> None:
    known = set(EXACT) | set(semconv.SPAN_NAMES) | {"GET /metrics", "GET"}
    for name, config in CONFIGS.items():
        for statement in _ottl(config):
            for span_name in NAME_EQ.findall(statement):
                assert span_name in known, f"{name}: unknown span name {span_name!r}"


def test_ottl_is_lexically_balanced() -> None:
    for config in CONFIGS.values():
        for statement in _ottl(config):
            assert statement.count('"') % 2 == 0, statement
            depth = 0
            for ch in re.sub(r'"(?:[^"\\]|\\.)*"', '""', statement):
                depth += {"(": 1, ")": -1, "[": 1, "]": -1}.get(ch, 0)
                assert depth >= 0, statement
            assert depth == 0, statement


def test_ottl_paths_match_the_context() -> None:
    tier2 = CONFIGS[TIER2.name]
    for cid, body in tier2["processors"].items():
        if _type(cid) != "transform":
            continue
        for block in body.get("trace_statements", []):
            assert block["context"] in {"resource", "scope", "span", "spanevent"}
            for statement in block["statements"]:
                assert "datapoint" not in statement and "metric." not in statement, statement
        for block in body.get("metric_statements", []):
            assert block["context"] in {"resource", "scope", "metric", "datapoint"}
            for statement in block["statements"]:
                assert "span" not in statement, statement


def test_llm_d_scrape_filter_is_kept_verbatim() -> None:
    recipe = next(d for d in yaml.safe_load_all(LLMD_RECIPE.read_text()) if d["kind"] == "ConfigMap")
    ours = CONFIGS[TIER2.name]["processors"]["filter/drop-metrics-scraping"]
    theirs = yaml.safe_load(recipe["data"]["config.yaml"])["processors"]["filter/drop-metrics-scraping"]
    assert ours == theirs
    batch = yaml.safe_load(recipe["data"]["config.yaml"])["processors"]["batch"]
    assert CONFIGS[TIER2.name]["processors"]["batch"] == batch


def test_readme_documents_version_environment_and_decisions() -> None:
    readme = (CONFIG_DIR / "README.md").read_text()
    assert CONTRIB_VERSION in readme
    for var in TEST_ENV:
        assert var in readme
    assert "Decision wait versus long streaming requests" in readme
    assert "Span metrics duplication behind trace-id routing" in readme


def test_collector_images_named_in_deploy_are_pinned() -> None:
    texts = [p.read_text() for p in (REPO / "deploy").rglob("*.yaml")]
    images = {m for t in texts for m in re.findall(r"image:\s*(\S*opentelemetry-collector-contrib\S*)", t)}
    assert images, "deploy/ must name the collector image it runs"
    assert all(i.endswith(f":{CONTRIB_VERSION}") for i in images), images


def test_tier1_gives_every_engine_span_its_pod() -> None:
    """vLLM's resource carries no `k8s.*` and the P/D sidecar's none either (only the router
    chart adds them to the EPP), so the production overlay's tier 1 must add the pod and node of
    every sender, by the connection it came in on, before anything batches spans together (which
    loses the connection), with the RBAC to read pods."""
    config = CONFIGS[TIER1.name]
    processors = config["service"]["pipelines"]["traces"]["processors"]
    assert "k8sattributes" in processors
    assert processors.index("k8sattributes") < processors.index("batch")
    k8s = config["processors"]["k8sattributes"]
    assert k8s["passthrough"] is False
    assert {semconv.RES_POD, semconv.RES_NODE} <= set(k8s["extract"]["metadata"])
    sources = [s for assoc in k8s["pod_association"] for s in assoc["sources"]]
    assert {"from": "connection"} in sources
    manifests = list(
        yaml.safe_load_all((REPO / "deploy/components/collectors/loadbalancer.yaml").read_text())
    )
    role = next(m for m in manifests if m["kind"] == "ClusterRole")
    pods_rule = next(r for r in role["rules"] if "pods" in r["resources"])
    assert {"get", "list", "watch"} <= set(pods_rule["verbs"])
    binding = next(m for m in manifests if m["kind"] == "ClusterRoleBinding")
    deployment = next(m for m in manifests if m["kind"] == "Deployment")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert account in [s["name"] for s in binding["subjects"]]
    overlay = (REPO / "deploy/overlays/production/kustomization.yaml").read_text()
    assert "collectors" in overlay
