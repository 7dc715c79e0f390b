"""Storing a group known to be the first stored of its traces (`AssembledGroup.first`, set by
the assembler when `Store.previous_summaries` found no request holding them) skips the two
deletes of old rows, on SQLite and PostgreSQL; should a row have appeared under its key
meanwhile, the insert fails and nothing of the transaction is stored."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.exc import IntegrityError

from railtrace.model import Flag, KVSummary, RequestSummary
from railtrace.store import AssembledGroup, Store
from railtrace.store.schema import request_flags, stats_hourly

NOW = 1_790_000_000 * 10**9
A, B = "a" * 32, "b" * 32


def _summary(tid: str, flag: str | None = None) -> RequestSummary:
    return RequestSummary(
        trace_id=tid,
        request_id=f"req-{tid[:4]}",
        model="llama",
        start="2026-09-21T13:46:40Z",
        ttft_s=0.1,
        e2e_s=1.0,
        breakdown_s={},
        prefill={"pod": "prefill-0", "node": "node-a", "gpu": None, "nic": None, "rail": None},
        decode={"pod": "decode-0", "node": "node-b", "gpu": None, "nic": None, "rail": None},
        kv_transfer=KVSummary(transport="tcp", path_class="tcp", bytes=1, duration_s=0.01),
        flags=[Flag(flag, "evidence", None)] if flag else [],
        trace_ids=[],
        span_count=8,
    )


def _deletes(store: Store, groups: list[AssembledGroup]) -> list[str]:
    """The statements deleting request or flag rows that `Store.publish` sends to store these
    groups (a rollup row emptied by a replaced row is deleted too; not counted)."""
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        store.publish(groups, NOW)
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    return [s for s in sent if s.startswith(("DELETE FROM requests", "DELETE FROM request_flags"))]


def _counts(store: Store) -> tuple[Any, ...]:
    with store.engine.connect() as conn:
        flags = conn.execute(select(func.count()).select_from(request_flags)).scalar()
        rollup = conn.execute(select(func.sum(stats_hourly.c.request_count))).scalar()
    return flags, rollup


def test_a_first_group_is_stored_without_deleting_first(store: Store) -> None:
    assert _deletes(store, [AssembledGroup([_summary(A, "tcp_fallback")], {}, first=True)]) == []
    assert store.get_request(A)["flags"][0]["name"] == "tcp_fallback"
    # Not known to be first (the default): old rows under its key are deleted as before.
    assert len(_deletes(store, [AssembledGroup([_summary(A)], {})])) == 2
    assert store.get_request(A)["flags"] == []


def test_a_first_group_meeting_a_stored_row_stores_nothing(store: Store) -> None:
    store.publish([AssembledGroup([_summary(A, "tcp_fallback")], {})], NOW)
    before = (store.get_request(A), _counts(store))
    with pytest.raises(IntegrityError):
        store.publish(
            [AssembledGroup([_summary(B)], {}, first=True), AssembledGroup([_summary(A)], {}, first=True)],
            NOW,
        )
    assert (store.get_request(A), _counts(store)) == before
    assert store.get_request(B) is None
