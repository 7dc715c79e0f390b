"""The discrete-event run: arrivals, routing, prefill queues, KV transfers, decode batches.

Everything is computed as timestamps (seconds from the start of the run) from one seeded
random stream per scenario pool, so a pool's results do not depend on which other
scenarios run beside it, and a seed reproduces a run exactly.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field

from railtrace.simulator.fleet import Fleet, Pod
from railtrace.simulator.router import LEVEL_RANK as _LEVEL_RANK
from railtrace.simulator.router import Pick, Router, comparable, level
from railtrace.simulator.scenarios import Scenario
from railtrace.simulator.timing import TimingModel
from railtrace.verdicts.config import DEFAULT_EXPECTED_BANDWIDTH, VerdictConfig
from railtrace_tracing.semconv import FlagName, PathClass, TopologyLevel, Transport

PREFIX_GROUPS = 8
# Ground truth uses the verdicts' own yardsticks (score tolerance, slow fraction, bandwidth
# a healthy path of each class should give), so "expected flags" mean the same thing.
_VERDICT = VerdictConfig()
BLIND_TOLERANCE = _VERDICT.score_tolerance
SLOW_FRACTION = _VERDICT.slow_fraction
SLOW_MIN_BYTES = _VERDICT.slow_min_bytes
EXPECTED_BANDWIDTH = DEFAULT_EXPECTED_BANDWIDTH
CROSS_RAIL_SPLIT = (0.72, 0.28)  # the two-rail split seen on GB200 (ai-dynamo/nixl#1240)


@dataclass(slots=True)
class SimRequest:
    """One request with its ground truth and every timestamp the emitter needs."""

    index: int
    request_id: str
    scenario: str
    arrival: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    prefill_pick: Pick
    decode_pick: Pick
    sched_end: float = 0.0
    prefill_arrive: float = 0.0
    prefill_start: float = 0.0
    prefill_end: float = 0.0
    decode_arrive: float = 0.0
    kv_start: float = 0.0
    kv_end: float = 0.0
    kv_bytes: int = 0
    kv_ran: bool = True
    transport: str = Transport.RDMA
    path_class: str = PathClass.RDMA_SAME_RAIL
    devices: list[str] = field(default_factory=list)
    split: list[float] = field(default_factory=list)
    level: str = TopologyLevel.UNKNOWN
    failed: bool = False
    first_token: float | None = None
    decode_start: float = 0.0
    end: float = 0.0
    expected_flags: set[str] = field(default_factory=set)

    @property
    def prefill(self) -> Pod:
        return self.prefill_pick.chosen

    @property
    def decode(self) -> Pod:
        return self.decode_pick.chosen

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival


class _Link:
    """A NIC (or eth0) shared by concurrent transfers; each new one gets an equal share."""

    def __init__(self) -> None:
        self.busy: list[tuple[float, float]] = []

    def sharers(self, t: float) -> int:
        self.busy = [(s, e) for s, e in self.busy if e > t]
        return sum(1 for s, _ in self.busy if s <= t)


def _lanes(pod: Pod, transport: str) -> list[str]:
    if transport == Transport.TCP:
        return ["tcp/eth0"]
    if transport == Transport.NVLINK:
        return ["cuda_ipc/cuda"]
    return [f"rc_mlx5/{n.rdma_device}:1" for n in pod.nics]


def simulate(
    fleet: Fleet, scenarios: list[Scenario], requests: int, seed: int, timing: TimingModel | None = None
) -> list[SimRequest]:
    """Run `requests` requests spread evenly over the scenario pools; sorted by arrival."""
    timing = timing or TimingModel()
    per = [
        requests // len(scenarios) + (1 if i < requests % len(scenarios) else 0)
        for i in range(len(scenarios))
    ]
    out: list[SimRequest] = []
    for sc, n in zip(scenarios, per, strict=True):
        out.extend(_run_pool(fleet, sc, n, seed, timing))
    out.sort(key=lambda r: (r.arrival, r.scenario))
    for i, r in enumerate(out):
        r.index = i
    return out


def _run_pool(fleet: Fleet, sc: Scenario, n: int, seed: int, timing: TimingModel) -> list[SimRequest]:
    rng = random.Random(f"pool-{seed}-{sc.name}")
    router = Router(sc.router, fleet.shape.nvlink_scope, random.Random(f"router-{seed}-{sc.name}"))
    prefills = fleet.pods_of(sc.name, "prefill")
    decodes = fleet.pods_of(sc.name, "decode")
    prefix_len = [rng.randint(768, 1536) for _ in range(PREFIX_GROUPS)]
    busy_until: dict[str, float] = {}
    links: dict[str, _Link] = {}
    decoding: dict[str, list[tuple[float, float]]] = {}
    out: list[SimRequest] = []
    t = 0.0
    for _ in range(n):
        t += rng.expovariate(timing.pool_qps)
        group = rng.randrange(PREFIX_GROUPS)
        suffix = int(min(6000, max(64, rng.lognormvariate(6.7, 0.6))))
        prompt = prefix_len[group] + suffix
        output = int(min(600, max(16, rng.lognormvariate(5.2, 0.5))))
        rid = str(uuid.UUID(int=rng.getrandbits(128), version=4))

        p_pick = router.pick_prefill(t, prefills, group, prefix_len[group] / prompt)
        pf = p_pick.chosen
        d_pick = router.pick_decode(t, decodes, pf)
        dc = d_pick.chosen
        cached = prefix_len[group] if router.cached(pf, group) else 0
        r = SimRequest(0, rid, sc.name, t, prompt, cached, output, p_pick, d_pick)

        # Scheduling, then the sidecar sends the prefill leg (max_tokens=1).
        r.sched_end = t + timing.scheduling_s
        r.prefill_arrive = r.sched_end + timing.sidecar_overhead_s
        r.prefill_start = max(r.prefill_arrive, busy_until.get(pf.name, 0.0))
        r.prefill_end = r.prefill_start + timing.prefill_s(prompt, cached)
        busy_until[pf.name] = r.prefill_end
        router.st(pf).queued.append((r.prefill_end, prompt - cached))
        router.remember_prefix(pf, group)

        # Decode leg: the decode engine pulls the KV cache (NIXL READ) before its first step.
        r.decode_arrive = r.prefill_end + timing.sidecar_overhead_s
        r.level = level(pf, dc, fleet.shape.nvlink_scope)
        r.kv_bytes = timing.model.kv_bytes(prompt)
        if r.level == TopologyLevel.NVLINK_DOMAIN or r.level == TopologyLevel.SAME_HOST:
            r.transport, r.path_class = Transport.NVLINK, PathClass.NVLINK
        elif not dc.rdma_ok:
            r.transport, r.path_class = Transport.TCP, PathClass.TCP
        elif sc.second_rail or not dc.aligned:
            r.path_class = PathClass.RDMA_CROSS_RAIL
        r.devices = _lanes(dc, r.transport)
        r.split = list(CROSS_RAIL_SPLIT) if len(r.devices) == 2 else [1.0]
        r.kv_start = r.decode_arrive + timing.kv_setup_s
        keys = _link_keys(r, pf, dc)
        share = 1 + max((links.setdefault(k, _Link()).sharers(r.kv_start) for k in keys), default=0)
        r.kv_end = r.kv_start + _transfer_s(r, pf, dc, timing) * share
        deadline = t + timing.request_timeout_s
        if r.kv_end > deadline:
            r.failed = True
            r.kv_ran = r.kv_start < deadline
            r.kv_end = max(deadline, r.kv_start + 0.001)
        for k in keys:
            links[k].busy.append((r.kv_start, r.kv_end))

        if r.failed:
            r.decode_start = r.kv_end
            r.end = r.kv_end
        else:
            slots = decoding.setdefault(dc.name, [])
            slots[:] = [(s, e) for s, e in slots if e > r.kv_end]
            start = r.kv_end
            if len(slots) >= timing.max_num_seqs:
                start = sorted(e for _, e in slots)[len(slots) - timing.max_num_seqs]
            active = 1 + sum(1 for s, e in slots if s <= start < e)
            r.decode_start = start
            r.first_token = start + timing.decode_step(active)
            r.end = r.first_token + (output - 1) * timing.decode_step(active)
            slots.append((start, r.end))
        router.st(dc).inflight.append(r.end)
        router.st(pf).inflight.append(r.prefill_end)
        r.expected_flags = _expected_flags(r, sc, fleet.shape.nvlink_scope)
        out.append(r)
    return out


def _link_keys(r: SimRequest, pf: Pod, dc: Pod) -> list[str]:
    if r.transport == Transport.NVLINK:
        return [f"{dc.name}/nvlink"]
    if r.transport == Transport.TCP:
        return [f"{pf.node.name}/eth0", f"{dc.node.name}/eth0"]
    return [f"{pf.node.name}/{pf.nic.name}", f"{dc.node.name}/{dc.nic.name}"]


def _transfer_s(r: SimRequest, pf: Pod, dc: Pod, timing: TimingModel) -> float:
    mismatch = not dc.aligned
    if r.transport == Transport.NVLINK:
        return r.kv_bytes / timing.transfer_bandwidth(PathClass.NVLINK, r.level, False)
    if r.transport == Transport.TCP:
        return timing.tcp_latency_s + r.kv_bytes / timing.transfer_bandwidth(PathClass.TCP, r.level, False)
    own = timing.transfer_bandwidth(PathClass.RDMA_SAME_RAIL, r.level, mismatch)
    if len(r.devices) == 1:
        return timing.rdma_latency_s + r.kv_bytes / own
    # Two-rail split: the second NIC sits on the remote NUMA node and another rail, so its
    # share crosses the SMP link and the spine; the transfer ends when the slower part does.
    other = timing.transfer_bandwidth(PathClass.RDMA_CROSS_RAIL, TopologyLevel.FAR, True)
    return timing.rdma_latency_s + max(r.split[0] * r.kv_bytes / own, r.split[1] * r.kv_bytes / other)


def _expected_flags(r: SimRequest, sc: Scenario, nvlink_scope: str) -> set[str]:
    flags: set[str] = set()
    if r.transport == Transport.TCP:
        flags.add(FlagName.TCP_FALLBACK)
    if r.failed and r.kv_ran:
        flags.add(FlagName.KV_TRANSFER_FAILED)
    if not r.decode.aligned:
        # The claim itself pairs the GPU with another GPU's NIC (judged even over NVLink); an
        # RDMA transfer through that NIC runs on the other GPU's rail as well.
        flags.add(FlagName.GPU_NIC_MISMATCH)
        if r.transport == Transport.RDMA:
            flags.add(FlagName.CROSS_RAIL)
    if r.transport == Transport.RDMA and len(r.devices) > 1:
        flags.add(FlagName.CROSS_RAIL)
    if sc.decode_spans_lost:
        flags.add(FlagName.BROKEN_TRACE)
    chosen = next(c for c in r.decode_pick.candidates if c.pod is r.decode)
    for c in r.decode_pick.candidates:
        closer = _LEVEL_RANK[level(r.prefill, c.pod, nvlink_scope)] < _LEVEL_RANK[r.level]
        if closer and comparable(c.total, chosen.total, BLIND_TOLERANCE):
            flags.add(FlagName.TOPOLOGY_BLIND_PAIRING)
    # Slow by the same yardstick the verdicts use: contention and far paths can get there.
    expected = EXPECTED_BANDWIDTH.get(r.path_class)
    duration = r.kv_end - r.kv_start
    judged = r.kv_ran and not r.failed and r.kv_bytes >= SLOW_MIN_BYTES and duration > 0
    if judged and expected and r.kv_bytes / duration < SLOW_FRACTION * expected:
        flags.add(FlagName.SLOW_KV_TRANSFER)
    return flags
