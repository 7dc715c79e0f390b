"""What a request's KV path cost: the KV time and TTFT it would have had on its aligned path.

An operator fixes parts, not requests, and ranks the parts by what they cost. For each request
with a KV transfer the verdicts name the path the topology promised for its two ends (the
*aligned path*: NVLink on one host, else same-rail RDMA between nodes that have it, else TCP
where the fleet offers nothing better), its expected bandwidth, and the seconds the request
lost against it (docs/topology.md, "Seconds lost"). A request on its aligned path, or one that
was as fast as its aligned path would have been, loses nothing; a request whose aligned path is
unknown gets no figure (never a guess).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from railtrace.model import Endpoint, Flag, KVFacts
from railtrace.topology.model import NIC, Topology
from railtrace.verdicts.config import VerdictConfig
from railtrace_tracing.semconv import PATH_CLASS, TRANSPORT, FlagName, TopologyLevel

# The link rate the default same-rail figure was measured on: A4X's ConnectX-7 NICs, one
# 400 Gb/s port per GPU (the llm-d topology blog's ~48 MB in ~6.6 ms). A NIC whose rate the
# topology knows scales the expectation by its rate over this one.
REFERENCE_RATE_BPS = 400e9
# Flags that say a request was off its aligned path (or slower than it promised).
PATH_FLAGS = frozenset(
    {
        FlagName.TCP_FALLBACK.value,
        FlagName.CROSS_RAIL.value,
        FlagName.GPU_NIC_MISMATCH.value,
        FlagName.TOPOLOGY_BLIND_PAIRING.value,
        FlagName.SLOW_KV_TRANSFER.value,
        FlagName.KV_TRANSFER_FAILED.value,
    }
)
_RATE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:b|bit)", re.IGNORECASE)
_UNIT = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def link_rate_bps(rate: str | None) -> float | None:
    """Bits per second of a port rate as sysfs (`400 Gb/sec (4X NDR)`), dranet or the IB DRA
    driver (`400Gb/s`) write it; None when it says nothing readable."""
    if not rate:
        return None
    m = _RATE.search(str(rate))
    if not m:
        return None
    value = float(m.group(1)) * _UNIT[m.group(2).lower()]
    return value if value > 0 else None


def _nic_of(topology: Topology, ep: Endpoint) -> NIC | None:
    return topology.find_nic(ep.node, ep.nic) or topology.nic(ep.node, ep.nic)


def aligned_path(
    topology: Topology, a: Endpoint, b: Endpoint, transport: str, closer: TopologyLevel | None
) -> tuple[str | None, str]:
    """The path class the topology promises between the KV cache's two ends, and why.

    `closer`: the level of a comparable decode candidate the router passed over, if any (the
    pair the fleet offered instead)."""
    if closer == TopologyLevel.SAME_HOST:
        return PATH_CLASS.NVLINK, "a comparable decode candidate on the prefill host was passed over: NVLink"
    if a.node and b.node and a.node == b.node:
        return PATH_CLASS.NVLINK, f"both ends on node {a.node}: NVLink (cuda_ipc)"
    na, nb = topology.node(a.node), topology.node(b.node)
    if na is not None and nb is not None:
        if na.rdma_path is False or nb.rdma_path is False:
            why = "; ".join(f"{n.name}: {n.rdma_reason}" for n in (na, nb) if n.rdma_path is False)
            return PATH_CLASS.TCP, f"no RDMA path ({why}): TCP is the best this pair has"
        if na.rdma_path and nb.rdma_path:
            return PATH_CLASS.RDMA_SAME_RAIL, f"nodes {na.name} and {nb.name} have RDMA: same-rail RDMA"
    if transport == TRANSPORT.RDMA:
        return PATH_CLASS.RDMA_SAME_RAIL, "the transfer ran on RDMA: same-rail RDMA"
    return None, "RDMA availability of an end is unknown: aligned path unknown"


def expected_bandwidth(
    topology: Topology, cfg: VerdictConfig, path: str, ends: Sequence[Endpoint]
) -> tuple[float | None, str]:
    """Bytes per second the aligned path should give, and where the figure comes from: for
    same-rail RDMA the default scaled by the slower end's NIC link rate where the topology
    knows it, else `VerdictConfig.expected_bandwidth` (docs/topology.md#defaults-verdictconfig)."""
    base = cfg.expected_bandwidth.get(path)
    if not base:
        return None, f"no expected bandwidth for {path}"
    if path == PATH_CLASS.RDMA_SAME_RAIL:
        rates = []
        for ep in ends:
            nic = _nic_of(topology, ep)
            bps = link_rate_bps(nic.rate) if nic is not None else None
            if nic is not None and bps:
                src = nic.decided_by.get("rate") or (nic.sources[0] if nic.sources else "topology")
                rates.append((bps, f"{nic.label} on {nic.node} links at {nic.rate} ({src})"))
        if rates:
            bps, why = min(rates)
            scaled = base * bps / REFERENCE_RATE_BPS
            return scaled, (
                f"{scaled / 1e9:.3g} GB/s: {base / 1e9:.3g} GB/s measured on "
                f"{REFERENCE_RATE_BPS / 1e9:g} Gb/s links, scaled to {why}"
            )
    return base, f"{base / 1e9:.3g} GB/s: default for {path}"


def request_cost(
    topology: Topology,
    cfg: VerdictConfig,
    kv: KVFacts | None,
    path_class: str,
    transport: str,
    flags: Sequence[Flag],
    local: Endpoint,
    remote: Endpoint,
    local_role: str | None,
    ttft_s: float | None,
    kv_stage_s: float | None,
    closer: TopologyLevel | None = None,
) -> dict[str, Any] | None:
    """The summary's `cost` object, or None without a KV transfer that moved bytes in known time."""
    if kv is None or not kv.bytes or kv.duration_s is None or kv.duration_s < 0:
        return None
    path, why_path = aligned_path(topology, local, remote, transport, closer)
    evidence = [why_path]
    flagged = sorted({f.name for f in flags} & PATH_FLAGS)
    bw: float | None = None
    if path is not None:
        bw, why_bw = expected_bandwidth(topology, cfg, path, (local, remote))
        evidence.append(why_bw)
    aligned_kv = kv.bytes / bw if bw else None
    lost = 0.0
    if aligned_kv is not None and (path_class != path or flagged):
        lost = max(0.0, kv.duration_s - aligned_kv)
    elif aligned_kv is None:
        evidence.append("no aligned figure: no seconds lost counted")
    if lost:
        evidence.append(
            f"{kv.bytes} bytes took {kv.duration_s * 1e3:.1f} ms on {path_class}"
            + (f" ({', '.join(flagged)})" if flagged else "")
            + f"; {aligned_kv * 1e3:.1f} ms on {path}"  # type: ignore[operator]
        )
        evidence.append(
            "TTFT saves the KV seconds lost (the transfer is on the path to the first token); "
            "meanwhile the decode GPU waits for the cache and the prefill GPU holds its blocks"
        )
    # The transfer is on the path to the first token: TTFT saves what the KV stage would.
    ttft_lost = lost
    for bound in (kv_stage_s, ttft_s):
        if bound is not None and bound >= 0:
            ttft_lost = min(ttft_lost, bound)
    return {
        "aligned_path": path,
        "expected_bandwidth_bps": _r(bw),
        "aligned_kv_s": _r(aligned_kv),
        "aligned_ttft_s": _r(ttft_s - ttft_lost) if ttft_s is not None else None,
        "kv_s_lost": _r(lost),
        "ttft_s_lost": _r(ttft_lost),
        "decode_gpu_s_lost": _r(lost),
        "prefill_gpu_s_lost": _r(lost),
        "gpu_s_lost": _r(2 * lost),
        "side": local_role,
        "evidence": evidence,
    }


def _r(value: float | None) -> float | None:
    """Rounded to the microsecond (or byte per second): the summary stays stable to compare."""
    return None if value is None else round(float(value), 6)
