"""Verdict thresholds. Defaults come from published llm-d / UCX measurements (docs/topology.md#verdicts)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from railtrace_tracing.semconv import PathClass

# Effective KV-transfer bandwidth a healthy path of each class should give, bytes per second.
#   rdma_same_rail: ~48 MB per transfer in ~6.6 ms on healthy A4X RDMA (llm-d topology blog) ≈ 7.3 GB/s.
#   rdma_cross_rail: NUMA-unaligned NIC gave 27.54 vs 39.07 GB/s aligned (dranet nixl-kv-transfer, 8× H100),
#                    i.e. ~0.70 of the same-rail figure ≈ 5.1 GB/s.
#   tcp: UCX over TCP moved GPU→GPU KV at ~0.55 GB/s (llm-d networking blog; 0.59 GB/s on GCP tcp/eth1,
#        openucx/ucx#10854; 0.5 GB/s in vllm-project/vllm#52607).
#   nvlink: cuda_ipc push at ~49 GB/s (vllm-project/vllm#52607).
#   shm: no published figure for KV over cma/knem; not judged unless configured.
DEFAULT_EXPECTED_BANDWIDTH: Mapping[str, float] = MappingProxyType(
    {
        PathClass.RDMA_SAME_RAIL.value: 48e6 / 6.6e-3,
        PathClass.RDMA_CROSS_RAIL.value: 48e6 / 6.6e-3 * (27.54 / 39.07),
        PathClass.TCP.value: 0.55e9,
        PathClass.NVLINK.value: 49e9,
    }
)


@dataclass(frozen=True, slots=True)
class VerdictConfig:
    """score_tolerance: candidates within this many score points (scaled by the chosen score when it
    exceeds 1) count as comparable. slow_fraction: below this share of the expected bandwidth a
    transfer is slow. slow_min_bytes: smaller transfers are latency-bound and are not judged.
    cross_rail_min_share: a UCX lane carrying less than this share of the bytes does not make a
    transfer cross-rail (0 = any lane)."""

    score_tolerance: float = 0.05
    slow_fraction: float = 0.25
    expected_bandwidth: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_EXPECTED_BANDWIDTH))
    slow_min_bytes: int = 1 << 20
    cross_rail_min_share: float = 0.0

    def __post_init__(self) -> None:
        # Given entries override the defaults; a class set to 0 or None is not judged for speed.
        merged = {**DEFAULT_EXPECTED_BANDWIDTH, **dict(self.expected_bandwidth)}
        object.__setattr__(self, "expected_bandwidth", {k: v for k, v in merged.items() if v})

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> VerdictConfig:
        kw: dict[str, Any] = {
            "score_tolerance": getattr(settings, "score_tolerance", _DEFAULTS.score_tolerance),
            "slow_fraction": getattr(settings, "slow_fraction", _DEFAULTS.slow_fraction),
        }
        kw.update(overrides)
        return cls(**kw)

    def tolerance_for(self, chosen_score: float) -> float:
        return self.score_tolerance * max(1.0, abs(chosen_score))


# The defaults, read by `from_settings` (a slotted dataclass has no class attributes to read).
_DEFAULTS = VerdictConfig()
