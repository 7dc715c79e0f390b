"""Which evidence decides a leg's pod, strongest first: the engine's `k8s.pod.name`, its pod IP
or OTLP sender address, the EPP's pick (`<ns>/<pod>-rank-<i>`), the P/D address, the sidecar's
own pod. The topology is the cluster's objects only (Pods with status.podIP, DRA claims)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from railtrace.model import Endpoint
from railtrace.normalize.table import endpoint_pod
from railtrace.simulator.fleet import build_fleet
from railtrace.simulator.scenarios import resolve
from railtrace.topology import load_paths, resolve_endpoint


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    fleet = build_fleet("a3-ultra", resolve(["topology-aware"]), seed=3)
    folder = tmp_path_factory.mktemp("cluster")
    for path in fleet.write(folder):
        if path.name == "railtrace-topology.yaml":
            path.unlink()
    collector = {  # an OTel collector pod: no devices, no role
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "otelcol-sampler-0", "namespace": "llm-d-tracing"},
        "spec": {"nodeName": fleet.nodes[0].name, "containers": [{"name": "otelcol"}]},
        "status": {"podIP": "10.99.0.9", "podIPs": [{"ip": "10.99.0.9"}]},
    }
    Path(folder, "collector.yaml").write_text(yaml.safe_dump(collector))
    return load_paths([str(folder)]), fleet


def test_endpoint_ids_lose_their_rank_suffix() -> None:
    assert endpoint_pod("llm-d/decode-7f9c-x2k7p-rank-0") == "decode-7f9c-x2k7p"
    assert endpoint_pod("llm-d/decode-7f9c-x2k7p-rank-12") == "decode-7f9c-x2k7p"
    assert endpoint_pod("llm-d/decode-7f9c-x2k7p") == "decode-7f9c-x2k7p"
    assert endpoint_pod("10.0.0.5:8000") is None
    assert endpoint_pod("") is None


def test_evidence_order_and_which_decided(cluster) -> None:
    topo, fleet = cluster
    a, b = fleet.pods_of("topology-aware", "decode")[:2]

    def ident(ep: Endpoint) -> tuple[str | None, str | None, bool]:
        out, _ = resolve_endpoint(topo, ep)
        return out.pod, out.identity, bool(out.node and out.gpu and out.nic)

    assert ident(Endpoint(pod=a.name, identity="k8s_resource", peer=b.ip)) == (a.name, "k8s_resource", True)
    assert ident(Endpoint(pod=a.name, identity="epp_pick", peer=b.ip)) == (b.name, "otlp_peer", True)
    assert ident(Endpoint(pod_ip=a.ip, peer=b.ip)) == (a.name, "pod_ip", True)
    assert ident(Endpoint(pod=a.name, identity="epp_pick")) == (a.name, "epp_pick", True)
    assert ident(Endpoint(address=f"{a.ip}:8000")) == (a.name, "pd_address", True)
    assert ident(Endpoint(address="localhost:8200", sidecar_peer=b.ip)) == (b.name, "sidecar_pod", True)
    # A collector's address is no leg's pod; nothing weaker is there either.
    assert ident(Endpoint(peer="10.99.0.9")) == (None, None, False)
    assert ident(Endpoint(peer="10.99.0.9", pod=a.name, identity="epp_pick")) == (a.name, "epp_pick", True)
