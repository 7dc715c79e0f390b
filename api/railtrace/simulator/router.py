"""The simulated EPP: llm-d-style weighted scorers over the real candidate lists.

Prefill picks weigh prefix-cache affinity against token load; decode picks weigh active
requests and, in topology-aware mode, a topology-affinity score relative to the chosen
prefill pod. The max-score picker breaks ties at random, which is how a topology-blind
router ends up passing over a closer decode pod with the same score.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from railtrace.simulator.fleet import Pod
from railtrace_tracing.semconv import TopologyLevel

# llm-d scorer names (llm_d.epp.scorer.<type>), with the weights of the simulated profiles.
PREFIX_SCORER = "prefix-cache-scorer"
TOKEN_LOAD_SCORER = "token-load-scorer"
ACTIVE_SCORER = "active-request-scorer"
TOPOLOGY_SCORER = "topology-affinity-scorer"
PREFILL_WEIGHTS = {PREFIX_SCORER: 2.0, TOKEN_LOAD_SCORER: 1.0}
DECODE_WEIGHTS = {ACTIVE_SCORER: 1.0}
TOPOLOGY_WEIGHT = 0.5
TOPOLOGY_SCORE: dict[str, float] = {
    TopologyLevel.SAME_HOST: 1.0,
    TopologyLevel.NVLINK_DOMAIN: 1.0,
    TopologyLevel.SUBBLOCK: 1.0,
    TopologyLevel.BLOCK: 0.5,
}


LEVEL_RANK: dict[str, int] = {
    lv: i
    for i, lv in enumerate(
        (
            TopologyLevel.SAME_HOST,
            TopologyLevel.NVLINK_DOMAIN,
            TopologyLevel.SUBBLOCK,
            TopologyLevel.BLOCK,
            TopologyLevel.ZONE,
            TopologyLevel.FAR,
        )
    )
}


def comparable(score: float, chosen: float, tolerance: float) -> bool:
    """Whether a candidate's score counts as comparable to the chosen one (as the verdicts judge)."""
    return score >= chosen - tolerance * max(1.0, abs(chosen)) - 1e-9


def level(a: Pod, b: Pod, nvlink_scope: str) -> str:
    """Topology distance between the hosts of two pods, nearest first."""
    if a.node is b.node:
        return TopologyLevel.SAME_HOST
    if a.node.subblock == b.node.subblock:
        return TopologyLevel.NVLINK_DOMAIN if nvlink_scope == "subblock" else TopologyLevel.SUBBLOCK
    if a.node.block == b.node.block:
        return TopologyLevel.BLOCK
    return TopologyLevel.FAR


@dataclass(slots=True)
class Scored:
    pod: Pod
    total: float
    scorers: dict[str, float]


@dataclass(slots=True)
class Pick:
    profile: str
    chosen: Pod
    candidates: list[Scored]


@dataclass(slots=True)
class PodState:
    """What the EPP knows about a pod: queued prefill tokens, requests in flight, cached prefixes."""

    queued: list[tuple[float, int]] = field(default_factory=list)  # (done at, tokens)
    inflight: list[float] = field(default_factory=list)  # end times of dispatched requests
    prefixes: list[int] = field(default_factory=list)  # LRU of prefix groups held in cache

    def token_load(self, now: float) -> int:
        self.queued = [(t, n) for t, n in self.queued if t > now]
        return sum(n for _, n in self.queued)

    def active(self, now: float) -> int:
        self.inflight = [t for t in self.inflight if t > now]
        return len(self.inflight)


class Router:
    def __init__(
        self, mode: str, nvlink_scope: str, rng: random.Random, cache_groups: int = 4, tolerance: float = 0.05
    ) -> None:
        self.mode = mode
        self.tolerance = tolerance
        self.nvlink_scope = nvlink_scope
        self.rng = rng
        self.cache_groups = cache_groups
        self.state: dict[str, PodState] = {}

    def st(self, pod: Pod) -> PodState:
        return self.state.setdefault(pod.name, PodState())

    def _pick(self, profile: str, scored: list[Scored], prefill: Pod | None = None) -> Pick:
        best = max(s.total for s in scored)
        top = [s for s in scored if s.total >= best - 1e-9]
        chosen = top[0] if len(top) == 1 else self.rng.choice(top)
        if prefill is not None and self.mode == "topology":
            # Topology-aware pairing: among comparable scores, the nearest decode pod wins.
            def rank(s: Scored) -> int:
                return LEVEL_RANK[level(prefill, s.pod, self.nvlink_scope)]

            while True:
                near = [
                    s
                    for s in scored
                    if rank(s) < rank(chosen) and comparable(s.total, chosen.total, self.tolerance)
                ]
                if not near:
                    break
                chosen = min(near, key=lambda s: (rank(s), -s.total))
        return Pick(profile, chosen.pod, scored)

    def pick_prefill(self, now: float, pods: list[Pod], group: int, prefix_share: float) -> Pick:
        loads = {p.name: self.st(p).token_load(now) for p in pods}
        worst = max(loads.values()) or 1
        scored = []
        for p in pods:
            cached = prefix_share if group in self.st(p).prefixes else 0.0
            s = {PREFIX_SCORER: round(cached, 4), TOKEN_LOAD_SCORER: round(1 - loads[p.name] / worst, 4)}
            total = sum(PREFILL_WEIGHTS[k] * v for k, v in s.items())
            scored.append(Scored(p, round(total, 4), s))
        return self._pick("prefill", scored)

    def pick_decode(self, now: float, pods: list[Pod], prefill: Pod) -> Pick:
        active = {p.name: self.st(p).active(now) for p in pods}
        most = max(active.values()) or 1
        scored = []
        for p in pods:
            s = {ACTIVE_SCORER: round((most - active[p.name]) / most, 4)}
            total = DECODE_WEIGHTS[ACTIVE_SCORER] * s[ACTIVE_SCORER]
            if self.mode == "topology":
                t = TOPOLOGY_SCORE.get(level(prefill, p, self.nvlink_scope), 0.0)
                s[TOPOLOGY_SCORER] = t
                total += TOPOLOGY_WEIGHT * t
            scored.append(Scored(p, round(total, 4), s))
        return self._pick("decode", scored, prefill)

    def cached(self, pod: Pod, group: int) -> bool:
        return group in self.st(pod).prefixes

    def remember_prefix(self, pod: Pod, group: int) -> None:
        lru = self.st(pod).prefixes
        if group in lru:
            lru.remove(group)
        lru.append(group)
        del lru[: max(0, len(lru) - self.cache_groups)]
