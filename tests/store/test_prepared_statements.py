"""PostgreSQL: the store's statements stay prepared on their connection from one call to the
next, except those whose best plan depends on their values (`store._per_value_plans`).

psycopg prepares a statement the fifth time a connection runs it, and forgets every one at
each ROLLBACK, which is how closing a connection used to end a read. No statement of the store
stayed prepared, so the server parsed and planned each run of each statement anew.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from railtrace.store import RequestQuery, Store, make_engine, migrate

RUNS = 8  # more than psycopg's prepare threshold (5)


def _store(new_database: Callable[[str], str], derived_only: bool = True) -> Store:
    url = new_database("postgresql")
    setup = make_engine(url)
    migrate(setup)
    setup.dispose()
    return Store(make_engine(url, derived_only=derived_only))


def _prepared(store: Store) -> list[str]:
    """The statements prepared on the store's (one, pooled) connection."""
    with store.engine.connect() as conn:
        found = list(conn.exec_driver_sql("SELECT statement FROM pg_prepared_statements").scalars())
        conn.commit()
    assert store.engine.pool.checkedin() == 1  # type: ignore[attr-defined]
    return found


def test_reads_stay_prepared_from_one_call_to_the_next(new_database: Callable[[str], str]) -> None:
    store = _store(new_database)
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


def test_statements_planned_for_their_values_are_never_prepared(new_database: Callable[[str], str]) -> None:
    """The look for ready traces (its generic plan walked the whole history), the API's lists
    and statistics, retention's look for expired traces; the detail lookup is prepared."""
    store = _store(new_database, derived_only=False)
    for n in range(RUNS):
        assert store.claim_ready("a", n, n, n, 10**9, limit=8) == []
        assert store.list_requests(RequestQuery(flag="tcp_fallback", since_ns=n, limit=10)).items == []
        assert store.stats("flag", n, n + 7_200 * 10**9) == []
        assert store.delete_older_than(n) == 0
        assert store.get_request_json("0" * 32) is None
    prepared = _prepared(store)
    per_value = ("claimed_by", "JOIN request_flags", "stats_hourly", "GROUP BY", "last_arrival_ns <")
    assert not [s for s in prepared if any(text in s for text in per_value)], prepared
    assert any("pref" in s for s in prepared), prepared  # the detail lookup
    store.engine.dispose()


def test_a_failed_read_rolls_back_and_the_next_one_works(new_database: Callable[[str], str]) -> None:
    store = _store(new_database)
    with pytest.raises(Exception, match="no_such_table"), store._read() as conn:
        conn.exec_driver_sql("SELECT * FROM no_such_table")
    assert store.trace_states(["0" * 32]) == {}
    store.engine.dispose()
