"""The assembler loop: dirty traces past their quiet period become request summaries.

Which traces need work is durable state in the store (`traces.dirty`), so a restart picks
up requests that were half assembled. For each trace the loop also loads the traces that
share a request key (hops of one request that arrived in separate traces), hands all their
spans to `railtrace.assembly.assemble`, judges each result with `railtrace.verdicts.judge`
against the current topology, and stores the summaries. A trace that got spans while it
was being assembled stays dirty and is done again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from railtrace.metrics import Metrics
from railtrace.model import RequestFacts, RequestSummary, Span
from railtrace.settings import Settings
from railtrace.store import Store
from railtrace_tracing import semconv

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Pipeline:
    """The three functions assembly needs from the other parts (injected for unit tests)."""

    request_keys: Callable[[Span], list[str]]
    assemble: Callable[..., list[RequestFacts]]
    judge: Callable[[RequestFacts], RequestSummary]


def default_pipeline(settings: Settings, topology: Callable[[], Any]) -> Pipeline:
    """The real assembly and verdicts, judged against the topology current at each call."""
    from railtrace import assembly, verdicts

    config = verdict_config(settings)

    def judge(facts: RequestFacts) -> RequestSummary:
        return verdicts.judge(facts, topology(), config)

    return Pipeline(assembly.request_keys, assembly.assemble, judge)


def verdict_config(settings: Settings) -> Any:
    from railtrace.verdicts import VerdictConfig

    return VerdictConfig.from_settings(settings)


class Assembler:
    """Background thread running `run_once` every `assembly_interval_s`, plus retention."""

    def __init__(self, store: Store, settings: Settings, metrics: Metrics, pipeline: Pipeline) -> None:
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.pipeline = pipeline
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_gauge = 0.0
        self._last_retention = 0.0
        self.rounds = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="railtrace-assembler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                while self.run_once() and not self._stop.is_set():
                    pass  # a full page: keep going without sleeping
                self._housekeeping()
            except Exception:  # a failing round (database away) must not end the loop
                log.exception("assembly round failed")
            self.rounds += 1
            self._stop.wait(self.settings.assembly_interval_s)

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now - self._last_gauge >= 2.0:
            self._last_gauge = now
            self.metrics[semconv.M_PENDING].set(self.store.count_dirty())
        if self.settings.retention_hours > 0 and now - self._last_retention >= 60.0:
            self._last_retention = now
            self.apply_retention()

    def apply_retention(self, now_ns: int | None = None) -> int:
        """Delete traces older than the retention, in bounded batches. Returns traces deleted."""
        if self.settings.retention_hours <= 0:
            return 0
        now_ns = now_ns if now_ns is not None else time.time_ns()
        cutoff = now_ns - int(self.settings.retention_hours * 3600 * 1e9)
        total = 0
        while not self._stop.is_set():
            n = self.store.delete_older_than(cutoff)
            total += n
            if n == 0:
                break
        return total

    def run_once(self, now_ns: int | None = None, limit: int = 500) -> int:
        """Assemble the traces that are ready. Returns how many were picked (0: none ready)."""
        now = now_ns if now_ns is not None else time.time_ns()
        quiet_cutoff = now - int(self.settings.quiet_period_s * 1e9)
        wait_cutoff = now - int(self.settings.max_trace_wait_s * 1e9)
        ready = self.store.dirty_traces(quiet_cutoff, wait_cutoff, limit)
        done: set[str] = set()
        for trace in ready:
            if trace.trace_id in done:
                continue
            done |= self._assemble_group(
                trace.trace_id, trace.last_arrival_ns, now, quiet_cutoff, wait_cutoff
            )
        return len(ready) if len(ready) >= limit else 0

    def _assemble_group(
        self, trace_id: str, last_arrival_ns: int, now: int, quiet_cutoff: int, wait_cutoff: int
    ) -> set[str]:
        spans = self.store.load_spans([trace_id])
        keys: set[str] = set()
        for s in spans:
            if s.request_key:
                keys.add(s.request_key)
            try:
                keys.update(self.pipeline.request_keys(s))
            except Exception:
                log.exception("request_keys failed on span %s", s.span_id)
        related = self.store.traces_for_keys(keys) - {trace_id}
        states = self.store.trace_states(related | {trace_id})
        if related:
            busy = [t for t in related if t in states and states[t].last_arrival_ns > quiet_cutoff]
            if busy and last_arrival_ns > wait_cutoff:
                return set()  # a sibling hop is still arriving: assemble them together later
            spans.extend(self.store.load_spans(related))
        group = {tid: st.last_arrival_ns for tid, st in states.items()}
        group.setdefault(trace_id, last_arrival_ns)
        try:
            facts = self.pipeline.assemble(spans, now_ns=now)
            summaries = [self.pipeline.judge(f) for f in facts]
            old = self.store.previous_summaries(group)
            superseded = set(old) - {s.trace_id for s in summaries}
            self.store.save_assembly(summaries, group, superseded, now)
        except Exception:
            # Never spin on one trace: leave it without a summary, say so, and move on.
            log.exception("assembly failed for trace %s (%d spans)", trace_id, len(spans))
            self.store.save_assembly([], group, (), now)
            self.metrics[semconv.M_SPANS_REJECTED].labels("assembly_failed").inc(len(spans))
            return set(group)
        late = sum(st.late_spans for st in states.values())
        if late:
            self.metrics[semconv.M_LATE_SPANS].inc(late)
        lag_s = max(0, now - max(group.values())) / 1e9
        for s in summaries:
            previous = old.get(s.trace_id) or next((old[t] for t in s.trace_ids if t in old), None)
            self.metrics.request_assembled(s.to_dict(), previous)
            if len(s.trace_ids) > 1 and (previous is None or len(previous.get("trace_ids") or []) <= 1):
                self.metrics[semconv.M_STITCHED].inc()
            self.metrics[semconv.M_ASSEMBLY_LAG].observe(lag_s)
        return set(group)
