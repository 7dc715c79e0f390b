"""`railtrace serve --topology k8s` end to end: the service's own topology API follows the cluster.

The real service (HTTP API, store on a SQLite file) is started in-process with `--topology k8s`
and a kubeconfig pointing at the stand-in API server; a static `nvidia-smi topo -m` file given
alongside is kept in every rebuilt model. Polling has a limit only so that a broken build fails
instead of hanging; nothing is timed.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from railtrace.server.runner import Service
from railtrace.settings import Settings
from tests.k8s.k8s_cluster_objects import AWS_NODE, AZURE_NODE, POD, TOPOLOGY, aws_objects, azure_objects
from tests.k8s.k8s_fake_apiserver import FakeApiServer

LIMIT_S = 60.0


def _topology(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/api/v1/topology", timeout=10) as response:
        return json.loads(response.read())


def _until(url: str, predicate: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    deadline = time.monotonic() + LIMIT_S
    while True:
        topology = _topology(url)
        if predicate(topology):
            return topology
        assert time.monotonic() < deadline, f"/api/v1/topology never showed {what}"
        time.sleep(0.1)


def _pods(topology: dict[str, Any]) -> set[tuple[str, str]]:
    return {(p.get("namespace") or "", p["name"]) for p in topology["pods"]}


def _nodes(topology: dict[str, Any]) -> set[str]:
    return {n["name"] for n in topology["nodes"]}


def test_serve_with_live_topology(
    apiserver: FakeApiServer, kubeconfig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    smi = TOPOLOGY / "nvidia-smi-topo" / "h100-8gpu-8nic__sglang-issue-30401.txt"
    static = tmp_path / "static"
    static.mkdir()
    shutil.copy(smi, static / "h100-host.txt")
    for obj in aws_objects():
        apiserver.put(obj)
    monkeypatch.setenv("RAILTRACE_KUBECONFIG", str(kubeconfig))
    settings = Settings(
        db=f"sqlite:///{tmp_path / 'railtrace.db'}",
        topology=["k8s", str(static)],
        host="127.0.0.1",
        port=0,
        grpc_port=0,
    )
    with Service(settings) as svc:
        first = _until(svc.http_url, lambda t: ("default", POD) in _pods(t), "the cluster's pod")
        assert AWS_NODE in _nodes(first)
        static_nodes = _nodes(first) - {AWS_NODE}
        assert static_nodes, "the nvidia-smi file given next to `k8s` is missing from the model"

        for obj in azure_objects():
            apiserver.put(obj)
        second = _until(svc.http_url, lambda t: ("gb300", POD) in _pods(t), "the pod that came later")
        assert {AWS_NODE, AZURE_NODE} | static_nodes <= _nodes(second)

        apiserver.delete("Pod", POD, "default")
        apiserver.delete("ResourceClaim", "nccl-test-dra-worker-0-gpu-efa-example", "default")
        _until(svc.http_url, lambda t: ("default", POD) not in _pods(t), "the deleted pod gone")
