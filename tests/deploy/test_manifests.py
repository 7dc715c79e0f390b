"""What the rendered manifests promise: the port contract, hardening, the store per overlay,
the collector wiring that traceID routing depends on, read-only RBAC, scraping and dashboards.

These read the output of the real `kubectl kustomize`, so they test what `kubectl apply -k`
would send, including everything patches and components change.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from railtrace.settings import Settings
from tests.deploy.deploy_render import OVERLAYS, REPO, by_kind, one, render

NAMESPACE = "llm-d-tracing"
RAILTRACE_IMAGE = "ghcr.io/railtrace/railtrace:0.1.0"
COLLECTOR_IMAGE = (
    "ghcr.io/open-telemetry/opentelemetry-collector-releases/opentelemetry-collector-contrib:0.120.0"
)
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")


def _workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in WORKLOADS]


def _container(workload: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    return containers[0] if name is None else next(c for c in containers if c["name"] == name)


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _railtrace(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment", "railtrace")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_railtrace_serves_the_port_contract(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    deployment = _railtrace(docs)
    container = _container(deployment, "railtrace")
    assert container["image"] == RAILTRACE_IMAGE
    args = container["args"]
    assert args[0] == "serve"
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert args[args.index("--topology") + 1] == "k8s"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"otlp-grpc": 4317, "otlp-http": 4318}
    service = one(docs, "Service", "railtrace")
    assert {(p["name"], p["port"]) for p in service["spec"]["ports"]} == {
        ("otlp-grpc", 4317),
        ("otlp-http", 4318),
    }
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_railtrace_env_names_are_real_settings(overlay: str) -> None:
    """A misspelt RAILTRACE_* variable would be ignored silently by the service."""
    container = _container(_railtrace(render(f"overlays/{overlay}")), "railtrace")
    fields = set(Settings.model_fields)
    for name in _env(container):
        if name.startswith("RAILTRACE_"):
            assert name.removeprefix("RAILTRACE_").lower() in fields, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_runs_non_root_read_only_without_capabilities(overlay: str) -> None:
    for workload in _workloads(render(f"overlays/{overlay}")):
        where = f"{overlay}: {workload['kind']}/{workload['metadata']['name']}"
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert "add" not in sc["capabilities"], where
            assert sc["seccompProfile"]["type"] == "RuntimeDefault", where
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), where
            assert "memory" in resources["limits"], where
            assert "readinessProbe" in container and "livenessProbe" in container, where
            assert not container["image"].endswith(":latest") and ":" in container["image"], where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_llm_d_labels_on_every_object_and_pod(overlay: str) -> None:
    for doc in render(f"overlays/{overlay}"):
        labels = doc["metadata"].get("labels", {})
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        assert labels.get("llm-d.ai/guide") == "tracing", where
        assert labels.get("llm-d.ai/environment") == overlay, where
        if doc["kind"] in WORKLOADS:
            pod_labels = doc["spec"]["template"]["metadata"]["labels"]
            assert pod_labels.get("llm-d.ai/guide") == "tracing", where
            assert pod_labels.get("llm-d.ai/role", "").startswith("tracing-"), where
        if doc["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"].get("namespace") == NAMESPACE, where


def test_dev_is_one_replica_on_sqlite_on_a_volume() -> None:
    docs = render("overlays/dev")
    deployment = _railtrace(docs)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"  # one SQLite writer at a time
    container = _container(deployment, "railtrace")
    db = _env(container)["RAILTRACE_DB"]["value"]
    assert db.startswith("sqlite:////")
    db_dir = str(Path(db.removeprefix("sqlite:///")).parent)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    claim = volumes[mounts[db_dir]]["persistentVolumeClaim"]["claimName"]
    assert one(docs, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert not by_kind(docs, "StatefulSet"), "dev runs no collector tiers"


def test_production_is_replicated_on_postgresql_behind_two_collector_tiers() -> None:
    docs = render("overlays/production")
    deployment = _railtrace(docs)
    assert deployment["spec"]["replicas"] >= 2
    db = _env(_container(deployment, "railtrace"))["RAILTRACE_DB"]
    assert "value" not in db
    assert db["valueFrom"]["secretKeyRef"] == {"name": "railtrace-postgres", "key": "url"}
    assert not any("persistentVolumeClaim" in v for v in deployment["spec"]["template"]["spec"]["volumes"]), (
        "replicas must not share a volume"
    )
    tier1 = one(docs, "Deployment", "otelcol-loadbalancer")
    tier2 = one(docs, "StatefulSet", "otelcol-sampler")
    for workload in (tier1, tier2):
        assert _container(workload)["image"] == COLLECTOR_IMAGE
    assert tier2["spec"]["replicas"] >= 2
    budgets = {d["metadata"]["name"] for d in by_kind(docs, "PodDisruptionBudget")}
    assert {"railtrace", "otelcol-sampler", "otelcol-loadbalancer"} <= budgets


def _config_of(docs: list[dict[str, Any]], workload: dict[str, Any]) -> dict[str, Any]:
    volumes = workload["spec"]["template"]["spec"]["volumes"]
    (name,) = [v["configMap"]["name"] for v in volumes if "configMap" in v]
    return yaml.safe_load(one(docs, "ConfigMap", name)["data"]["config.yaml"])


def _env_refs(config: dict[str, Any]) -> set[str]:
    return set(re.findall(r"\$\{env:([A-Z0-9_]+)\}", json.dumps(config)))


def test_collector_configmaps_are_the_collector_config_files() -> None:
    docs = render("overlays/production")
    for workload_kind, name, source in (
        ("Deployment", "otelcol-loadbalancer", "tier1-loadbalancer.yaml"),
        ("StatefulSet", "otelcol-sampler", "tier2-sampler.yaml"),
    ):
        workload = one(docs, workload_kind, name)
        config = _config_of(docs, workload)
        assert config == yaml.safe_load((REPO / "collector_config" / source).read_text())
        container = _container(workload)
        assert "--config=/etc/otelcol/config.yaml" in container["args"]
        env = _env(container)
        missing = _env_refs(config) - set(env)
        assert not missing, f"{name}: config reads ${{env:…}} the pod does not set: {missing}"


def test_traceid_routing_reaches_every_sampler_and_railtrace() -> None:
    """Tier 1 must resolve the sampler pods one by one; tier 2 must reach railtrace's Service."""
    docs = render("overlays/production")
    tier1 = one(docs, "Deployment", "otelcol-loadbalancer")
    lb = _config_of(docs, tier1)["exporters"]["loadbalancing"]
    assert lb["routing_key"] == "traceID"
    hostname_ref = lb["resolver"]["dns"]["hostname"]
    hostname = _env(_container(tier1))[re.match(r"\$\{env:(\w+)\}", hostname_ref).group(1)]["value"]
    service_name, namespace = hostname.split(".")[:2]
    headless = one(docs, "Service", service_name)
    assert namespace == NAMESPACE == headless["metadata"]["namespace"]
    assert headless["spec"]["clusterIP"] == "None", "a ClusterIP would hide the pods from the resolver"
    tier2 = one(docs, "StatefulSet", "otelcol-sampler")
    assert headless["spec"]["selector"].items() <= tier2["spec"]["template"]["metadata"]["labels"].items()
    assert int(lb["resolver"]["dns"]["port"]) in {p["port"] for p in headless["spec"]["ports"]}

    exporters = _config_of(docs, tier2)["exporters"]
    endpoint = exporters["otlphttp/railtrace"]["endpoint"]
    host, port = re.match(r"https?://([^:/]+):(\d+)", endpoint).groups()
    railtrace = one(docs, "Service", host.split(".")[0])
    assert int(port) in {p["port"] for p in railtrace["spec"]["ports"]}


def test_topology_rbac_is_read_only_and_covers_what_the_source_watches() -> None:
    docs = render("overlays/dev")
    role = one(docs, "ClusterRole", "railtrace-topology-reader")
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert set(granted) == {
        ("", "nodes"),
        ("", "pods"),
        ("resource.k8s.io", "resourceslices"),
        ("resource.k8s.io", "resourceclaims"),
    }
    assert all(verbs == {"get", "list", "watch"} for verbs in granted.values())
    binding = one(docs, "ClusterRoleBinding", "railtrace-topology-reader")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = _railtrace(docs)["spec"]["template"]["spec"]["serviceAccountName"]
    assert {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE} in binding["subjects"]
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "Role") and doc["metadata"]["name"] != COLLECTOR:
            for rule in doc["rules"]:
                assert set(rule["verbs"]) <= {"get", "list", "watch"}, doc["metadata"]["name"]


COLLECTOR = "railtrace-topology-collector"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_node_collector_writes_only_its_configmap_and_reads_sys_read_only(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    role = one(docs, "Role", COLLECTOR)
    assert role["metadata"]["namespace"] == NAMESPACE
    for rule in role["rules"]:
        assert rule["apiGroups"] == [""] and rule["resources"] == ["configmaps"]
        if set(rule["verbs"]) != {"create"}:  # create cannot name its object
            assert rule["resourceNames"] == ["railtrace-collected-topology"]
            assert set(rule["verbs"]) <= {"get", "patch"}
    daemonset = one(docs, "DaemonSet", COLLECTOR)
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == COLLECTOR
    args = _container(daemonset)["args"]
    assert args[:2] == ["topology", "collect"]
    assert args[args.index("--configmap") + 1] == "$(POD_NAMESPACE)/railtrace-collected-topology"
    sys_mount = next(m for m in _container(daemonset)["volumeMounts"] if m["name"] == "sys")
    assert (
        sys_mount["readOnly"] is True
        and args[args.index("--sysfs-root") + 1] + "/sys" == sys_mount["mountPath"]
    )
    railtrace = _railtrace(docs)
    served = _container(railtrace, "railtrace")
    assert served["args"][-2:] == ["--topology", "/etc/railtrace/collected"]
    volume = next(
        v for v in railtrace["spec"]["template"]["spec"]["volumes"] if v["name"] == "collected-topology"
    )
    assert volume["configMap"] == {"name": "railtrace-collected-topology", "optional": True}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy_admits_only_the_otlp_ports(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    policy = one(docs, "NetworkPolicy", "railtrace")
    pod_labels = _railtrace(docs)["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert ports == {4317, 4318}


def test_service_monitors_select_the_scrape_ports() -> None:
    docs = render("overlays/production")
    services = by_kind(docs, "Service")
    for monitor in by_kind(docs, "ServiceMonitor"):
        selector = monitor["spec"]["selector"]["matchLabels"]
        selected = [s for s in services if selector.items() <= s["metadata"].get("labels", {}).items()]
        assert selected, f"ServiceMonitor/{monitor['metadata']['name']} selects no Service"
        port_names = {p["name"] for s in selected for p in s["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in port_names, endpoint
        assert monitor["metadata"]["labels"].get("release") == "llmd"
    railtrace_monitor = one(docs, "ServiceMonitor", "railtrace")
    selector = railtrace_monitor["spec"]["selector"]["matchLabels"]
    selected = [
        s["metadata"]["name"] for s in services if selector.items() <= s["metadata"]["labels"].items()
    ]
    assert selected == ["railtrace"], "each railtrace pod must be scraped once"
    assert one(docs, "PrometheusRule", "llm-d-tracing-rules")["metadata"]["labels"]["release"] == "llmd"


def test_every_generated_dashboard_ships_as_a_sidecar_configmap() -> None:
    docs = render("overlays/production")
    shipped = {}
    for cm in by_kind(docs, "ConfigMap"):
        if cm["metadata"].get("labels", {}).get("grafana_dashboard") == "1":
            ((filename, text),) = cm["data"].items()
            shipped[filename] = json.loads(text)
    sources = sorted((REPO / "dashboards" / "generated").glob("*.json"))
    assert sources
    assert set(shipped) == {p.name for p in sources}
    for path in sources:
        assert shipped[path.name] == json.loads(path.read_text()), path.name
