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
import os
import socket
import threading
import time
import uuid
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

    def __init__(
        self,
        store: Store,
        settings: Settings,
        metrics: Metrics,
        pipeline: Pipeline,
        busy: Callable[[], bool] = lambda: False,
        retention: bool = True,
    ) -> None:
        self.store = store
        self.retention = retention
        self._busy = busy
        self.settings = settings
        self.metrics = metrics
        self.pipeline = pipeline
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_gauge = 0.0
        self._last_retention = 0.0
        self._retention_behind = False  # the last retention pass stopped with more to delete
        self.retention_batch = 500  # traces per delete transaction
        self.rounds = 0
        # Who holds an assembly lease: unique per running assembler, readable by an operator.
        self.owner = f"{socket.gethostname()[:40]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"

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
                # Acknowledging exports comes first: while the writer has work queued, assemble
                # in small batches and rest as long as each batch took, so assembly holds the
                # interpreter at most half the time and the backlog (durable) still drains.
                while not self._stop.is_set():
                    busy = self._busy()
                    started = time.monotonic()
                    more = self.run_once(limit=BUSY_BATCH if busy else FULL_BATCH)
                    self._housekeeping()  # time-gated; also runs while a backlog keeps this loop going
                    if not more:
                        break
                    if busy:
                        self._stop.wait(time.monotonic() - started)
            except Exception:  # a failing round (database away) must not end the loop
                log.exception("assembly round failed")
            self.rounds += 1
            self._stop.wait(self.settings.assembly_interval_s)

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now - self._last_gauge >= 2.0:
            self._last_gauge = now
            self.metrics[semconv.M_PENDING].set(self.store.count_dirty())
        due = now - self._last_retention >= 60.0
        if self.retention and self.settings.retention_hours > 0 and (due or self._retention_behind):
            if due:
                self._last_retention = now
            self.apply_retention(budget_s=RETENTION_SLICE_S)

    def apply_retention(self, now_ns: int | None = None, budget_s: float | None = None) -> int:
        """Delete traces older than the retention, in bounded batches. Returns traces deleted.

        With `budget_s`, stop after the batch that used it up and leave the rest for the next
        round (`_retention_behind`), so deleting a large expired history never holds up
        assembly for longer than that.
        """
        if self.settings.retention_hours <= 0:
            return 0
        now_ns = now_ns if now_ns is not None else time.time_ns()
        cutoff = now_ns - int(self.settings.retention_hours * 3600 * 1e9)
        started = time.monotonic()
        total = 0
        self._retention_behind = False
        while not self._stop.is_set():
            n = self.store.delete_older_than(cutoff, batch=self.retention_batch)
            total += n
            if n == 0:
                break
            if budget_s is not None and time.monotonic() - started >= budget_s:
                self._retention_behind = True
                break
        return total

    def run_once(self, now_ns: int | None = None, limit: int = 500) -> int:
        """Assemble the traces that are ready, as one batch: a few queries and one transaction
        for up to `limit` traces. Returns how many were picked when the page was full (call
        again), else 0.

        Several replicas may share the database: this one first leases the ready traces
        (`Store.claim_ready`), then the other traces of each request found through the
        request keys -- wherever they were ingested. A request whose traces another replica
        holds is left for later (its traces stay dirty); every lease is given up at the end.
        """
        now = now_ns if now_ns is not None else time.time_ns()
        quiet_cutoff = now - int(self.settings.quiet_period_s * 1e9)
        wait_cutoff = now - int(self.settings.max_trace_wait_s * 1e9)
        ready = self.store.claim_ready(self.owner, quiet_cutoff, wait_cutoff, now, LEASE_NS, limit)
        if not ready:
            return 0
        held = {t.trace_id for t in ready}
        keep: set[str] = set()
        try:
            keep = self._assemble(ready, held, now, quiet_cutoff, wait_cutoff, wall_clock=now_ns is None)
        finally:
            self.store.release(self.owner, held - keep)
        return len(ready) if len(ready) >= limit else 0

    def _assemble(
        self,
        ready: list[Any],
        held: set[str],
        now: int,
        quiet_cutoff: int,
        wait_cutoff: int,
        wall_clock: bool = True,
    ) -> set[str]:
        """Assemble the groups this replica holds entirely; returns the leases to keep.

        When two replicas each hold part of one request, the one holding the group's smallest
        trace id keeps its leases for its next round and the other lets go, so the request
        cannot bounce between them forever.
        """
        seen = {t.trace_id: t.last_arrival_ns for t in ready}
        late = {t.trace_id: t.late_spans for t in ready}
        spans = _by_trace(self.store.load_spans(seen, normalize=False))
        keys = {tid: self._keys(spans.get(tid, [])) for tid in seen}
        groups = _stitch(seen, keys, self.store.traces_for_keys(set().union(*keys.values())))
        others = {t for g in groups for t in g} - seen.keys()
        states = self.store.trace_states(others)
        wanted: list[set[str]] = []
        for g in groups:
            outside = g - seen.keys()
            busy = any(t in states and states[t].last_arrival_ns > quiet_cutoff for t in outside)
            if busy and max(seen[t] for t in g if t in seen) > wait_cutoff:
                continue  # a sibling hop is still arriving: assemble them together later
            wanted.append(g)
        extra = {t for g in wanted for t in g} - seen.keys()
        if extra:  # siblings of these requests, wherever they were ingested: lease them too
            held |= self.store.claim(self.owner, extra, now, LEASE_NS)
        todo = [g for g in wanted if g <= held or not (g - held) & states.keys()]
        keep = {t for g in wanted if g not in todo and min(g) in held for t in g & held}
        extra = {t for g in todo for t in g} - seen.keys()
        spans.update(_by_trace(self.store.load_spans(extra, normalize=False)))
        for t in extra:
            if t in states:
                seen[t] = states[t].last_arrival_ns
                late[t] = states[t].late_spans
        summaries: list[RequestSummary] = []
        marks: dict[str, int] = {}
        for g in todo:
            members = [s for t in sorted(g) for s in spans.get(t, [])]
            try:
                facts = self.pipeline.assemble(members, now_ns=now)
                summaries += [self.pipeline.judge(f) for f in facts]
            except Exception:  # leave this group without a summary, never retry it in a loop
                log.exception("assembly failed for traces %s (%d spans)", sorted(g), len(members))
                self.metrics[semconv.M_SPANS_REJECTED].labels("assembly_failed").inc(len(members))
            marks.update({t: seen[t] for t in g if t in seen})
        old = self.store.previous_summaries(marks)
        superseded = set(old) - {s.trace_id for s in summaries}
        self.store.save_assembly(summaries, marks, superseded, now)
        # Verdict latency is measured to the commit, on the wall clock (unless a test drives
        # the clock through `now_ns`).
        self._count(summaries, old, marks, late, time.time_ns() if wall_clock else now)
        return keep

    def _keys(self, spans: list[Span]) -> set[str]:
        keys: set[str] = set()
        for s in spans:
            try:
                keys.update(self.pipeline.request_keys(s))
            except Exception:
                log.exception("request_keys failed on span %s", s.span_id)
        return keys

    def _count(
        self,
        summaries: list[RequestSummary],
        old: dict[str, dict[str, Any]],
        marks: dict[str, int],
        late: dict[str, int],
        now: int,
    ) -> None:
        late_total = sum(late.get(t, 0) for t in marks)
        if late_total:
            self.metrics[semconv.M_LATE_SPANS].inc(late_total)
        for s in summaries:
            previous = old.get(s.trace_id) or next((old[t] for t in s.trace_ids if t in old), None)
            self.metrics.request_assembled(s.to_dict(), previous)
            if len(s.trace_ids) > 1 and (previous is None or len(previous.get("trace_ids") or []) <= 1):
                self.metrics[semconv.M_STITCHED].inc()
            arrivals = [marks[t] for t in s.trace_ids or [s.trace_id] if t in marks]
            if arrivals:
                self.metrics[semconv.M_ASSEMBLY_LAG].observe(max(0, now - max(arrivals)) / 1e9)


FULL_BATCH = 500
# Longest a retention pass holds up assembly; an expired backlog is deleted over many rounds.
RETENTION_SLICE_S = 0.25
# How long a claimed trace stays with its replica. Far longer than one round takes; a replica
# that dies holding leases delays those requests by at most this much.
LEASE_NS = 60 * 10**9
BUSY_BATCH = 50
MAX_KEY_FANOUT = 32  # a "key" shared by more traces than this is not one request's id


def _by_trace(spans: list[Span]) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for s in spans:
        out.setdefault(s.trace_id, []).append(s)
    return out


def _stitch(ready: dict[str, int], keys: dict[str, set[str]], pairs: list[tuple[str, str]]) -> list[set[str]]:
    """Groups of traces that share a request key (union-find), each holding a ready trace."""
    holders: dict[str, set[str]] = {}
    for key, tid in pairs:
        holders.setdefault(key, set()).add(tid)
    for tid, ks in keys.items():
        for k in ks:
            holders.setdefault(k, set()).add(tid)
    parent: dict[str, str] = {t: t for t in ready}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for tids in holders.values():
        if len(tids) > MAX_KEY_FANOUT:
            continue
        first, *rest = sorted(tids)
        for t in rest:
            parent[find(t)] = find(first)
    groups: dict[str, set[str]] = {}
    for t in list(parent):
        groups.setdefault(find(t), set()).add(t)
    return [g for g in groups.values() if g & ready.keys()]
