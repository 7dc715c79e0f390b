"""Assembly in child processes, so assembling requests uses other cores than receiving them.

In one process, receiving exports and assembling requests share one interpreter lock, and
assembly costs more per span than ingest; on a busy service the two slow each other down.
With `assembly_processes = N` the serve process starts N children instead of its assembler
thread. Each child opens the same database and topology and runs the ordinary `Assembler`
loop; the trace leases that let several replicas share one database (`Store.claim_ready`)
keep the children apart as well. What the children count comes back to the serve process
over a queue, every `RELAY_INTERVAL_S`, as per-series deltas (counts, sums, the latest exemplar
of each counter and bucket; `railtrace.metrics.Delta`) that it adds to its own families, so
`/metrics` stays the one place to scrape and the serve process does one merge per series
touched, not one update per observation. A child that dies is started again; the leases it
held run out, and what it had counted but not yet sent is lost with it.

The default, `auto`, starts `AUTO_PROCESSES` children where the service may use at least
`AUTO_MIN_CPUS` CPUs (its affinity, capped by a container's CPU quota), and assembles in a
thread otherwise: on one CPU, children would only take turns with the serve process.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing
import os
import queue as queue_mod
import signal
import threading
import time
from pathlib import Path
from typing import Any, Literal

from railtrace.metrics import Delta, MetricLimits, Metrics
from railtrace.settings import Settings

log = logging.getLogger(__name__)

# How often a child sends what it counted: a request is counted in the serve process's
# /metrics at most this long after its summary is stored.
RELAY_INTERVAL_S = 0.01
# Young-generation collection threshold of an assembly process (see `_child_main`).
ASSEMBLY_GC_THRESHOLD = 20_000
# `assembly_processes = auto`: one Python process receives about three requests in the CPU
# time it takes to assemble one, so a thread falls behind long before ingest does; two
# children on two CPUs kept verdict latency within target at half the maximum ingest rate
# (benchmarks/verdicts). More were not measured to help on two CPUs.
AUTO_PROCESSES = 2
AUTO_MIN_CPUS = 2.0


def usable_cpus(
    cgroup_root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")
) -> float:
    """CPUs this process may use: its CPU affinity, capped by the tightest cgroup CPU quota on
    the way from its cgroup to the root (a container's CPU limit, or a systemd unit's
    `CPUQuota`, which neither `os.cpu_count` nor the affinity shows)."""
    try:
        cpus = float(len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        cpus = float(os.cpu_count() or 1)
    quotas: list[float] = []
    own = "/"
    with contextlib.suppress(OSError):
        for line in proc_cgroup.read_text().splitlines():
            # cgroup v2: "0::/path"; a path with ".." lies outside this namespace's view.
            if line.startswith("0::") and ".." not in line:
                own = line[3:] or "/"
    here = cgroup_root / own.lstrip("/")
    for directory in (here, *here.parents):
        with contextlib.suppress(OSError, ValueError):
            limit, period = (directory / "cpu.max").read_text().split()
            if limit != "max":
                quotas.append(int(limit) / int(period))
        if directory == cgroup_root:
            break
    if not quotas:
        with contextlib.suppress(OSError, ValueError):  # cgroup v1, as a container sees it
            limit_us = int((cgroup_root / "cpu" / "cpu.cfs_quota_us").read_text())
            period_us = int((cgroup_root / "cpu" / "cpu.cfs_period_us").read_text())
            if limit_us > 0 and period_us > 0:
                quotas.append(limit_us / period_us)
    return min([cpus, *quotas])


def assembly_process_count(setting: int | Literal["auto"], cpus: float | None = None) -> int:
    """The number of assembly children `setting` asks for on this machine (0: a thread)."""
    if setting != "auto":
        return setting
    cpus = usable_cpus() if cpus is None else cpus
    return AUTO_PROCESSES if cpus >= AUTO_MIN_CPUS else 0


class RecordedMetrics(Metrics):
    """Stands in for `Metrics` inside a child: the same families and update rules, and what
    was counted is handed over as a delta (`take`) for the serve process to add in.

    The assembler thread counts while the child's main thread takes deltas to send; both go
    through the one lock of `Metrics`, and a taken delta is never written to again (the queue
    pickles it later, in its feeder thread).
    """

    def __init__(self) -> None:
        # No zero series: a zero gauge would overwrite the serve process's. Unbounded labels:
        # a delta holds only what one relay interval counted, and the serve process bounds
        # the values when it adds them in, the same way for every child.
        super().__init__(zero_series=False, limits=MetricLimits.unbounded())

    def take(self) -> Delta:
        """What was counted since the last take, per family and series (the series touched)."""
        out: Delta = {}
        with self._lock:
            for name, family in self.families.items():
                if family.series:
                    out[name], family.series = family.series, {}
        return out


def _child_main(settings_data: dict[str, Any], out: Any, stop: Any, index: int) -> None:
    """Entry point of one assembly process: the serve process's settings, its own engine."""
    from railtrace.scheduling.assembler import Assembler, default_pipeline
    from railtrace.store import Store, make_engine
    from railtrace.topology import open_topology

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the serve process decides when to stop
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s assembly-{index} %(levelname)s %(message)s")
    settings = Settings.model_validate(settings_data)
    engine = make_engine(settings.db, derived_only=True)  # assembly writes only derived state
    holder, live = open_topology(list(settings.topology))
    metrics = RecordedMetrics()
    assembler = Assembler(
        Store(engine),
        settings,
        metrics,  # type: ignore[arg-type]
        default_pipeline(settings, holder.get),
        retention=index == 0,  # one process deletes old history, not all of them at once
    )
    # What start-up built lives as long as the child: keep the collector from walking it on
    # every full collection (a few per cent of assembly, measured with callgrind).
    gc.freeze()
    # Assembly makes and drops many small objects per request (spans, attribute dicts); the
    # default young-generation threshold (700) collected several times per request. Cycles
    # among them are rare, so collecting less often costs little memory; with start-up frozen
    # too, 6 % fewer instructions per assembled request (1.80M -> 1.69M, callgrind).
    gc.set_threshold(ASSEMBLY_GC_THRESHOLD, 50, 100)
    assembler.start()
    parent = os.getppid()
    try:
        # Stop with the serve process, also when it was killed and could not say so.
        while not stop.value and os.getppid() == parent:
            time.sleep(RELAY_INTERVAL_S)
            updates = metrics.take()
            if updates:
                out.put(updates)
    finally:
        assembler.stop()
        updates = metrics.take()
        if updates:
            out.put(updates)
        if live is not None:
            live.stop()
        engine.dispose()


class AssemblyWorkers:
    """`processes` assembly children of this serve process, watched and restarted."""

    def __init__(self, settings: Settings, metrics: Metrics, processes: int) -> None:
        self.settings = settings
        self.metrics = metrics
        self.processes = processes
        self._ctx = multiprocessing.get_context("spawn")  # no fork: the parent holds threads
        self._queue: Any = self._ctx.Queue()
        # A shared flag, not a multiprocessing Event: setting an Event that a killed child
        # was waiting on blocks forever.
        self._stop: Any = self._ctx.Value("b", 0, lock=False)
        self._children: list[Any] = []
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.restarts = 0

    def _spawn(self, index: int) -> Any:
        proc = self._ctx.Process(
            target=_child_main,
            args=(self.settings.model_dump(), self._queue, self._stop, index),
            name=f"railtrace-assembly-{index}",
            daemon=True,
        )
        proc.start()
        return proc

    def start(self) -> AssemblyWorkers:
        self._children = [self._spawn(i) for i in range(self.processes)]
        self._thread = threading.Thread(target=self._run, name="railtrace-assembly-metrics", daemon=True)
        self._thread.start()
        return self

    @property
    def alive(self) -> int:
        return sum(1 for p in self._children if p.is_alive())

    def _run(self) -> None:
        """Apply the children's metric updates; start again a child that died."""
        last_check = time.monotonic()
        while not self._stopping.is_set():
            with contextlib.suppress(queue_mod.Empty):
                self.metrics.merge(self._queue.get(timeout=0.1))
            if time.monotonic() - last_check >= 1.0:
                last_check = time.monotonic()
                for i, proc in enumerate(self._children):
                    if not proc.is_alive() and not self._stop.value:
                        log.warning("assembly process %d exited (code %s); restarting", i, proc.exitcode)
                        self.restarts += 1
                        self._children[i] = self._spawn(i)

    def stop(self, timeout: float = 30.0) -> None:
        """Let each child finish its round and report, then stop applying updates."""
        self._stop.value = 1
        deadline = time.monotonic() + timeout
        for proc in self._children:
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        self._stopping.set()
        if self._thread:
            self._thread.join(5)
        while True:  # what the children sent last
            try:
                self.metrics.merge(self._queue.get(timeout=0.2))
            except queue_mod.Empty:
                break
        self._queue.close()
