"""Keyset paging of the request list, on SQLite and PostgreSQL: every request exactly once, newest
first, when many requests share one start time and a page ends inside such a run; with and
without the flag, node and time-window filters the scale benchmark pages through. Slowest first
(`order=ttft|kv_time`) likewise through runs of equal TTFT and KV time, with every filter,
leaving out the requests without the value; and each order's plan reads an index in order.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import insert, inspect

from railtrace.model import Flag, KVSummary, RequestSummary, rfc3339
from railtrace.store import Store, make_engine, migrate
from railtrace.store.queries import Cursor, RequestOrder, RequestQuery
from railtrace.store.reads import list_statement
from tests.service_helpers import query_plan

T0 = 1_790_000_000 * 10**9
N = 60


def summary(n: int) -> RequestSummary:
    start = T0 + (n // 7) * 10**9  # runs of seven requests with the same start time
    flags = [Flag("tcp_fallback", "UCX used tcp", None)] if n % 2 == 0 else []
    return RequestSummary(
        trace_id=f"{(n * 7919) % 1000:04x}{n:028x}",  # trace id order differs from n's order
        request_id=f"req-{n}",
        model="llama",
        start=rfc3339(start),
        ttft_s=None if n % 11 == 0 else 0.1 * (n % 4),  # runs of equal TTFT; some have none
        e2e_s=1.0,
        breakdown_s={},
        prefill={
            "pod": "prefill-0",
            "node": "node-a" if n % 3 else "node-b",
            "gpu": None,
            "nic": None,
            "rail": None,
        },
        decode={"pod": "decode-0", "node": "node-c", "gpu": None, "nic": None, "rail": None},
        kv_transfer=None
        if n % 5 == 0
        else KVSummary(
            transport="tcp",
            path_class="tcp" if n % 2 else "rdma_same_rail",
            bytes=1,
            duration_s=0.01 * (n % 3),
        ),
        flags=flags,
        trace_ids=[],
        span_count=8,
    )


@pytest.fixture
def store(db_url: str):
    engine = make_engine(db_url)
    migrate(engine)
    s = Store(engine)
    s.save_assembly([summary(n) for n in range(N)], {}, (), time.time_ns())
    yield s
    engine.dispose()


def expected(keep) -> list[str]:
    rows = [summary(n) for n in range(N) if keep(n)]
    return [s.trace_id for s in sorted(rows, key=lambda s: (s.start, s.trace_id), reverse=True)]


def walk(store: Store, limit: int, **filters: Any) -> list[str]:
    ids: list[str] = []
    cursor = None
    while True:
        page = store.list_requests(RequestQuery(limit=limit, cursor=cursor, **filters))
        assert len(page.items) <= limit
        ids += [item["trace_id"] for item in page.items]
        if not page.next_cursor:
            return ids
        cursor = Cursor.decode(page.next_cursor)


@pytest.mark.parametrize("limit", [1, 3, 7, 10])
def test_pages_inside_runs_of_equal_start_times(store: Store, limit: int) -> None:
    assert walk(store, limit) == expected(lambda n: True)
    assert walk(store, limit, flag="tcp_fallback") == expected(lambda n: n % 2 == 0)
    assert walk(store, limit, flag="tcp_fallback", node="node-b") == expected(
        lambda n: n % 2 == 0 and n % 3 == 0
    )
    since, until = T0 + 2 * 10**9, T0 + 6 * 10**9
    assert walk(store, limit, flag="tcp_fallback", since_ns=since, until_ns=until) == expected(
        lambda n: n % 2 == 0 and 2 <= n // 7 < 6
    )


def sort_key(s: RequestSummary, order: RequestOrder) -> float | None:
    if order is RequestOrder.TTFT:
        return s.ttft_s
    return s.kv_transfer.duration_s if s.kv_transfer else None


def slowest_first(order: RequestOrder, keep) -> list[str]:
    rows = [s for n in range(N) if keep(n) and sort_key(s := summary(n), order) is not None]
    return [s.trace_id for s in sorted(rows, key=lambda s: (sort_key(s, order), s.trace_id), reverse=True)]


FILTERS: list[tuple[dict[str, Any], Any]] = [
    ({}, lambda n: True),
    ({"flag": "tcp_fallback"}, lambda n: n % 2 == 0),
    ({"path_class": "rdma_same_rail"}, lambda n: n % 5 != 0 and n % 2 == 0),
    ({"node": "node-b"}, lambda n: n % 3 == 0),
    ({"node": "node-c"}, lambda n: True),  # the decode node
    ({"pod": "prefill-0"}, lambda n: True),
    ({"model": "llama"}, lambda n: True),
    ({"model": "other"}, lambda n: False),
    ({"since_ns": T0 + 2 * 10**9, "until_ns": T0 + 6 * 10**9}, lambda n: 2 <= n // 7 < 6),
    (
        {"flag": "tcp_fallback", "node": "node-b", "since_ns": T0 + 10**9},
        lambda n: n % 2 == 0 and n % 3 == 0 and n >= 7,
    ),
]


@pytest.mark.parametrize("order", [RequestOrder.TTFT, RequestOrder.KV_TIME])
@pytest.mark.parametrize("limit", [1, 4, 100])
def test_slowest_first_pages_through_runs_of_equal_values(
    store: Store, order: RequestOrder, limit: int
) -> None:
    for filters, keep in FILTERS:
        want = slowest_first(order, keep)
        assert walk(store, limit, order=order, **filters) == want, filters
        # The requests without the value are not in this order, and only they are missing.
        assert set(walk(store, 1000, **filters)) - set(want) == {
            summary(n).trace_id for n in range(N) if keep(n) and sort_key(summary(n), order) is None
        }


@pytest.fixture
def large_store(db_url: str):
    """Enough requests that PostgreSQL's planner (with the statistics autovacuum keeps) plans
    as for a real history; SQLite plans without statistics, as a running server leaves it."""
    engine = make_engine(db_url)
    migrate(engine)
    s = Store(engine)
    s.save_assembly([summary(n) for n in range(5_000)], {}, (), time.time_ns())
    if not s.sqlite:
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE requests")
            conn.exec_driver_sql("ANALYZE request_flags")
    yield s
    engine.dispose()


@pytest.mark.parametrize("order", list(RequestOrder))
def test_each_order_reads_an_index_in_order(large_store: Store, order: RequestOrder) -> None:
    """No order sorts the table: unfiltered, by flag and by path class, the first page and a
    later one are an ordered index walk that stops after the page."""
    top = {RequestOrder.START: T0 + 700 * 10**9, RequestOrder.TTFT: 0.3, RequestOrder.KV_TIME: 0.02}[order]
    cursor = Cursor(top, "8" * 32, order)
    for filters in ({}, {"flag": "tcp_fallback"}, {"node": "node-b"}, {"path_class": "tcp"}):
        for q in (RequestQuery(order=order, **filters), RequestQuery(order=order, cursor=cursor, **filters)):
            plan = query_plan(large_store, list_statement(q), {})
            # SQLite may sort ties of start time within a run of ix_requests_path_class
            # (path_class, start_ns): "RIGHT PART" is that, still one ordered index walk.
            text = "\n".join(plan).replace("TEMP B-TREE FOR RIGHT PART OF ORDER BY", "")
            assert "TEMP B-TREE" not in text and "Sort" not in text, (filters, plan)
            assert "SCAN requests\n" not in text + "\n" and "Seq Scan" not in text, (filters, plan)


def test_migration_0010_fills_the_flag_rows_sort_keys_and_back(db_url: str) -> None:
    """Requests stored before revision 0010 are listed slowest first by flag once it has run
    (their flag rows get the request's TTFT and KV time); the downgrade drops what it added."""
    from alembic import command

    from railtrace.store.engine import alembic_config
    from railtrace.store.publish import _request_rows
    from railtrace.store.schema import request_flags, requests

    engine = make_engine(db_url)
    cfg = alembic_config()
    built = _request_rows([summary(n) for n in range(N)], time.time_ns())
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0009")
        later = {"trace_of"}  # 0012's column, not there yet at 0009
        conn.execute(
            insert(requests), [{k: v for k, v in r.items() if k not in later} for r in built.rows.values()]
        )
        before = [{k: f[k] for k in ("flag", "start_ns", "trace_id")} for f in built.flags]
        conn.execute(insert(request_flags), before)  # the columns of revision 0009
    migrate(engine)
    store = Store(engine)
    for order in (RequestOrder.TTFT, RequestOrder.KV_TIME):
        assert walk(store, 4, order=order, flag="tcp_fallback") == slowest_first(order, lambda n: n % 2 == 0)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0009")
    db = inspect(engine)
    assert {c["name"] for c in db.get_columns("request_flags")} == {"flag", "start_ns", "trace_id"}
    names = {i["name"] for t in ("requests", "request_flags") for i in db.get_indexes(t)}
    assert not {n for n in names if n.endswith(("_ttft", "_kv_time"))}, names
    assert names >= {"ix_requests_start", "ix_requests_path_class", "ix_request_flags_trace"}
    engine.dispose()


def test_the_ttft_quantiles_edge_hours_read_only_the_covering_index(large_store: Store) -> None:
    """A window's partial hours read (start, path class, pairing level, TTFT) of their requests
    from `ix_requests_start_ttft` alone: no row (each carries its whole summary) is visited."""
    from railtrace.store.quantiles import edge_statement

    if not large_store.sqlite:  # as autovacuum leaves a table: its visibility map set
        with large_store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE requests")
    stmt = edge_statement(T0 + 100 * 10**9, T0 + 700 * 10**9)
    text = "\n".join(query_plan(large_store, stmt, {}))
    if large_store.sqlite:
        assert "USING COVERING INDEX ix_requests_start_ttft" in text, text
    else:
        assert "Index Only Scan using ix_requests_start_ttft" in text, text
