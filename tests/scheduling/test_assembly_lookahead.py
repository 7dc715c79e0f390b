"""Assembly ahead of the quiet period, on SQLite and PostgreSQL, on the wall clock.

The assembler loads and assembles a request up to `assembly_lookahead_s` before its quiet
period ends and stores it once the period has ended -- only if no span arrived meanwhile.
These tests call `run_once()` at chosen moments inside that window: before the due time
the request must be assembled but not stored, after it stored exactly once, and a span that
arrives in between must hold it back until its own quiet period has ended.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from railtrace.metrics import Metrics
from railtrace.otlp.export import prepare
from railtrace.scheduling.assembler import GATHER_NS, Assembler, default_pipeline
from railtrace.settings import Settings
from railtrace.store import Store
from railtrace.store.schema import requests as requests_table
from railtrace.store.schema import traces as traces_table
from railtrace.topology import TopologyHolder
from railtrace_tracing import semconv
from tests.service_helpers import export_request, settings_for, trace_id

# Long enough that a stalled test machine does not pass the due time between two steps.
QUIET_S = 4.0
LOOKAHEAD_S = 2.0


def _assembler(store: Store, db_url: str) -> Assembler:
    settings = settings_for(db_url, quiet_period_s=QUIET_S, assembly_lookahead_s=LOOKAHEAD_S)
    return Assembler(store, settings, Metrics(), default_pipeline(settings, TopologyHolder([]).get))


def _trace(store: Store, tid: str) -> dict:
    with store.engine.connect() as conn:
        t = traces_table.c
        row = conn.execute(
            select(t.last_arrival_ns, t.dirty, t.claimed_by, t.assembled_ns).where(t.trace_id == tid)
        ).one()
    return dict(row._mapping)


def _stored(store: Store) -> list[tuple[str, int]]:
    with store.engine.connect() as conn:
        rows = conn.execute(select(requests_table.c.trace_id, requests_table.c.updated_ns))
        return [tuple(r) for r in rows]


def _sleep_until(ns: int) -> None:
    time.sleep(max(0.0, (ns - time.time_ns()) / 1e9))


def _counted(assembler: Assembler, name: str) -> float:
    family = assembler.metrics[name]
    return sum(s.value for m in family.collect() for s in m.samples if s.name.endswith("_total"))


def _requests_counted(assembler: Assembler) -> float:
    return _counted(assembler, semconv.M_REQUESTS)


def test_assembled_inside_the_lookahead_and_stored_once_due(store: Store, db_url: str) -> None:
    assembler = _assembler(store, db_url)
    store.insert_batches([prepare(export_request([1]))])
    tid = trace_id(1)
    due = _trace(store, tid)["last_arrival_ns"] + int(QUIET_S * 1e9)

    _sleep_until(due - int(LOOKAHEAD_S * 0.75 * 1e9))
    assembler.run_once()
    assert [p.group.marks.keys() for p in assembler._pending] == [{tid}]  # assembled early...
    assert _stored(store) == []  # ...and not stored before its quiet period has ended
    assert _trace(store, tid)["claimed_by"] == assembler.owner

    assembler.run_once()  # still inside the window: the pending trace is not claimed twice
    assert len(assembler._pending) == 1

    _sleep_until(due)
    assembler.run_once()
    stored = _stored(store)
    assert [t for t, _ in stored] == [tid]
    assert stored[0][1] >= due  # stored at or after the due time, never before
    state = _trace(store, tid)
    assert not state["dirty"] and state["claimed_by"] is None
    assert assembler._pending == []
    assert _requests_counted(assembler) == 1
    assert _counted(assembler, semconv.M_REDONE) == 0


def test_a_span_arriving_after_early_assembly_holds_the_request_back(store: Store, db_url: str) -> None:
    assembler = _assembler(store, db_url)
    store.insert_batches([prepare(export_request([1], skip={(1, 7)}))])  # all but one span
    tid = trace_id(1)
    due = _trace(store, tid)["last_arrival_ns"] + int(QUIET_S * 1e9)

    _sleep_until(due - int(LOOKAHEAD_S * 0.75 * 1e9))
    assembler.run_once()
    assert len(assembler._pending) == 1
    store.insert_batches([prepare(export_request([1], only={7}))])  # the last span, late
    new_due = _trace(store, tid)["last_arrival_ns"] + int(QUIET_S * 1e9)

    _sleep_until(due)
    assembler.run_once()
    assert _stored(store) == []  # the early result is dropped: a span came after it was loaded
    state = _trace(store, tid)
    assert state["dirty"] and state["claimed_by"] is None and state["assembled_ns"] is None
    assert _requests_counted(assembler) == 0
    assert _counted(assembler, semconv.M_REDONE) == 1  # the wasted early work, for the operator

    _sleep_until(new_due)
    while assembler.run_once() or assembler._pending:  # assembled again, now with every span
        time.sleep(0.05)
    stored = _stored(store)
    assert [t for t, _ in stored] == [tid] and stored[0][1] >= new_due
    assert not _trace(store, tid)["dirty"]
    assert _requests_counted(assembler) == 1
    assert _counted(assembler, semconv.M_REDONE) == 1
    spans = store.load_spans([tid])
    assert len(spans) == 8


def test_a_driven_clock_gets_no_lookahead(store: Store, db_url: str) -> None:
    """Tests and tools that pass `now_ns` store what is due at once and nothing early."""
    assembler = _assembler(store, db_url)
    store.insert_batches([prepare(export_request([1]))])
    arrival = _trace(store, trace_id(1))["last_arrival_ns"]
    assert assembler.run_once(now_ns=arrival + int((QUIET_S - LOOKAHEAD_S / 2) * 1e9)) == 0
    assert assembler._pending == [] and _stored(store) == []
    assembler.run_once(now_ns=arrival + int(QUIET_S * 1e9))
    assert assembler._pending == [] and len(_stored(store)) == 1


@pytest.mark.parametrize(
    ("quiet_s", "lookahead_s", "interval_s", "looks_every_s"),
    [
        (2.0, 1.0, None, 0.2),  # the defaults: a look every 200 ms, claimed 0.8-1 s ahead
        (0.2, 1.0, None, 0.05),  # a short quiet period: half of its 0.1 s lookahead
        (2.0, 0.0, None, 0.2),  # no lookahead: the interval alone
        (2.0, 1.0, 0.01, 0.01),  # an operator's shorter interval is kept
    ],
)
def test_looks_come_at_least_twice_per_lookahead(
    store: Store,
    db_url: str,
    quiet_s: float,
    lookahead_s: float,
    interval_s: float | None,
    looks_every_s: float,
) -> None:
    """A look for work is a claim and a round of statements, so the assembler looks only as
    often as the lookahead needs to claim each request before its quiet period ends."""
    if interval_s is None:  # the service's default, not the short one of the test helpers
        interval_s = Settings.model_fields["assembly_interval_s"].default
    settings = settings_for(
        db_url, quiet_period_s=quiet_s, assembly_lookahead_s=lookahead_s, assembly_interval_s=interval_s
    )
    assembler = Assembler(store, settings, Metrics(), default_pipeline(settings, TopologyHolder([]).get))
    assert assembler.look_interval_s == pytest.approx(looks_every_s)


def test_a_failed_store_loses_nothing(store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """If storing fails (database away), the assembled groups are given up and their traces,
    still dirty and leased to this assembler, are assembled again on its next step."""
    assembler = _assembler(store, db_url)
    store.insert_batches([prepare(export_request([1, 2]))])
    later = _trace(store, trace_id(2))["last_arrival_ns"] + int(QUIET_S * 1e9)
    real_publish = store.publish

    def failing(*args, **kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(store, "publish", failing)
    with pytest.raises(RuntimeError):
        assembler.run_once(now_ns=later)
    assert assembler._pending == [] and _stored(store) == []
    assert all(_trace(store, trace_id(n))["dirty"] for n in (1, 2))

    monkeypatch.setattr(store, "publish", real_publish)
    assembler.run_once(now_ns=later)
    assert sorted(t for t, _ in _stored(store)) == [trace_id(1), trace_id(2)]
    assert _requests_counted(assembler) == 2


def test_groups_coming_due_together_are_stored_in_one_transaction(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The running loop waits `PUBLISH_GATHER_S` past the first due time and stores every
    group due by then at once: two ingest commits a few milliseconds apart make one storing
    transaction, not two; a group due later than that waits for its own."""
    from railtrace.scheduling import assembler as assembler_mod

    assembler = _assembler(store, db_url)
    for n in (1, 2, 3):
        store.insert_batches([prepare(export_request([n]))])
    # Arrival times set exactly, so that a stalled test machine cannot move them apart: the
    # second 5 ms after the first, the third well past the gathering window.
    arrived = time.time_ns()
    gather_ns = int(assembler_mod.PUBLISH_GATHER_S * 1e9)
    with store.engine.begin() as conn:
        for n, offset in ((1, 0), (2, 5_000_000), (3, gather_ns + 200_000_000)):
            conn.execute(
                traces_table.update()
                .where(traces_table.c.trace_id == trace_id(n))
                .values(first_arrival_ns=arrived + offset, last_arrival_ns=arrived + offset)
            )
    first = arrived + int(QUIET_S * 1e9)
    _sleep_until(first - int(LOOKAHEAD_S * 0.5 * 1e9))
    assembler.run_once()
    assert len(assembler._pending) == 3  # all three assembled ahead of their due times
    stored: list[list[str]] = []
    real = store.publish

    def recorded(groups, now_ns, owner=None):  # type: ignore[no-untyped-def]
        stored.append(sorted(t for g in groups for t in g.marks))
        return real(groups, now_ns, owner=owner)

    monkeypatch.setattr(store, "publish", recorded)
    third = _trace(store, trace_id(3))["last_arrival_ns"] + int(QUIET_S * 1e9)
    while time.time_ns() < third + int(0.1 * 1e9) and assembler._pending:
        assembler._store_until_next_look()
    assert stored == [[trace_id(1), trace_id(2)], [trace_id(3)]]
    assert {t for t, _ in _stored(store)} == {trace_id(1), trace_id(2), trace_id(3)}


def test_a_request_coming_due_while_a_page_loads_is_stored_before_the_page_goes_on(
    store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading and assembling a page takes tens of milliseconds on a busy machine: a request
    assembled ahead that comes due meanwhile is stored between the page's steps (after its spans
    are loaded, after its request keys are looked up, between its groups), not after the page."""
    assembler = _assembler(store, db_url)
    store.insert_batches([prepare(export_request([1]))])
    first_due = _trace(store, trace_id(1))["last_arrival_ns"] + int(QUIET_S * 1e9)
    _sleep_until(first_due - int(LOOKAHEAD_S * 0.5 * 1e9))
    assembler.run_once()
    assert [p.group.marks.keys() for p in assembler._pending] == [{trace_id(1)}]
    store.insert_batches([prepare(export_request([2]))])  # the next page: request 2 alone
    calls: list[str] = []
    for name in ("load_spans", "traces_for_keys", "publish"):

        def recorded(*args, _name=name, _real=getattr(store, name), **kwargs):  # type: ignore[no-untyped-def]
            calls.append(_name)
            if _name == "load_spans":  # the page's load outlasts request 1's due time
                _sleep_until(first_due + 2 * GATHER_NS)
            return _real(*args, **kwargs)

        monkeypatch.setattr(store, name, recorded)
    # The page is looked for as it will be inside request 2's lookahead, request 1 not yet due.
    second_due = _trace(store, trace_id(2))["last_arrival_ns"] + int(QUIET_S * 1e9)
    assert time.time_ns() < first_due
    assembler.prepare(second_due - int(LOOKAHEAD_S * 0.5 * 1e9), 128, int(LOOKAHEAD_S * 1e9))
    assert calls[:3] == ["load_spans", "publish", "traces_for_keys"], calls
    assert [t for t, _ in _stored(store)] == [trace_id(1)]
