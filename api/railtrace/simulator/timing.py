"""The timing model: KV bytes, bandwidth per path, prefill compute, decode steps, timeouts.

Every constant names its published source in docs/simulator.md; the ones that are modelling
assumptions (fabric oversubscription, load slopes) say so there. Nothing here sleeps: the
simulator computes timestamps and the emitter stamps spans with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from railtrace_tracing.semconv import PathClass, TopologyLevel

GB = 1e9


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Enough of a transformer's shape to size its KV cache."""

    name: str = "Llama-3-70B-like"
    layers: int = 80
    kv_heads: int = 8
    head_dim: int = 128
    dtype_bytes: int = 2  # bf16 KV cache

    @property
    def kv_bytes_per_token(self) -> int:
        # K and V, per layer, per KV head: head_dim values of dtype_bytes each.
        return self.layers * self.kv_heads * self.head_dim * 2 * self.dtype_bytes

    def kv_bytes(self, prompt_tokens: int) -> int:
        return self.kv_bytes_per_token * prompt_tokens


# Effective per-transfer bandwidth by path class (bytes/s), docs/simulator.md "Bandwidth".
BANDWIDTH: dict[str, float] = {
    PathClass.NVLINK: 49 * GB,  # cuda_ipc push (vllm#52607)
    PathClass.RDMA_SAME_RAIL: 0.048 * GB / 0.0066,  # ~48 MB in ~6.6 ms, NIXL over RDMA on A4X
    PathClass.RDMA_CROSS_RAIL: 0.048 * GB / 0.0066 / 1.42,  # dranet nixl-kv-transfer: 1.42x
    PathClass.TCP: 0.5 * GB,  # NIXL GET over TCP (vllm#52607); 0.59 GB/s on A3 TCPX (ucx#10854)
}

# Share of the path's bandwidth left after the fabric levels a transfer crosses (assumption:
# rail-optimised leaves, 2:1 oversubscribed aggregation, 4:1 between blocks).
LEVEL_FACTOR: dict[str, float] = {
    TopologyLevel.SAME_HOST: 1.0,
    TopologyLevel.NVLINK_DOMAIN: 1.0,
    TopologyLevel.SUBBLOCK: 1.0,
    TopologyLevel.BLOCK: 0.5,
    TopologyLevel.ZONE: 1 / 4,
    TopologyLevel.FAR: 1 / 4,
}

# A transfer through a NIC on the other NUMA node (GPU/NIC mismatch) crosses the SMP link:
# dranet measured 39.07 vs 27.54 GB/s aligned vs unaligned (1.42x).
NUMA_PENALTY = 1.42


@dataclass(frozen=True, slots=True)
class TimingModel:
    model: ModelShape = field(default_factory=ModelShape)
    # Prefill: the llm-d tracing blog's capture prefilled 2,071 tokens in 47.7 ms.
    prefill_tokens_per_s: float = 2071 / 0.0447
    prefill_overhead_s: float = 0.003
    prefill_quadratic_s: float = 2e-10  # attention cost per (uncached x total) token pair
    # Decode: first step and per-token time grow with the running batch.
    decode_step_s: float = 0.018
    decode_step_per_active_s: float = 0.0012
    max_num_seqs: int = 16
    kv_setup_s: float = 0.0015  # NIXL post + descriptor exchange
    rdma_latency_s: float = 0.0001
    tcp_latency_s: float = 0.002
    scheduling_s: float = 0.0006  # EPP orchestration (the blog: 0.295 ms) plus ext_proc
    sidecar_overhead_s: float = 0.0008
    request_timeout_s: float = 8.0  # client timeout (the published run's value is not stated)
    pool_qps: float = 12.0  # arrivals per scenario pool (4 prefill + 4 decode pods)

    def prefill_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        todo = max(prompt_tokens - cached_tokens, 16)
        return (
            self.prefill_overhead_s
            + todo / self.prefill_tokens_per_s
            + self.prefill_quadratic_s * todo * prompt_tokens
        )

    def decode_step(self, active: int) -> float:
        return self.decode_step_s + self.decode_step_per_active_s * active

    def transfer_bandwidth(self, path_class: str, level: str, numa_mismatch: bool) -> float:
        bw = BANDWIDTH.get(path_class, BANDWIDTH[PathClass.TCP])
        if path_class not in (PathClass.NVLINK, PathClass.TCP):
            bw *= LEVEL_FACTOR.get(level, LEVEL_FACTOR[TopologyLevel.FAR])
        if numa_mismatch:
            bw /= NUMA_PENALTY
        return bw
