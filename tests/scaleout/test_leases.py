"""Assembly leases, on SQLite and PostgreSQL: replicas claim disjoint traces, and a request
whose traces two replicas hold is assembled once, by the holder of its smallest trace id."""

from __future__ import annotations

import time

from sqlalchemy import select

from railtrace.metrics import Metrics
from railtrace.otlp.export import prepare
from railtrace.scheduling.assembler import Assembler, default_pipeline
from railtrace.store import AssembledGroup, Store, make_engine, migrate
from railtrace.store.schema import requests as requests_table
from railtrace.store.schema import traces as traces_table
from railtrace.topology import TopologyHolder
from tests.service_helpers import export_request, settings_for, trace_id

HOUR_NS = 3600 * 10**9
LEASE = 60 * 10**9


def _store(db_url: str) -> Store:
    engine = make_engine(db_url)
    migrate(engine)
    return Store(engine)


def _assembler(store: Store, db_url: str) -> Assembler:
    settings = settings_for(db_url, quiet_period_s=1.0)
    holder = TopologyHolder([])
    return Assembler(store, settings, Metrics(), default_pipeline(settings, holder.get))


def test_two_owners_claim_disjoint_traces_and_release(db_url: str) -> None:
    store = _store(db_url)
    store.insert_batches([prepare(export_request(list(range(10))))])
    later = time.time_ns() + HOUR_NS
    a = store.claim_ready("a", later, later, later, LEASE, limit=6)
    b = store.claim_ready("b", later, later, later, LEASE, limit=6)
    assert len(a) == 6 and len(b) == 4
    assert not {t.trace_id for t in a} & {t.trace_id for t in b}
    assert store.claim_ready("c", later, later, later, LEASE) == []  # all leased
    assert store.claim("c", [a[0].trace_id], later, LEASE) == set()
    store.release("a", [t.trace_id for t in a])
    assert {t.trace_id for t in store.claim_ready("c", later, later, later, LEASE)} == {t.trace_id for t in a}
    # An expired lease is free again.
    assert len(store.claim_ready("d", later, later, later + 2 * LEASE, LEASE)) == 10
    store.engine.dispose()


def test_a_request_split_across_holders_is_assembled_once(db_url: str) -> None:
    store = _store(db_url)
    store.insert_batches([prepare(export_request([1], split=True))])
    first, second = trace_id(1), trace_id(501)  # one request, two traces joined by request id
    later = time.time_ns() + HOUR_NS
    assert store.claim("other-replica", [second], later, LEASE) == {second}

    mine = _assembler(store, db_url)
    mine.run_once(now_ns=later)
    with store.engine.connect() as conn:
        assert conn.execute(select(requests_table.c.trace_id)).all() == []
        claims = dict(conn.execute(select(traces_table.c.trace_id, traces_table.c.claimed_by)).all())
    # This replica holds the smallest trace id of the request, so it keeps its lease; the
    # other replica (holding a larger one) lets go.
    assert claims == {first: mine.owner, second: "other-replica"}
    store.release("other-replica", [second])

    mine.run_once(now_ns=later)
    with store.engine.connect() as conn:
        rows = conn.execute(select(requests_table.c.trace_id)).all()
        states = conn.execute(
            select(traces_table.c.dirty, traces_table.c.claimed_by, traces_table.c.request_trace_id)
        ).all()
    assert len(rows) == 1
    assert all(not dirty and owner is None for dirty, owner, _ in states)
    assert {r for _, _, r in states} == {rows[0][0]}
    store.engine.dispose()


def test_an_owner_claims_its_own_leases_again_only_when_asked(db_url: str) -> None:
    """The traces an assembler holds are left out of its next claim (those it assembled ahead
    are waiting to be stored) unless it names them in `again` (kept for its next round); `skip`
    wins over both, and an expired lease is anyone's."""
    store = _store(db_url)
    store.insert_batches([prepare(export_request(list(range(4))))])
    later = time.time_ns() + HOUR_NS
    held = sorted(t.trace_id for t in store.claim_ready("a", later, later, later, LEASE))
    assert len(held) == 4
    assert store.claim_ready("a", later, later, later, LEASE) == []
    again = store.claim_ready("a", later, later, later, LEASE, again=held[:2], skip=held[1:2])
    assert [t.trace_id for t in again] == held[:1]
    assert store.claim_ready("b", later, later, later, LEASE, again=held) == []  # not b's
    expired = later + 2 * LEASE
    assert sorted(t.trace_id for t in store.claim_ready("a", later, later, expired, LEASE)) == held
    store.engine.dispose()


def test_kept_leases_are_forgotten_once_they_have_run_out(db_url: str) -> None:
    """What an assembler keeps to claim again is bounded by the leases' life: after that the
    trace is anyone's (another replica may have assembled it), so it is not asked for again."""
    store = _store(db_url)
    assembler = _assembler(store, db_url)
    later = time.time_ns() + HOUR_NS
    assembler._kept = {trace_id(1): later - 1, trace_id(2): later + LEASE}
    assembler.prepare(later, limit=10)
    assert assembler._kept == {trace_id(2): later + LEASE}
    store.engine.dispose()


def test_storing_gives_up_the_lease_of_every_trace_it_was_given(db_url: str) -> None:
    """Marking a trace assembled clears its lease; a trace that got a span since it was loaded
    is not marked, stays dirty, and its lease is given up too, so any replica takes it next."""
    store = _store(db_url)
    store.insert_batches([prepare(export_request([1, 2]))])
    later = time.time_ns() + HOUR_NS
    held = store.claim_ready("a", later, later, later, LEASE)
    seen = {t.trace_id: t.last_arrival_ns for t in held}
    changed = trace_id(2)
    seen[changed] -= 1  # as if a span arrived after the group was loaded
    store.publish([AssembledGroup([], seen)], later, owner="a")
    with store.engine.connect() as conn:
        rows = {r.trace_id: r for r in conn.execute(select(traces_table))}
    assert {t: (r.claimed_by, r.dirty) for t, r in rows.items()} == {
        trace_id(1): (None, False),
        changed: (None, True),
    }
    assert [t.trace_id for t in store.claim_ready("b", later, later, later, LEASE)] == [changed]
    store.engine.dispose()
