"""Identity resolution: what spans name (host:port, pod, node, host.name, KV peer) mapped onto the model."""

from __future__ import annotations

from railtrace.model import Endpoint
from railtrace.topology import TopologyBuilder, load_paths, resolve_address, resolve_endpoint
from railtrace.topology.identity import resolve_engine, split_address
from tests.verdicts.helpers import FLEET


def test_split_address_forms() -> None:
    assert split_address("10.0.0.1:8000") == ("10.0.0.1", 8000)
    assert split_address("http://10.0.0.1:8000/v1/completions") == ("10.0.0.1", 8000)
    assert split_address("[fd00::1]:8200") == ("fd00::1", 8200)
    assert split_address("decode-b") == ("decode-b", None)


def test_addresses_pod_names_dns_and_node_ips() -> None:
    t = load_paths([FLEET])
    assert resolve_address(t, "10.0.0.2:8000")[0].name == "decode-b"
    assert resolve_address(t, "decode-c.llm-d.svc.cluster.local:8000")[0].name == "decode-c"
    pod, node, note = resolve_address(t, "192.168.0.1:9000")
    assert pod is None and node.name == "node-a" and "address of node" in note
    assert resolve_address(t, "10.250.0.1:8000")[:2] == (None, None)
    assert resolve_engine(t, "eng-p0").name == "prefill-0"


def test_host_network_pods_told_apart_by_port() -> None:
    b = TopologyBuilder()
    for name, port in (("prefill-0", 8000), ("decode-0", 8200)):
        b.add_k8s_object(
            {
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "llm-d"},
                "spec": {
                    "nodeName": "n1",
                    "hostNetwork": True,
                    "containers": [{"name": "vllm", "ports": [{"containerPort": port}]}],
                },
                "status": {"podIP": "192.168.7.7", "hostIP": "192.168.7.7"},
            }
        )
    t = b.build()
    assert resolve_address(t, "192.168.7.7:8200")[0].name == "decode-0"
    pod, _node, note = resolve_address(t, "192.168.7.7")
    assert pod is None and "2 pods share this IP" in note


def test_endpoint_filled_from_allocation_and_pairing() -> None:
    t = load_paths([FLEET])
    ep, _ = resolve_endpoint(t, Endpoint(address="10.0.0.4:8000"))
    assert (ep.pod, ep.node, ep.gpu, ep.nic, ep.rail) == ("decode-b1", "node-b", "gpu-1", "mlx5_1", "rail-1")
    ep, _ = resolve_endpoint(t, Endpoint(host="decode-c"))  # host.name is the pod's hostname
    assert (ep.pod, ep.node, ep.gpu) == ("decode-c", "node-c", "gpu-0")
    ep, _ = resolve_endpoint(t, Endpoint(node="node-a"))  # node only: which GPU is not known
    assert ep.gpu is None and ep.nic is None
    ep, _ = resolve_endpoint(t, Endpoint(node="node-a"), local_gpu="cuda:1")
    assert (ep.gpu, ep.nic, ep.rail) == ("gpu-1", "mlx5_1", "rail-1")


def test_a_remembered_resolution_is_the_same_answer_and_never_shared() -> None:
    """Answers are remembered per topology: the second ask gives equal, fresh objects that
    keep the asking endpoint's own span and service, and a reloaded topology asks again."""
    t = load_paths([FLEET])
    first, notes = resolve_endpoint(t, Endpoint(address="10.0.0.4:8000", span_id="a" * 16, service="s1"))
    notes.append("changed by the caller")
    first.pod = "changed by the caller"
    asked = Endpoint(address="10.0.0.4:8000", span_id="b" * 16, service="s2")
    again, notes_again = resolve_endpoint(t, asked)
    assert (again.pod, again.node, again.gpu, again.nic, again.rail) == (
        "decode-b1",
        "node-b",
        "gpu-1",
        "mlx5_1",
        "rail-1",
    )
    assert (again.span_id, again.service) == ("b" * 16, "s2")
    assert "changed by the caller" not in notes_again
    fresh = load_paths([FLEET])
    assert fresh._resolved == {}
    assert resolve_endpoint(fresh, Endpoint(address="10.0.0.4:8000"))[0].pod == "decode-b1"


def test_epp_endpoint_ids_namespace_slash_pod() -> None:
    t = load_paths([FLEET])  # pods described without a namespace
    assert resolve_address(t, "llm-d/decode-c")[0].name == "decode-c"
    b = TopologyBuilder()
    b.add_k8s_object({"kind": "Pod", "metadata": {"name": "d0", "namespace": "a"}, "spec": {"nodeName": "n"}})
    b.add_k8s_object({"kind": "Pod", "metadata": {"name": "d0", "namespace": "b"}, "spec": {"nodeName": "m"}})
    t = b.build()
    assert resolve_address(t, "b/d0")[0].node == "m"
    assert resolve_address(t, "d0")[0] is None  # two namespaces: not guessed


def test_a_pod_name_the_sender_claims_counts_only_from_that_pods_address() -> None:
    """`claimed_pod` (a sender's own `k8s.pod.name`, no trusted collector): believed where the
    topology gives that pod the sender's address; otherwise it places nothing and says why."""
    t = load_paths([FLEET])
    ep, notes = resolve_endpoint(t, Endpoint(claimed_pod="decode-b", peer="10.0.0.2"))
    assert (ep.pod, ep.identity) == ("decode-b", "k8s_resource"), notes
    ep, notes = resolve_endpoint(t, Endpoint(claimed_pod="decode-b", peer="10.99.99.99"))
    assert ep.pod is None and ep.node is None, ep
    assert any("k8s.pod.name decode-b claimed without a trusted collector" in n for n in notes), notes
    # The sender's own address still places it: another pod's, whatever the claim.
    ep, notes = resolve_endpoint(t, Endpoint(claimed_pod="decode-b", peer="10.0.0.4"))
    assert (ep.pod, ep.identity) == ("decode-b1", "otlp_peer"), notes
    ep, notes = resolve_endpoint(t, Endpoint(claimed_pod="decode-b", peer=None))
    assert ep.pod is None and any("no sender address" in n for n in notes), notes
