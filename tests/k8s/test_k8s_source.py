"""`--topology k8s`: the live model follows the cluster through list, watch, errors and 410 re-lists.

The cluster is the stand-in API server of `k8s_fake_apiserver.py` (no cluster can run here);
the client is the official `kubernetes` package configured from a kubeconfig file; the model is
built by the real `TopologyBuilder` and published through the real `TopologyHolder`.
Waits have generous limits only so that a broken build fails instead of hanging; nothing is timed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from railtrace.topology import TopologyHolder
from railtrace.topology.k8s_source import (
    K8S_TOPOLOGY,
    KubernetesTopologySource,
    load_api_client,
    snapshot_topology,
    wants_live_topology,
)
from tests.k8s.k8s_cluster_objects import AWS_NODE, AZURE_NODE, POD, aws_objects, azure_objects
from tests.k8s.k8s_fake_apiserver import FakeApiServer

WAIT_S = 60.0


@pytest.fixture
def make_source(kubeconfig: Path) -> Iterator[Callable[..., tuple[KubernetesTopologySource, Any]]]:
    sources: list[KubernetesTopologySource] = []

    def make(**options: Any) -> tuple[KubernetesTopologySource, Any]:
        holder = TopologyHolder([])
        options = {"watch_timeout_s": 5, "backoff_s": 0.05, "max_backoff_s": 0.5, "settle_s": 0, **options}
        source = KubernetesTopologySource(holder, load_api_client(str(kubeconfig)), **options)
        sources.append(source.start())
        return source, holder

    yield make
    for source in sources:
        source.stop()


def _wait(source: KubernetesTopologySource, predicate: Callable[[], bool], what: str) -> None:
    assert source.wait_for(predicate, WAIT_S), f"model never showed: {what}; status={source.status()}"


def _pods(holder: Any) -> set[str]:
    return set(holder.get().pods)


def _nodes(holder: Any) -> set[str]:
    return set(holder.get().nodes)


def _claim_name(objects: list[dict[str, Any]]) -> str:
    return next(o["metadata"]["name"] for o in objects if o["kind"] == "ResourceClaim")


def _load(server: FakeApiServer, objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        server.put(obj)


def test_topology_k8s_is_recognised() -> None:
    assert K8S_TOPOLOGY == "k8s"
    assert wants_live_topology(["/etc/railtrace/topo", "k8s"])
    assert not wants_live_topology(["/etc/railtrace/k8s-objects"])


def test_missing_kubeconfig_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(RuntimeError, match="RAILTRACE_KUBECONFIG or KUBECONFIG"):
        load_api_client(str(tmp_path / "no-such-kubeconfig"))


def test_initial_list_builds_the_model_from_the_cluster(apiserver: FakeApiServer, make_source) -> None:
    _load(apiserver, aws_objects())
    source, holder = make_source()
    _wait(source, lambda: f"default/{POD}" in _pods(holder), "the AWS pod")

    topology = holder.get()
    assert AWS_NODE in topology.nodes
    assert len([g for g in topology.gpus if g.node == AWS_NODE]) == 8
    assert any(n.rdma_device == "rdmap16s27" for n in topology.nics)
    assert topology.pods[f"default/{POD}"].node == AWS_NODE
    assert any(POD in a.pods for a in topology.allocations)

    status = source.status()
    assert status["ResourceSlice"]["api_version"] == "resource.k8s.io/v1"
    assert status["ResourceClaim"]["objects"] == 1
    assert all(s["synced"] and s["served"] for s in status.values())
    # List items come without kind/apiVersion on the wire; the builder gets them filled in.
    assert all(o.get("kind") and o.get("apiVersion") for o in source.objects())
    assert apiserver.unauthorized == 0  # the kubeconfig's bearer token was used


def test_watch_follows_pods_and_nodes_coming_and_going(apiserver: FakeApiServer, make_source) -> None:
    _load(apiserver, aws_objects())
    source, holder = make_source()
    _wait(source, lambda: f"default/{POD}" in _pods(holder), "the AWS pod")

    _load(apiserver, azure_objects())  # a GB300 node joins with its slices, a claim and a pod
    # Each kind has its own watch, so the pod may show up before the node's slices do.
    _wait(
        source,
        lambda: f"gb300/{POD}" in _pods(holder) and any(g.node == AZURE_NODE for g in holder.get().gpus),
        "the GB300 pod and GPUs",
    )
    assert holder.get().pods[f"gb300/{POD}"].node == AZURE_NODE
    assert AZURE_NODE in _nodes(holder)

    # The prefill pod goes away, and with it the claim it owns (garbage collection).
    apiserver.delete("Pod", POD, "default")
    apiserver.delete("ResourceClaim", _claim_name(aws_objects()), "default")
    _wait(source, lambda: f"default/{POD}" not in _pods(holder), "the AWS pod's deletion")
    assert f"gb300/{POD}" in _pods(holder)

    moved = next(o for o in azure_objects() if o["kind"] == "Pod")
    moved["metadata"]["labels"]["llm-d.ai/role"] = "prefill"  # a MODIFIED event
    apiserver.put(moved)
    _wait(source, lambda: holder.get().pods[f"gb300/{POD}"].role == "prefill", "the relabelled pod")


def test_gone_relists_and_drops_objects_deleted_while_unseen(apiserver: FakeApiServer, make_source) -> None:
    _load(apiserver, aws_objects() + azure_objects())
    source, holder = make_source()
    _wait(source, lambda: {f"default/{POD}", f"gb300/{POD}"} <= _pods(holder), "both pods")
    lists_before = apiserver.count("Pod", watch=False)

    # The deletions happen while history is compacted: no DELETED event will ever arrive.
    apiserver.delete_unseen("Pod", POD, "gb300")
    apiserver.delete_unseen("ResourceClaim", _claim_name(azure_objects()), "gb300")
    _wait(source, lambda: f"gb300/{POD}" not in _pods(holder), "the pod deleted while unseen")

    assert source.status()["Pod"]["relists_after_gone"] >= 1
    assert apiserver.count("Pod", watch=False) > lists_before
    assert f"default/{POD}" in _pods(holder)


def test_watch_errors_are_retried_without_losing_the_model(apiserver: FakeApiServer, make_source) -> None:
    _load(apiserver, aws_objects())
    source, holder = make_source()
    _wait(source, lambda: f"default/{POD}" in _pods(holder), "the AWS pod")
    generation = source.generation

    for fault in ("http500", "error500", "cut"):
        apiserver.inject("Pod", fault)
    apiserver.put(next(o for o in azure_objects() if o["kind"] == "Node"))  # wake the Node watch
    _wait(source, lambda: source.status()["Pod"]["errors"] >= 3, "three failed Pod watches")
    # The previous model stays published while the watch is failing.
    assert f"default/{POD}" in _pods(holder)

    _load(apiserver, [o for o in azure_objects() if o["kind"] != "Node"])
    _wait(source, lambda: f"gb300/{POD}" in _pods(holder), "the pod added after the errors")
    assert source.generation > generation
    assert "Internal" in (source.status()["Pod"]["last_error"] or "") or source.status()["Pod"]["errors"] >= 3


@contextlib.contextmanager
def _cluster(tmp_path: Path, dra_versions: tuple[str, ...], objects: list[dict[str, Any]]):
    """A separate stand-in server serving DRA only at `dra_versions`, and a source watching it."""
    server = FakeApiServer(dra_versions=dra_versions).start()
    try:
        _load(server, objects)
        config = tmp_path / "kubeconfig-other"
        config.write_text(yaml.safe_dump(server.kubeconfig()))
        holder = TopologyHolder([])
        client = load_api_client(str(config))
        with KubernetesTopologySource(holder, client, backoff_s=0.05, settle_s=0) as source:
            yield source, holder
    finally:
        server.stop()


def test_bookmarks_move_the_resume_point_forward(apiserver: FakeApiServer, make_source) -> None:
    """Other kinds' changes advance the version; a bookmark lets the Pod watch resume past them,
    so a quiet kind does not fall behind the compaction window and need a re-list."""
    _load(apiserver, aws_objects())
    source, holder = make_source(watch_timeout_s=1)
    _wait(source, lambda: f"default/{POD}" in _pods(holder), "the AWS pod")
    apiserver.put(next(o for o in azure_objects() if o["kind"] == "Node"))
    moved_to = apiserver.resource_version
    _wait(
        source,
        lambda: max(apiserver.watch_versions("Pod")) >= moved_to,
        "a Pod watch resuming from the bookmark",
    )
    assert source.status()["Pod"]["relists_after_gone"] == 0


def test_falls_back_to_older_dra_versions(tmp_path: Path) -> None:
    with _cluster(tmp_path, ("v1beta1",), aws_objects()) as (src, holder):
        _wait(src, lambda: len(holder.get().gpus) == 8, "the GPUs of the v1beta1 slices")
        status = src.status()
        assert status["ResourceSlice"]["api_version"] == "resource.k8s.io/v1beta1"
        assert status["ResourceClaim"]["api_version"] == "resource.k8s.io/v1beta1"
        slices = [o for o in src.objects() if o["kind"] == "ResourceSlice"]
        # v1beta1 nests attributes under `basic`; the builder is handed the v1 shape.
        assert all("basic" not in d and "attributes" in d for s in slices for d in s["spec"]["devices"])


def test_cluster_without_dra_still_gives_nodes_and_pods(tmp_path: Path) -> None:
    core_objects = [o for o in aws_objects() if o["kind"] in ("Node", "Pod")]
    with _cluster(tmp_path, (), core_objects) as (src, holder):
        _wait(src, lambda: f"default/{POD}" in _pods(holder), "the pod without DRA")
        status = src.status()
        assert not status["ResourceSlice"]["served"] and status["ResourceSlice"]["synced"]
        assert not status["ResourceClaim"]["served"]
        assert AWS_NODE in _nodes(holder)


def test_lists_follow_continue_pages(apiserver: FakeApiServer, make_source) -> None:
    objects = aws_objects() + azure_objects()
    _load(apiserver, objects)
    source, holder = make_source(page_size=1)
    _wait(source, lambda: {f"default/{POD}", f"gb300/{POD}"} <= _pods(holder), "both pods")
    assert len(source.objects()) == len(objects)
    assert apiserver.count("ResourceSlice", watch=False) >= 4  # four slices, one per page


def test_one_malformed_object_costs_nothing_else(apiserver: FakeApiServer, make_source) -> None:
    _load(apiserver, aws_objects())
    apiserver.put(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "broken"},
            "spec": {"driver": "dra.net", "nodeName": AWS_NODE, "devices": "not-a-list"},
        }
    )
    source, holder = make_source()
    _wait(source, lambda: f"default/{POD}" in _pods(holder), "the AWS pod next to a malformed slice")
    assert len([g for g in holder.get().gpus if g.node == AWS_NODE]) == 8


def test_stop_ends_every_thread(apiserver: FakeApiServer, kubeconfig: Path) -> None:
    _load(apiserver, aws_objects())
    holder = TopologyHolder([])
    source = KubernetesTopologySource(holder, load_api_client(str(kubeconfig)), settle_s=0).start()
    _wait(source, lambda: source.synced and source.generation >= 1, "the first model")
    threads = list(source._threads)
    source.stop()
    assert not any(t.is_alive() for t in threads)


def _granted(rbac_path: Path) -> set[tuple[str, str, str]]:
    granted = set()
    for doc in yaml.safe_load_all(rbac_path.read_text()):
        if doc and doc["kind"] == "ClusterRole" and doc["metadata"]["name"] == "railtrace-topology-reader":
            for rule in doc["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        granted |= {(group, resource, verb) for verb in rule["verbs"]}
    return granted


def test_every_request_is_allowed_by_the_shipped_cluster_role(apiserver: FakeApiServer, make_source) -> None:
    """The read-only ClusterRole in deploy/ must cover each call the source really makes."""
    _load(apiserver, aws_objects())
    source, holder = make_source()
    _wait(source, lambda: f"default/{POD}" in _pods(holder), "the AWS pod")
    _wait(source, lambda: all(apiserver.count(k, watch=True) for k in ("Node", "Pod")), "the watches")
    granted = _granted(Path(__file__).resolve().parents[2] / "deploy" / "base" / "rbac.yaml")
    made = set()
    for path, query in list(apiserver.requests):
        parts = [p for p in path.split("/") if p]
        group = "" if parts[0] == "api" else parts[1]
        verb = "watch" if query.get("watch", ["false"])[0] in ("true", "1") else "list"
        made.add((group, parts[-1], verb))
    assert {("", "pods", "watch"), ("resource.k8s.io", "resourceslices", "list")} <= made
    assert made <= granted, f"calls the ClusterRole does not allow: {made - granted}"


def test_snapshot_lists_once_for_one_shot_tools(apiserver: FakeApiServer, kubeconfig: Path) -> None:
    _load(apiserver, aws_objects() + azure_objects())
    topology = snapshot_topology(load_api_client(str(kubeconfig)))
    assert {f"default/{POD}", f"gb300/{POD}"} <= set(topology.pods)
    assert {AWS_NODE, AZURE_NODE} <= set(topology.nodes)
    assert not any(apiserver.count(k, watch=True) for k in ("Node", "Pod", "ResourceSlice", "ResourceClaim"))
