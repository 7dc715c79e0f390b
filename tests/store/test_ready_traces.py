"""Assembly's look for ready traces reads only the traces that await assembly, on SQLite and
PostgreSQL, whatever the history kept.

It once asked for `dirty IS true`, which PostgreSQL cannot serve from an index: the planner
walked `ix_traces_last_arrival` from the oldest trace kept and filtered out every assembled
one (64 ms a look at 45,000 traces, a third of the database's time under load). The partial
index `ix_traces_ready` holds only the traces awaiting (re)assembly that no replica holds; the
held ones (assembled ahead of their quiet period, about a second of traffic) are found by their
lease in `ix_traces_leased` once it runs out.
"""

from __future__ import annotations

from sqlalchemy import Engine, insert, inspect, update

from railtrace.store import Store, make_engine, migrate
from railtrace.store.schema import traces
from railtrace.store.statements import _statements, listed
from tests.service_helpers import query_plan, trace_id

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


def _claim_params(store: Store, owner: str) -> dict[str, object]:
    """The claim statement's parameters for a look at time HISTORY, asking nothing again."""
    return {
        "owner": owner,
        "now": HISTORY,
        "until": HISTORY + 1,
        "quiet_before": HISTORY,
        "wait_before": 0,
        "limit": 128,
        "again": listed([], store.sqlite),
    }


def test_the_look_for_ready_traces_reads_the_ready_index(db_url: str) -> None:
    """The claim's plan finds its candidates through `ix_traces_ready` (not by walking every
    trace kept in arrival order, nor by a full scan), and it claims exactly the waiting ones."""
    store = _store_with_history(db_url)
    q = _statements(store.sqlite)
    plan = query_plan(store, q.claim_ready, _claim_params(store, "a"))
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
    # Held traces still await assembly: counted and listed as before.
    store.claim("a", [trace_id(7), trace_id(HISTORY - 1)], HISTORY, 10**9)
    assert store.count_dirty() == WAITING + 1
    assert [t.trace_id for t in store.dirty_traces(HISTORY, 0, limit=2)] == [
        trace_id(7),
        trace_id(HISTORY - WAITING),
    ]
    assert len(store.dirty_traces(HISTORY, 0, limit=100)) == WAITING + 1
    store.engine.dispose()


def test_the_look_for_ready_traces_does_not_walk_the_held_ones(db_url: str) -> None:
    """Traces held by a replica (the oldest, as those assembled ahead are) are not in the walk
    of a look for work: PostgreSQL reads exactly the rows it claims. Held ones come back when
    their lease runs out, and to their owner when it asks for them again."""
    store = _store_with_history(db_url)
    held = [trace_id(i) for i in range(HISTORY - WAITING, HISTORY - 5)]
    free = [trace_id(i) for i in range(HISTORY - 5, HISTORY)]
    assert store.claim("a", held, HISTORY, 10**9) == set(held)
    if not store.sqlite:
        plan = query_plan(store, _statements(False).claim_ready, _claim_params(store, "b"), analyze=True)
        start = next(i for i, line in enumerate(plan) if "ix_traces_ready" in line)
        end = next((i for i in range(start + 1, len(plan)) if "->" in plan[i] or "CTE" in plan[i]), len(plan))
        walk = plan[start:end]  # the index scan and its detail lines
        assert "rows=5 loops" in walk[0], plan
        assert not any("Rows Removed by Filter" in line for line in walk), plan
    claimed = store.claim_ready("b", HISTORY, 0, HISTORY, 10**9, limit=128)
    assert [t.trace_id for t in claimed] == free
    assert store.claim_ready("b", HISTORY, 0, HISTORY, 10**9, limit=128) == []
    again = store.claim_ready("a", HISTORY, 0, HISTORY, 10**9, again=held[:3])
    assert [t.trace_id for t in again] == held[:3]
    ran_out = store.claim_ready("c", HISTORY, 0, HISTORY + 2 * 10**9, 10**9, limit=4)
    assert [t.trace_id for t in ran_out] == held[:4]  # every lease has lapsed: the oldest four
    store.engine.dispose()


def _ready_index(engine: Engine) -> tuple[set[str], str]:
    """The names of the indexes of `traces`, and the definition of `ix_traces_ready`."""
    with engine.connect() as conn:
        names = {ix["name"] for ix in inspect(conn).get_indexes("traces")}
        if engine.dialect.name == "sqlite":
            query = "SELECT sql FROM sqlite_master WHERE name = 'ix_traces_ready'"
        else:
            # This test's schema only: other schemas of the shared server hold the same name.
            query = (
                "SELECT indexdef FROM pg_indexes"
                " WHERE indexname = 'ix_traces_ready' AND schemaname = current_schema()"
            )
        sql = conn.exec_driver_sql(query).scalar()
    return names, sql


def test_the_ready_index_holds_only_traces_awaiting_assembly(db_url: str) -> None:
    """The migrations create it partial (Alembic's comparison with the models does not look
    at an index's predicate), and the index it replaces is gone."""
    store = _store_with_history(db_url)
    names, sql = _ready_index(store.engine)
    assert "ix_traces_dirty" not in names and {"ix_traces_ready", "ix_traces_leased"} <= names
    assert "WHERE" in sql.upper() and "dirty" in sql and "claimed_until_ns IS NULL" in sql, sql
    store.engine.dispose()


def test_migration_0008_splits_the_ready_index_and_back(db_url: str) -> None:
    """A database holding free, held and assembled traces from before the split: after the
    upgrade the look finds the free ones, then the held ones once their lease runs out; the
    downgrade puts the single index back."""
    from alembic import command

    from railtrace.store.engine import alembic_config

    engine = make_engine(db_url)
    cfg = alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0007")
        conn.execute(
            insert(traces),
            [
                {
                    "trace_id": trace_id(i),
                    "first_arrival_ns": i,
                    "last_arrival_ns": i,
                    "span_count": 8,
                    "has_root": True,
                    "dirty": i != 2,
                    "late_spans": 0,
                    "claimed_by": "old-replica" if i < 2 else None,
                    "claimed_until_ns": 100 if i < 2 else None,
                }
                for i in range(5)
            ],
        )
    migrate(engine)
    names, sql = _ready_index(engine)
    assert "ix_traces_leased" in names and "claimed_until_ns IS NULL" in sql, sql
    store = Store(engine)
    assert store.count_dirty() == 4
    assert [t.trace_id for t in store.claim_ready("new", 10, 0, 50, 10**9)] == [trace_id(3), trace_id(4)]
    assert [t.trace_id for t in store.claim_ready("new", 10, 0, 200, 10**9)] == [trace_id(0), trace_id(1)]
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0007")
    names, sql = _ready_index(engine)
    assert "ix_traces_ready" in names and "ix_traces_leased" not in names
    assert "dirty" in sql and "claimed_until_ns" not in sql, sql
    engine.dispose()
