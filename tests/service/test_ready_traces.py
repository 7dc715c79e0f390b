"""Assembly's look for ready traces reads only the traces that await assembly, on SQLite and
PostgreSQL, whatever the history kept.

It once asked for `dirty IS true`, which PostgreSQL cannot serve from an index: the planner
walked `ix_traces_last_arrival` from the oldest trace kept and filtered out every assembled
one (64 ms a look at 45,000 traces, a third of the database's time under load). The partial
index `ix_traces_ready` holds only the traces awaiting (re)assembly.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sqlalchemy import insert, inspect, update

from railtrace.store import Store, make_engine, migrate
from railtrace.store.schema import traces
from railtrace.store.store import _statements, listed

sys.path.insert(0, str(Path(__file__).parent))
from service_helpers import query_plan, trace_id

HISTORY = 5_000  # assembled traces kept
WAITING = 20  # traces awaiting assembly, the newest


def _store_with_history(db_url: str) -> Store:
    engine = make_engine(db_url)
    migrate(engine)
    rows = [
        {
            "trace_id": trace_id(i),
            "first_arrival_ns": i,
            "last_arrival_ns": i,
            "span_count": 8,
            "has_root": True,
            "dirty": i >= HISTORY - WAITING,
            "late_spans": 0,
            "assembled_ns": None if i >= HISTORY - WAITING else i + 1,
        }
        for i in range(HISTORY)
    ]
    with engine.begin() as conn:
        conn.execute(insert(traces), rows)
    if engine.dialect.name == "postgresql":  # as the assembler's statistics refresh leaves it
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE traces")
    return Store(engine)


def test_the_look_for_ready_traces_reads_the_ready_index(db_url: str) -> None:
    """The claim's plan finds its candidates through `ix_traces_ready` (not by walking every
    trace kept in arrival order, nor by a full scan), and it claims exactly the waiting ones."""
    store = _store_with_history(db_url)
    q = _statements(store.sqlite)
    params = {
        "owner": "a",
        "now": HISTORY,
        "until": HISTORY + 1,
        "quiet_before": HISTORY,
        "wait_before": 0,
        "limit": 128,
        "again": listed([], store.sqlite),
    }
    plan = query_plan(store, q.claim_ready, params)
    assert any("ix_traces_ready" in line for line in plan), plan
    assert not any("ix_traces_last_arrival" in line or "Seq Scan on traces" in line for line in plan), plan
    claimed = store.claim_ready("a", HISTORY, 0, HISTORY, 10**9, limit=128)
    assert [t.trace_id for t in claimed] == [trace_id(i) for i in range(HISTORY - WAITING, HISTORY)]
    store.engine.dispose()


def test_dirty_traces_and_their_count_find_the_traces_awaiting_assembly(db_url: str) -> None:
    store = _store_with_history(db_url)
    with store.engine.begin() as conn:  # one assembled trace gets a late span
        conn.execute(update(traces).where(traces.c.trace_id == trace_id(7)).values(dirty=True))
    assert store.count_dirty() == WAITING + 1
    assert [t.trace_id for t in store.dirty_traces(HISTORY, 0, limit=3)] == [
        trace_id(7),
        trace_id(HISTORY - WAITING),
        trace_id(HISTORY - WAITING + 1),
    ]
    store.engine.dispose()


def test_the_ready_index_holds_only_traces_awaiting_assembly(db_url: str) -> None:
    """The migrations create it partial (Alembic's comparison with the models does not look
    at an index's predicate), and the index it replaces is gone."""
    store = _store_with_history(db_url)
    with store.engine.connect() as conn:
        names = {ix["name"] for ix in inspect(conn).get_indexes("traces")}
        if store.sqlite:
            sql = conn.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE name = 'ix_traces_ready'"
            ).scalar()
        else:
            sql = conn.exec_driver_sql(
                "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_traces_ready'"
            ).scalar()
    assert "ix_traces_dirty" not in names and "ix_traces_ready" in names
    assert "WHERE" in sql.upper() and "dirty" in sql, sql
    store.engine.dispose()
