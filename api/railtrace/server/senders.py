"""Who sent an OTLP export: the peer address of the HTTP or gRPC connection, or the client a
trusted proxy (an OTel collector, a load balancer) names in `X-Forwarded-For`; and whether
that sender is a trusted collector, whose `k8s.*` claims (its k8sattributes) are believed.

Identity resolution matches the address against the pod IPs of the topology, because real
engines do not say which pod they are (vLLM's resource has no `k8s.*`; docs/normalisation.md,
"Identity"). Loopback and unparseable addresses give None: no pod has them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from railtrace_tracing.semconv import CLAIMS_COLLECTOR, CLAIMS_SENDER

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
FORWARDED_HEADER = "x-forwarded-for"


def trusted_networks(items: Sequence[str]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(item, strict=False) for item in items)


def _ip(text: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not text:
        return None
    text = text.strip().strip("[]")
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def grpc_peer_host(peer: str | None) -> str | None:
    """The host of a gRPC `context.peer()`: `ipv4:10.0.0.5:4711`, `ipv6:[fd00::1]:4711`."""
    if not peer:
        return None
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    if kind == "ipv6":
        host = rest.rsplit(":", 1)[0] if rest.startswith("[") else rest
        return host.strip("[]")
    return None


@dataclass(frozen=True, slots=True)
class Sender:
    """The sender the network shows (None: loopback or unknown) and who vouches for the
    `k8s.pod.name` / `k8s.pod.ip` its resources claim (`semconv.RES_OTLP_CLAIMS`)."""

    address: str | None
    claims: str


def sender_of(
    peer: str | None,
    forwarded: Sequence[str],
    trusted: tuple[Network, ...],
    collectors: tuple[Network, ...] = (),
) -> Sender:
    """The sender to record: the peer itself, or -- only when the peer is a trusted proxy --
    the right-most address of `X-Forwarded-For` that is not itself a trusted proxy. Its claims
    are a trusted collector's when that sender (loopback included: a collector beside the
    service) is in `collectors`; anyone else's claims are its own word."""
    ip = _ip(peer)
    if ip is None:
        return Sender(None, CLAIMS_SENDER)
    if trusted and forwarded and any(ip in net for net in trusted):
        hops = [h for value in forwarded for h in value.split(",") if h.strip()]
        for hop in reversed(hops):
            candidate = _ip(hop)
            if candidate is None:
                break  # a malformed entry: trust nothing further left
            if not any(candidate in net for net in trusted):
                ip = candidate
                break
    claims = CLAIMS_COLLECTOR if any(ip in net for net in collectors) else CLAIMS_SENDER
    return Sender(None if ip.is_loopback or ip.is_unspecified else str(ip), claims)


def sender_address(peer: str | None, forwarded: Sequence[str], trusted: tuple[Network, ...]) -> str | None:
    """The address `sender_of` records."""
    return sender_of(peer, forwarded, trusted).address
