"""PostgreSQL: the store's statements stay prepared on their connection from one call to the
next, and each engine plans them as its statements need.

psycopg prepares a statement the fifth time a connection runs it, and forgets every one at
each ROLLBACK, which is how closing a connection used to end a read. No statement of the store
ever stayed prepared, so the server parsed and planned each run of each statement anew.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from railtrace.store import Store, make_engine, migrate
from railtrace.store.engine import is_sqlite

RUNS = 8  # more than psycopg's prepare threshold (5)


def _assembly_store(new_database: Callable[[str], str]) -> Store:
    url = new_database("postgresql")
    migrate(make_engine(url))
    return Store(make_engine(url, derived_only=True))


def _prepared(store: Store) -> list[str]:
    """The statements prepared on the store's (one, pooled) connection."""
    with store.engine.connect() as conn:
        found = list(conn.exec_driver_sql("SELECT statement FROM pg_prepared_statements").scalars())
        conn.commit()
    assert store.engine.pool.checkedin() == 1  # type: ignore[attr-defined]
    return found


def test_reads_stay_prepared_from_one_call_to_the_next(new_database: Callable[[str], str]) -> None:
    store = _assembly_store(new_database)
    ids = [f"{i:032x}" for i in range(3)]
    for _ in range(RUNS):
        assert store.trace_states(ids) == {}
        assert store.previous_summaries(ids) == {}
        assert store.load_spans(ids) == []
        assert store.traces_for_keys(["k"]) == []
    prepared = _prepared(store)
    assert any("FROM span_chunks" in s for s in prepared), prepared  # read by the driver's cursor
    assert any("FROM trace_keys" in s for s in prepared), prepared
    assert any("UNION ALL" in s for s in prepared), prepared  # previous summaries
    store.engine.dispose()


def test_the_look_for_ready_traces_is_never_prepared(new_database: Callable[[str], str]) -> None:
    """A generic plan for it walked the whole history (`_fetch_unprepared`)."""
    store = _assembly_store(new_database)
    for n in range(RUNS):
        assert store.claim_ready("a", n, n, n, 10**9, limit=8) == []
    assert not any("claimed_by" in s for s in _prepared(store))
    store.engine.dispose()


def test_a_failed_read_rolls_back_and_the_next_one_works(new_database: Callable[[str], str]) -> None:
    store = _assembly_store(new_database)
    with pytest.raises(Exception, match="no_such_table"), store._read() as conn:
        conn.exec_driver_sql("SELECT * FROM no_such_table")
    assert store.trace_states(["0" * 32]) == {}
    store.engine.dispose()


def test_plan_cache_mode_per_engine(new_database: Callable[[str], str]) -> None:
    """The serve process plans the API's filters for their values; assembly's id-list
    statements may use one generic plan."""
    url = new_database("postgresql")
    serving, assembling = make_engine(url), make_engine(url, derived_only=True)
    assert not is_sqlite(serving)
    for engine, mode in ((serving, "force_custom_plan"), (assembling, "auto")):
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW plan_cache_mode").scalar() == mode
        engine.dispose()
