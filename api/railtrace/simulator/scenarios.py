"""The injected scenarios: each is a pool of prefill/decode pods deployed a certain way.

Each scenario reproduces one step of the published production story (PRODUCT.md) or one
fault users hit. Mixing scenarios means running their pools side by side in one fleet,
each pool with its own placement, router mode and faults, so per-scenario TTFT is compared
under the same per-pool load.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from railtrace_tracing.semconv import FlagName


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    short: str  # pod-name prefix
    description: str
    aligned: bool = True  # DRA claim pairs GPU and NIC (pcieRoot / NUMA)
    router: str = "topology"  # "topology": pairs prefill and decode by topology; "blind"
    tcp_nodes: bool = False  # some decode nodes cannot open their RDMA devices
    sidecar: str = "current"  # "v0.9": old sidecar that does not inject trace context
    decode_spans_lost: bool = False  # the decode engines' exporter loses their llm_request spans
    second_rail: bool = False  # pods see a second NIC on another rail; UCX splits across both
    expected_flags: tuple[str, ...] = ()  # flags its requests must carry (when the fault hits)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "unconstrained",
            "unc",
            "Claims without a pcieRoot constraint: each pod got a NIC on the other NUMA node; "
            "the router pairs blind to topology.",
            aligned=False,
            router="blind",
            expected_flags=(FlagName.GPU_NIC_MISMATCH,),
        ),
        Scenario(
            "dra-aligned",
            "dra",
            "Claims pair GPU and NIC by pcieRoot and RDMA is verified; the router is still "
            "blind to topology.",
            router="blind",
        ),
        Scenario(
            "topology-aware",
            "topo",
            "Aligned claims, verified RDMA, and the router pairs prefill and decode by topology.",
        ),
        Scenario(
            "tcp-fallback",
            "tcp",
            "Aligned claims, but UCX on half the decode nodes cannot open the verbs devices and "
            "silently moves KV over TCP on eth0; timeouts under load.",
            tcp_nodes=True,
            expected_flags=(FlagName.TCP_FALLBACK,),
        ),
        Scenario(
            "broken-trace",
            "old",
            "Healthy placement and a v0.9 P/D sidecar, which does not inject trace context (the "
            "engines' spans arrive in traces of their own and are joined by id), but the decode "
            "engines' span exporter loses their llm_request: a traced hop lost.",
            sidecar="v0.9",
            decode_spans_lost=True,
            expected_flags=(FlagName.BROKEN_TRACE,),
        ),
        Scenario(
            "cross-rail",
            "xr",
            "Aligned claims plus a second NIC on the remote NUMA node; UCX's two-rail split "
            "sends part of every KV transfer across rails.",
            second_rail=True,
            expected_flags=(FlagName.CROSS_RAIL,),
        ),
    )
}

DEFAULT_MIX: tuple[str, ...] = tuple(SCENARIOS)
LADDER: tuple[str, ...] = ("unconstrained", "dra-aligned", "topology-aware")


def resolve(names: Sequence[str] | None) -> list[Scenario]:
    """Scenarios by name (comma lists allowed); all of them when none are given."""
    if not names:
        return [SCENARIOS[n] for n in DEFAULT_MIX]
    out: list[Scenario] = []
    for raw in names:
        for name in (part.strip() for part in raw.split(",")):
            if not name:
                continue
            if name == "all":
                out.extend(SCENARIOS[n] for n in DEFAULT_MIX if SCENARIOS[n] not in out)
                continue
            if name not in SCENARIOS:
                raise ValueError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)} or all")
            if SCENARIOS[name] not in out:
                out.append(SCENARIOS[name])
    return out
