"""Keyset paging of the request list, on SQLite and PostgreSQL: every request exactly once, newest
first, when many requests share one start time and a page ends inside such a run; with and
without the flag, node and time-window filters the scale benchmark pages through.
"""

from __future__ import annotations

import time

import pytest

from railtrace.model import Flag, KVSummary, RequestSummary, rfc3339
from railtrace.store import Store, make_engine, migrate
from railtrace.store.queries import Cursor, RequestQuery

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
        ttft_s=0.1,
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
        kv_transfer=KVSummary(transport="tcp", path_class="tcp", bytes=1, duration_s=0.01),
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


def walk(store: Store, limit: int, **filters) -> list[str]:
    ids: list[str] = []
    cursor = None
    while True:
        page = store.list_requests(RequestQuery(limit=limit, cursor=cursor, **filters))
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
