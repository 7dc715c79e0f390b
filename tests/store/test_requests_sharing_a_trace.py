"""Two requests under one primary trace (a load generator's span holding both) are two rows,
on SQLite and PostgreSQL: stored again they replace themselves, stitched traces find their own
request, and expiring the trace removes both with their flags. (Before, the second was dropped.)"""

from __future__ import annotations

import dataclasses

from sqlalchemy import func, insert, select

from railtrace.model import Flag, RequestSummary, rfc3339
from railtrace.store import Store, make_engine, migrate
from railtrace.store.schema import request_flags, requests, traces

T0 = 1_790_000_000 * 10**9
CLIENT = "c" * 32


def _summary(n: int, kv_trace: str) -> RequestSummary:
    return RequestSummary(
        trace_id=CLIENT,
        request_id=f"req-{n}",
        model="llama",
        start=rfc3339(T0 + n * 10**9),
        ttft_s=0.1 * n,
        e2e_s=1.0,
        breakdown_s={},
        prefill={"pod": f"prefill-{n}", "node": None, "gpu": None, "nic": None, "rail": None},
        decode={"pod": f"decode-{n}", "node": None, "gpu": None, "nic": None, "rail": None},
        kv_transfer=None,
        flags=[Flag("tcp_fallback", "tcp", None)],
        trace_ids=[CLIENT, kv_trace],
        span_count=8,
    )


def _counts(store: Store) -> tuple[int, int]:
    with store.engine.connect() as conn:
        rows = conn.execute(select(func.count()).select_from(requests)).scalar_one()
        flags = conn.execute(select(func.count()).select_from(request_flags)).scalar_one()
    return rows, flags


def test_two_requests_under_one_trace_are_kept_replaced_and_expired_together(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    store = Store(engine)
    first, second = _summary(1, "1" * 32), _summary(2, "2" * 32)
    marks = {CLIENT: 1, "1" * 32: 1, "2" * 32: 1}
    with engine.begin() as conn:
        conn.execute(
            insert(traces),
            [
                {"trace_id": t, "first_arrival_ns": 1, "last_arrival_ns": 1, "span_count": 4}
                | {"has_root": True, "dirty": True, "late_spans": 0}
                for t in marks
            ],
        )
    store.save_assembly([second, first], marks, (), T0)
    assert _counts(store) == (2, 2)
    assert store.get_request(CLIENT)["request_id"] == "req-1"  # the trace's first request
    assert store.get_request("2" * 32)["request_id"] == "req-2"  # its own stitched trace
    assert store.get_request("req-2")["trace_id"] == CLIENT
    old = store.previous_summaries([CLIENT])
    assert sorted(s["request_id"] for s in old.values()) == ["req-1", "req-2"]
    # Assembled again (a late span): the same two rows, not four.
    second = dataclasses.replace(second, ttft_s=0.5)
    store.save_assembly([first, second], marks, [CLIENT], T0 + 1)
    assert _counts(store) == (2, 2)
    assert store.get_request("req-2")["ttft_s"] == 0.5
    while store.delete_older_than(T0 + 10**12):
        pass
    assert _counts(store) == (0, 0)
