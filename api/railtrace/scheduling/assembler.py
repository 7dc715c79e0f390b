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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from railtrace.metrics import Metrics
from railtrace.model import RequestFacts, RequestSummary, Span
from railtrace.scheduling.failures import AssemblyFailures
from railtrace.scheduling.grouping import (
    excess_notes,
    fits,
    group_traces,
    key_blocks,
    split_group,
    split_note,
)
from railtrace.settings import Settings
from railtrace.store import AssembledGroup, Store
from railtrace_tracing import semconv

log = logging.getLogger(__name__)


def _ignore(stage: str, exc: BaseException) -> None:
    """No one to tell (a pipeline not run by an `Assembler`)."""


@dataclass(slots=True)
class Pipeline:
    """The three functions assembly needs from the other parts (injected for unit tests)."""

    request_keys: Callable[[Span], list[str]]
    assemble: Callable[..., list[RequestFacts]]
    judge: Callable[[RequestFacts], RequestSummary]
    # Where the real assembly tells the steps it skipped because they raised
    # (`railtrace.assembly.FailureSink`); the `Assembler` running the pipeline sets its own.
    on_failure: Callable[[str, BaseException], None] = _ignore


def default_pipeline(settings: Settings, topology: Callable[[], Any]) -> Pipeline:
    """The real assembly and verdicts, judged against the topology current at each call."""
    from railtrace import assembly, verdicts

    config = verdict_config(settings)

    def judge(facts: RequestFacts) -> RequestSummary:
        return verdicts.judge(facts, topology(), config)

    def request_keys(span: Span) -> list[str]:
        return assembly.request_keys(span, pipeline.on_failure)

    def assemble(spans: list[Span], now_ns: int | None = None) -> list[RequestFacts]:
        return assembly.assemble(spans, now_ns, pipeline.on_failure)

    pipeline = Pipeline(request_keys, assemble, judge)
    return pipeline


def verdict_config(settings: Settings) -> Any:
    from railtrace.verdicts import VerdictConfig

    return VerdictConfig.from_settings(settings)


class Assembler:
    """Background thread running `run_once` every `look_interval_s`, plus retention."""

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
        # Counted and logged once per kind: what assembly skipped because it raised.
        self.failures = AssemblyFailures(metrics)
        pipeline.on_failure = self.failures
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_gauge = 0.0
        self._last_retention = 0.0
        self._last_statistics = 0.0
        self._retention_behind = False  # the last retention pass stopped with more to delete
        self.retention_batch = 500  # traces per delete transaction
        self.rounds = 0
        # Assemble this long before a request's quiet period ends, store it when it has ended.
        self.lookahead_ns = int(min(settings.assembly_lookahead_s, settings.quiet_period_s / 2) * 1e9)
        # Seconds between looks for work: `assembly_interval_s`, and at most half the lookahead,
        # so a request is claimed while its lookahead still has room and no look adds latency.
        # Each look is a claim and a page's round of statements: looking every 200 ms instead of
        # every 50 ms took ~8 % off the assembly processes' CPU (benchmarks/verdicts/README.md).
        self.look_interval_s = settings.assembly_interval_s
        if self.lookahead_ns:
            self.look_interval_s = min(self.look_interval_s, self.lookahead_ns / 2e9)
        self._pending: list[_Pending] = []  # assembled, waiting for their due time; by due time
        # Leased and not assembled (a sibling was held elsewhere, or storing failed), to be
        # claimed again: trace id -> when its lease runs out at the latest.
        self._kept: dict[str, int] = {}
        # Who holds an assembly lease: unique per running assembler, readable by an operator.
        self.owner = f"{socket.gethostname()[:40]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="railtrace-assembler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=30)
        try:
            self.abandon_pending()
        except Exception:  # the leases run out by themselves
            log.exception("could not give up assembly leases")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                # Acknowledging exports comes first: while the writer has work queued, assemble
                # in small batches and rest as long as each batch took, so assembly holds the
                # interpreter at most half the time and the backlog (durable) still drains.
                while not self._stop.is_set():
                    busy = self._busy()
                    started = time.monotonic()
                    more = self.run_once(limit=BUSY_BATCH if busy else ROUND_PAGE)
                    self._housekeeping()  # time-gated; also runs while a backlog keeps this loop going
                    if not more:
                        break
                    if busy:
                        self._stop.wait(time.monotonic() - started)
                self._store_until_next_look()
            except Exception:  # a failing round (database away) must not end the loop
                log.exception("assembly round failed")
                self._stop.wait(self.look_interval_s)
            self.rounds += 1

    def _store_until_next_look(self) -> None:
        """Until the next look for ready traces, wake only to store requests as they come due.

        Looking (`Store.claim_ready`) is a write transaction that waits for the ingest writer's
        commit; waking for every due request must not also look each time.
        """
        next_look = time.monotonic() + self.look_interval_s
        while not self._stop.is_set():
            left = next_look - time.monotonic()
            if left <= 0:
                return
            due = self.next_due_ns()
            if due is not None:
                left = min(left, max(0.0, (due - time.time_ns()) / 1e9 + PUBLISH_GATHER_S))
            self._stop.wait(left)
            self.publish_due()

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now - self._last_statistics >= STATISTICS_INTERVAL_S:
            self._last_statistics = now
            try:
                self.store.refresh_statistics()
            except Exception:  # plans without statistics are slower, not wrong
                log.warning("could not refresh table statistics", exc_info=True)
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
        """One step: store the assembled requests that are due, assemble up to `limit` traces
        that are ready or will be within the lookahead, store what of them is due already.
        Returns how many traces were picked when the page was full (call again), else 0.

        On the wall clock (`now_ns` None) traces are assembled up to `lookahead_ns` before
        their quiet period ends and held until it has, so that a request is stored just
        after it becomes due instead of a whole round later. A test driving the clock
        through `now_ns` gets no lookahead: everything picked is due and stored at once.
        """
        lookahead = self.lookahead_ns if now_ns is None else 0
        self.publish_due(now_ns)
        picked = self.prepare(now_ns if now_ns is not None else time.time_ns(), limit, lookahead)
        self.publish_due(now_ns)
        return picked

    def prepare(self, now: int, limit: int, lookahead: int = 0) -> int:
        """Lease up to `limit` traces ready by `now + lookahead` and assemble them; the results
        wait in `_pending` for their due time. Returns `limit` when the page was full, else 0.

        Several replicas may share the database: this one first leases the ready traces
        (`Store.claim_ready`), then the other traces of each request found through the
        request keys -- wherever they were ingested. A request whose traces another replica
        holds is left for later (its traces stay dirty); leases of traces not assembled now
        are given up at once, the rest when their group is stored (`Store.publish`).
        """
        quiet_ns = int(self.settings.quiet_period_s * 1e9)
        quiet_cutoff = now - quiet_ns
        wait_cutoff = now - int(self.settings.max_trace_wait_s * 1e9)
        pending = {t for p in self._pending for t in p.group.marks}
        self._kept = {t: until for t, until in self._kept.items() if until > now}
        ready = self.store.claim_ready(
            self.owner,
            quiet_cutoff + lookahead,
            wait_cutoff,
            now,
            LEASE_NS,
            limit,
            skip=pending,
            again=self._kept,
        )
        if not ready:
            return 0
        held = {t.trace_id for t in ready}
        for t in held:  # what is kept this time is decided again below
            self._kept.pop(t, None)
        keep: set[str] = set()
        try:
            keep = self._assemble(
                ready, held, pending, now, quiet_cutoff + lookahead, wait_cutoff, quiet_ns, bool(lookahead)
            )
        finally:
            self.store.release(self.owner, held - keep)
        return len(ready) if len(ready) >= limit else 0

    def _assemble(
        self,
        ready: list[Any],
        held: set[str],
        pending: set[str],
        now: int,
        ready_cutoff: int,
        wait_cutoff: int,
        quiet_ns: int,
        wall_clock: bool,
    ) -> set[str]:
        """Assemble the groups this replica holds entirely into `_pending`; returns the
        leases to keep (those of pending groups, and of groups kept for the next round).

        When two replicas each hold part of one request, the one holding the group's smallest
        trace id keeps its leases for its next round and the other lets go, so the request
        cannot bounce between them forever.
        """
        seen = {t.trace_id: t.last_arrival_ns for t in ready}
        late = {t.trace_id: t.late_spans for t in ready}
        # Spans held at once stay within `max_group_spans` (beyond one load batch): a trace
        # read past it gives its keys and span count, and is read again for its part.
        loader = _SpanLoader(self.store, self.settings.max_group_spans)
        keys = {}
        for tid, members in loader.load(seen):
            keys[tid] = self._keys(members)
        self._store_come_due(wall_clock)
        pairs = self.store.traces_for_keys(set().union(*keys.values()))
        groups = group_traces(seen, keys, pairs)
        excess = excess_notes(keys, pairs)
        self._store_come_due(wall_clock)
        others = {t for g in groups for t in g} - seen.keys()
        states = self.store.trace_states(others)
        wanted: list[tuple[set[str], bool]] = []  # (group, forced by max_trace_wait)
        for g in groups:
            if g & pending:
                continue  # joins a request assembled and not stored yet: after it is stored
            outside = g.difference(seen)  # not `g - seen.keys()`: that walks all of `seen`
            busy = any(t in states and states[t].last_arrival_ns > ready_cutoff for t in outside)
            if busy and max(seen[t] for t in g if t in seen) > wait_cutoff:
                continue  # a sibling hop is still arriving: assemble them together later
            wanted.append((g, busy))
        extra = {t for g, _ in wanted for t in g} - seen.keys()
        if extra:  # siblings of these requests, wherever they were ingested: lease them too
            held |= self.store.claim(self.owner, extra, now, LEASE_NS)
        todo = [(g, forced) for g, forced in wanted if g <= held or not (g - held) & states.keys()]
        done = [g for g, _ in todo]
        assembling = {id(g) for g in done}  # by identity: `g in done` compared sets, page squared
        keep = {t for g, _ in wanted if id(g) not in assembling and min(g) in held for t in g & held}
        self._kept.update(dict.fromkeys(keep, now + LEASE_NS))  # the next round claims them again
        extra = {t for g in done for t in g} - seen.keys()
        for t in extra:
            if t in states:
                seen[t] = states[t].last_arrival_ns
                late[t] = states[t].late_spans
        max_traces, max_spans = self.settings.max_group_traces, self.settings.max_group_spans
        fresh: list[_Pending] = []
        for g, forced in todo:
            self._store_come_due(wall_clock)
            # A group's other traces are counted (and held within the bound) when it is
            # assembled; each part's spans are let go after it.
            for _ in loader.load(g - loader.counts.keys()):
                pass
            sizes = {t: loader.counts.get(t, 0) for t in g}
            if fits(g, sizes, max_traces, max_spans):
                parts = [sorted(g)]
            else:  # each request id's traces together, earliest first
                parts = split_group(g, sizes, max_traces, max_spans, key_blocks(g, pairs))
            note = None
            if len(parts) > 1:
                note = split_note(len(g), sum(sizes.values()), len(parts), max_traces, max_spans)
                log.warning("traces %s..%s: %s", min(g), max(g), note)
            for part in parts:
                members = loader.take(part)
                summaries: list[RequestSummary] = []
                try:
                    facts = self.pipeline.assemble(members, now_ns=now)
                    _note_excess(facts, excess)
                    if note is not None:
                        _note_split(facts, note)
                except Exception as exc:  # leave this part without a summary, never retry it in a loop
                    facts = []
                    self.failures(semconv.AssemblyStage.ASSEMBLE, exc)
                    self.metrics[semconv.M_SPANS_REJECTED].labels("assembly_failed").inc(len(members))
                for f in facts:
                    try:
                        summaries.append(self.pipeline.judge(f))
                    except Exception as exc:  # this request goes without a summary, not the others
                        self.failures(semconv.AssemblyStage.JUDGE, exc)
                del members
                marks = {t: seen[t] for t in part if t in seen}
                due = max((seen[t] for t in g if t in seen), default=now) + quiet_ns
                speculative = due > now and not forced
                group = AssembledGroup(summaries, marks, speculative=speculative)
                fresh.append(_Pending(due if speculative else now, group, sum(late.get(t, 0) for t in marks)))
            loader.drop(g)
            keep |= g & held
        self._pending = sorted(self._pending + fresh, key=lambda p: p.due_ns)
        return keep

    def _store_come_due(self, wall_clock: bool) -> None:
        """Store an earlier page's requests that came due while this page is being loaded or
        assembled: now, not after the page (a page of 128 traces is tens of milliseconds of work
        on a busy machine, which the requests waiting would add to their latency)."""
        if wall_clock and self._pending and self._pending[0].due_ns + GATHER_NS <= time.time_ns():
            self.publish_due()

    def publish_due(self, now_ns: int | None = None) -> int:
        """Store the pending groups whose quiet period has ended, in one transaction; a
        speculative group that got a span since it was loaded is dropped (its traces stay
        dirty). Returns how many groups were stored."""
        now = now_ns if now_ns is not None else time.time_ns()
        n = 0
        while n < len(self._pending) and self._pending[n].due_ns <= now:
            n += 1
        if not n:
            return 0
        due, self._pending = self._pending[:n], self._pending[n:]
        marks = {t: seen for p in due for t, seen in p.group.marks.items()}
        try:
            old = self.store.previous_summaries(marks)
            # Primaries stored by this transaction: no group's replacing deletes them (the parts
            # of a split group each hold the whole group's earlier summaries).
            storing = {s.trace_id for p in due for s in p.group.summaries}
            for p in due:
                holding = _holding(p.group, old)
                # Replaced: those not stored again under the same primary trace.
                p.group.superseded = holding - storing
                p.group.first = not holding
            stored = {id(g) for g in self.store.publish([p.group for p in due], now, owner=self.owner)}
        except Exception:
            # Still leased to this assembler: the next step takes them again.
            self._kept.update(dict.fromkeys(marks, now + LEASE_NS))
            raise
        # Verdict latency is measured to the commit, on the wall clock (unless a test drives
        # the clock through `now_ns`).
        counted_at = time.time_ns() if now_ns is None else now
        kept: list[_Pending] = []
        redone = 0  # requests dropped because a span arrived since they were loaded
        for p in due:
            if id(p.group) in stored:
                kept.append(p)
            else:
                redone += len(p.group.summaries)
        self._count(kept, old, counted_at)
        if redone:
            self.metrics[semconv.M_REDONE].inc(redone)
        return len(stored)

    def next_due_ns(self) -> int | None:
        """When the earliest pending group becomes due (None: nothing pending)."""
        return self._pending[0].due_ns if self._pending else None

    def abandon_pending(self) -> None:
        """Give up the leases of groups assembled but not stored (stopping)."""
        pending, self._pending = self._pending, []
        if pending:
            self.store.release(self.owner, {t for p in pending for t in p.group.marks})

    def _keys(self, spans: list[Span]) -> set[str]:
        keys: set[str] = set()
        for s in spans:
            try:
                keys.update(self.pipeline.request_keys(s))
            except Exception as exc:
                self.failures(semconv.AssemblyStage.REQUEST_KEYS, exc)
        return keys

    def _count(self, stored: list[_Pending], old: dict[str, dict[str, Any]], now: int) -> None:
        late_total = sum(p.late_spans for p in stored)
        if late_total:
            self.metrics[semconv.M_LATE_SPANS].inc(late_total)
        # Stored requests these groups replaced: their verdict counts are corrected by what
        # changed (`Metrics.verdicts_revised`), once for all groups, as a split group's parts
        # each hold the whole group's earlier summaries.
        holdings = [_holding(p.group, old) if old else set() for p in stored]
        replaced = set().union(*holdings)
        revised: list[RequestSummary] = []
        for p, holding in zip(stored, holdings, strict=True):
            marks = p.group.marks
            reassembled = bool(holding)
            for s in p.group.summaries:
                previous = old.get(s.trace_id) or next((old[t] for t in s.trace_ids if t in old), None)
                self.metrics.request_assembled(s, previous, verdicts=not reassembled)
                if reassembled:
                    revised.append(s)
                if len(s.trace_ids) > 1 and (previous is None or len(previous.get("trace_ids") or []) <= 1):
                    self.metrics[semconv.M_STITCHED].inc()
                arrivals = [marks[t] for t in s.trace_ids or [s.trace_id] if t in marks]
                if arrivals:
                    self.metrics[semconv.M_ASSEMBLY_LAG].observe(max(0, now - max(arrivals)) / 1e9)
        if replaced:
            self.metrics.verdicts_revised(revised, [old[t] for t in sorted(replaced)])


@dataclass(slots=True)
class _Pending:
    """An assembled group waiting for its due time (last arrival plus the quiet period)."""

    due_ns: int
    group: AssembledGroup
    late_spans: int


def _holding(group: AssembledGroup, old: dict[str, dict[str, Any]]) -> set[str]:
    """Primary trace ids of the stored requests (`old`) that hold one of this group's traces."""
    marks = group.marks
    return {p for p, s in old.items() if p in marks or any(t in marks for t in s.get("trace_ids") or ())}


FULL_BATCH = 500
# Traces the running loop assembles per step: ~0.1 s of work. Requests that come due meanwhile
# are stored between its phases (claiming, loading, looking up keys) and between its groups.
ROUND_PAGE = 128
# Requests come due in small groups, one per ingest commit (up to a few dozen a second); the
# loop waits this long past the first one's due time and stores every group due by then in one
# transaction. Each storing transaction waits for its writers' turn (SQLite) and writes its
# rollup rows and index pages once: fewer, fuller ones cost less than one per group, for a
# few milliseconds on each request's latency.
PUBLISH_GATHER_S = 0.02
GATHER_NS = int(PUBLISH_GATHER_S * 1e9)
# How often the assembler checks that PostgreSQL's table statistics know the tables' size.
STATISTICS_INTERVAL_S = 5.0
# Longest a retention pass holds up assembly; an expired backlog is deleted over many rounds.
RETENTION_SLICE_S = 0.25
# How long a claimed trace stays with its replica. Far longer than one round takes; a replica
# that dies holding leases delays those requests by at most this much.
LEASE_NS = 60 * 10**9
BUSY_BATCH = 50


def _note_excess(facts: list[RequestFacts], excess: dict[str, str]) -> None:
    if not excess:
        return
    for f in facts:
        note = next((excess[t] for t in f.trace_ids or [f.trace_id] if t in excess), None)
        if note is not None:
            rejected = f.coverage.setdefault("rejected", [])
            if note not in rejected:
                rejected.append(note)


class _SpanLoader:
    """Loads traces' spans for assembly in batches, holding at most `budget` spans between
    uses; every trace's span count is kept. Why: a page of ready traces was read whole, so 120
    traces at the per-trace cap held 1.2M spans (1.6 GB) however the group was then split."""

    BATCH = 16  # traces per read

    def __init__(self, store: Store, budget: int) -> None:
        self.store = store
        self.budget = budget
        self.counts: dict[str, int] = {}
        self._held: dict[str, list[Span]] = {}
        self._held_spans = 0

    def load(self, trace_ids: Iterable[str]) -> Iterator[tuple[str, list[Span]]]:
        """Each trace with its spans, read a batch at a time; kept while within the budget."""
        ids = sorted(trace_ids)
        for i in range(0, len(ids), self.BATCH):
            batch = ids[i : i + self.BATCH]
            found = _by_trace(self.store.load_spans(batch, normalize=False))
            for tid in batch:
                members = found.pop(tid, [])
                self.counts[tid] = len(members)
                if self._held_spans + len(members) <= self.budget:
                    self._held[tid] = members
                    self._held_spans += len(members)
                yield tid, members
            del found

    def take(self, trace_ids: list[str]) -> list[Span]:
        """The spans of these traces in their order, read again where they were not kept;
        those kept are let go."""
        missing = [t for t in trace_ids if t not in self._held]
        again = _by_trace(self.store.load_spans(missing, normalize=False)) if missing else {}
        out: list[Span] = []
        for t in trace_ids:
            members = self._held.pop(t, None)
            if members is not None:
                self._held_spans -= len(members)
            else:
                members = again.get(t, [])
            out += members
        return out

    def drop(self, trace_ids: Iterable[str]) -> None:
        for t in trace_ids:
            members = self._held.pop(t, None)
            if members is not None:
                self._held_spans -= len(members)


def _note_split(facts: list[RequestFacts], note: str) -> None:
    for f in facts:
        rejected = f.coverage.setdefault("rejected", [])
        if note not in rejected:
            rejected.append(note)


def _by_trace(spans: list[Span]) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for s in spans:
        out.setdefault(s.trace_id, []).append(s)
    return out
