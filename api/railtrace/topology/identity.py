"""Identity resolution: what spans carry (host:port, pod and node names, host.name, KV remote host/engine)
mapped onto the model's pods, nodes, GPUs, NICs and rails.

Nothing here guesses: when an address matches several pods, or a pod holds several GPUs and the
span does not say which, the field stays empty and a note says why.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import replace

from railtrace.model import Endpoint
from railtrace.topology.model import GPU, NIC, Node, Pod, Topology
from railtrace_tracing.semconv import IDENTITY


def split_address(address: str) -> tuple[str, int | None]:
    """`http://10.0.0.5:8000/v1` → ("10.0.0.5", 8000); `[fd00::1]:80` and bare hosts too."""
    a = address.strip()
    a = re.sub(r"^[a-z][a-z0-9+.-]*://", "", a, flags=re.IGNORECASE).split("/")[0] if "://" in a else a
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\](?::(\d+))?", a)
    if m:
        return m.group(1), int(m.group(2)) if m.group(2) else None
    if a.count(":") == 1:
        host, port = a.split(":")
        return host, int(port) if port.isdigit() else None
    return a, None


@functools.lru_cache(maxsize=4096)
def _is_ip(host: str) -> bool:
    # Cached: a fleet has few endpoint addresses and every assembled request asks about two.
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def resolve_address(topology: Topology, address: str | None) -> tuple[Pod | None, Node | None, str]:
    """A router/sidecar endpoint (`host:port`, pod name, `ns/pod`, DNS name, node IP) → pod and/or node."""
    if not address:
        return None, None, "no address"
    host, port = split_address(address)
    if _is_ip(host):
        pods = topology.pods_at(host)
        if len(pods) > 1 and port is not None:
            by_port = [p for p in pods if port in p.ports]
            pods = by_port or pods
        if len(pods) == 1:
            return pods[0], topology.node(pods[0].node), f"{address}: pod IP of {pods[0].name}"
        if len(pods) > 1:
            return (
                None,
                topology.node(pods[0].node),
                f"{address}: {len(pods)} pods share this IP; port does not decide",
            )
        node = topology.node(host)
        if node:
            return None, node, f"{address}: address of node {node.name}"
        return None, None, f"{address}: IP not in the topology"
    pods = topology.pods_named(host)
    if not pods and "." in host:
        pods = topology.pods_named(host.split(".")[0])
    if len(pods) == 1:
        return pods[0], topology.node(pods[0].node), f"{address}: pod {pods[0].name}"
    if len(pods) > 1:
        return None, None, f"{address}: {len(pods)} pods named {host} in different namespaces"
    node = topology.node(host)
    if node:
        return None, node, f"{address}: node {node.name}"
    return None, None, f"{address}: not in the topology"


def resolve_engine(topology: Topology, engine_id: str | None) -> Pod | None:
    if not engine_id:
        return None
    hits = topology.pods_with_engine(engine_id)
    return hits[0] if len(hits) == 1 else None


def pod_devices(topology: Topology, pod: Pod) -> tuple[list[GPU], list[NIC]]:
    """Every GPU and NIC the pod's allocations hold (all its claims together)."""
    gpus: list[GPU] = []
    nics: list[NIC] = []
    for alloc in topology.allocations_of(pod):
        node = alloc.node or pod.node
        gpus += [g for g in (topology.gpu(node, n) for n in alloc.gpus) if g and g not in gpus]
        nics += [c for c in (topology.nic(node, n) for n in alloc.nics) if c and c not in nics]
    return gpus, nics


# Distinct endpoints remembered per topology; a fleet has far fewer, so the bound only guards
# against spans that name endless distinct addresses.
MAX_RESOLVED = 65_536
# (pod, node, gpu, nic, rail) as resolved, and the notes saying how.
Resolution = tuple[str | None, str | None, str | None, str | None, str | None, str | None, tuple[str, ...]]


def resolve_endpoint(
    topology: Topology, ep: Endpoint, local_gpu: str | None = None
) -> tuple[Endpoint, list[str]]:
    """A copy of `ep` with pod, node, gpu, nic and rail filled from the topology where they are certain.

    Every assembled request asks this twice, mostly about the same few endpoints, and the
    answer depends only on the fields below and the topology (immutable): it is remembered
    on the topology object, so a reloaded topology starts afresh.
    """
    key = (
        ep.pod,
        ep.node,
        ep.gpu,
        ep.nic,
        ep.rail,
        ep.address,
        ep.host,
        local_gpu,
        ep.identity,
        ep.pod_ip,
        ep.peer,
        ep.sidecar_peer,
        ep.claimed_pod,
    )
    cache: dict[tuple[str | None, ...], Resolution] = topology._resolved  # type: ignore[attr-defined]
    hit = cache.get(key)
    if hit is None:
        out, notes = _resolve_endpoint(topology, ep, local_gpu)
        hit = (out.pod, out.node, out.gpu, out.nic, out.rail, out.identity, tuple(notes))
        if len(cache) < MAX_RESOLVED:
            cache[key] = hit
    out = ep.copy()
    out.pod, out.node, out.gpu, out.nic, out.rail, out.identity, known = hit
    return out, list(known)


def _serving(topology: Topology, pod: Pod) -> bool:
    """A model-server pod: it holds devices or says its P/D role or engine. A sender address
    that is some other pod's (an OTel collector forwarding without X-Forwarded-For) names no leg."""
    return bool(pod.claims or pod.role or pod.engine_id or topology.allocations_of(pod))


def _unique_pod_at(topology: Topology, ip: str | None) -> Pod | None:
    """The one non-host-network serving Pod with this IP (a host-network pod shares its node's
    IP, so its address names no pod)."""
    if not ip or not _is_ip(ip):
        return None
    pods = [p for p in topology.pods_at(ip) if not p.host_network and _serving(topology, p)]
    return pods[0] if len(pods) == 1 else None


def _claim_holds(topology: Topology, claimed: str, peer: str | None) -> Pod | None:
    """The pod a sender's own `k8s.pod.name` names, when the topology gives it the sender's address."""
    pods = topology.pods_named(claimed)
    if len(pods) != 1 or not peer or not _is_ip(peer):
        return None
    return pods[0] if pods[0] in topology.pods_at(peer) else None


def claim_rejection(claimed: str, peer: str | None) -> str:
    """The evidence note of a `k8s.pod.name` claim that was not believed."""
    sender = f"its sender {peer} is not that pod" if peer else "no sender address to check it against"
    return f"k8s.pod.name {claimed} claimed without a trusted collector, not believed: {sender}"


def _identify(
    topology: Topology, ep: Endpoint, notes: list[str]
) -> tuple[Pod | None, Node | None, str | None]:
    """The leg's pod, strongest evidence first, and which evidence decided
    (`semconv.Identity`): the engine's `k8s.pod.name`; its `k8s.pod.ip` or OTLP sender
    address matched to one Pod's IP; the EPP's pick; the P/D address; the sidecar's own pod
    (the decode pod in nixlv2). Only the engine's own resource outranks its sender address; a
    pod name the sender claimed for itself counts only where that pod has the sender's address."""
    if ep.claimed_pod:
        claimed = _claim_holds(topology, ep.claimed_pod, ep.peer)
        if claimed is not None:
            notes.append(f"pod {claimed.name}: k8s.pod.name, and the sender {ep.peer} is that pod")
            return claimed, None, IDENTITY.K8S_RESOURCE
        notes.append(claim_rejection(ep.claimed_pod, ep.peer))
    if ep.pod and ep.identity in (None, IDENTITY.K8S_RESOURCE):
        pods = topology.pods_named(ep.pod)
        if len(pods) == 1:
            return pods[0], None, IDENTITY.K8S_RESOURCE
    for ip, how in ((ep.pod_ip, IDENTITY.POD_IP), (ep.peer, IDENTITY.OTLP_PEER)):
        pod = _unique_pod_at(topology, ip)
        if pod is not None:
            notes.append(f"pod {pod.name}: {how} {ip}")
            return pod, None, how
    if ep.pod:
        pods = topology.pods_named(ep.pod)
        if len(pods) == 1:
            return pods[0], None, ep.identity or IDENTITY.EPP_PICK
    node: Node | None = None
    if ep.address:
        pod, node, note = resolve_address(topology, ep.address)
        notes.append(note)
        if pod is not None:
            return pod, node, IDENTITY.KV_PEER if ep.identity == IDENTITY.KV_PEER else IDENTITY.PD_ADDRESS
    pod = _unique_pod_at(topology, ep.sidecar_peer)
    if pod is not None:
        notes.append(f"pod {pod.name}: the sidecar's own pod ({ep.sidecar_peer})")
        return pod, None, IDENTITY.SIDECAR_POD
    return None, node, (ep.identity if ep.pod else None)


def _resolve_endpoint(topology: Topology, ep: Endpoint, local_gpu: str | None) -> tuple[Endpoint, list[str]]:
    notes: list[str] = []
    pod, node, identity = _identify(topology, ep, notes)
    if pod is None and ep.host:
        pods = topology.pods_named(ep.host)
        pod = pods[0] if len(pods) == 1 else None
        if pod is None:
            node = node or topology.node(ep.host)
    if ep.node:
        node = topology.node(ep.node) or node
    if node is None and pod is not None:
        node = topology.node(pod.node)
    node_name = (node.name if node else None) or ep.node or (pod.node if pod else None)
    out = replace(ep, pod=pod.name if pod else ep.pod, node=node_name, identity=identity)

    gpu: GPU | None = None
    for ref in (ep.gpu, local_gpu):
        if ref and node_name:
            gpu = topology.find_gpu(node_name, ref)
            if gpu:
                break
    alloc_gpus: list[GPU] = []
    alloc_nics: list[NIC] = []
    if pod is not None:
        alloc_gpus, alloc_nics = pod_devices(topology, pod)
    if gpu is None and len(alloc_gpus) == 1:
        gpu = alloc_gpus[0]
        notes.append(f"GPU {gpu.name}: the only GPU allocated to pod {pod.name if pod else '?'}")
    elif gpu is None and len(alloc_gpus) > 1:
        notes.append(f"pod holds {len(alloc_gpus)} GPUs and no span names the one used")
    if gpu is not None:
        out = replace(out, gpu=gpu.name)
    elif ep.gpu:
        notes.append(f"GPU {ep.gpu} not found on node {node_name}")

    nic: NIC | None = topology.find_nic(node_name, ep.nic) if ep.nic else None
    if nic is None and gpu is not None:
        paired, _p = topology.paired_nics(node_name, gpu.name)
        held = [n for n in paired if n in alloc_nics]
        if len(held) == 1:
            nic = held[0]
        elif not alloc_nics and len(paired) == 1:
            nic = paired[0]
            notes.append(f"NIC {nic.label}: paired with {gpu.name} (no NIC allocation known)")
    if nic is None:
        rdma_held = [n for n in alloc_nics if n.rdma is not False]
        if len(rdma_held) == 1:
            nic = rdma_held[0]
    if nic is not None:
        out = replace(out, nic=nic.label, rail=ep.rail or nic.rail)
    return out, notes
