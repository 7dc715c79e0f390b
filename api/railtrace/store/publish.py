"""Assembly results: a page of groups' request rows, flags and rollup stored in one transaction,
speculative groups kept only if their traces got no span since, and the traces' dirty marks
and leases cleared. Apart because it is the one writer of request rows (retention deletes
them through `_delete_requests`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import (
    Connection,
)
from sqlalchemy.sql import Executable

from railtrace.model import RequestSummary, resolution_label
from railtrace.store.connection import Job
from railtrace.store.engine import is_sqlite
from railtrace.store.leases import _release, _unchanged
from railtrace.store.rollup import RollupDelta
from railtrace.store.statements import (
    _compiled,
    _executemany,
    _float,
    _statements,
    _text,
    listed,
)


@dataclass(slots=True)
class AssembledGroup:
    """Summaries of one group of traces (a request, or the hops of one stitched together).

    `marks`: each trace id -> its last arrival seen when its spans were loaded. `superseded`:
    primary trace ids of stored requests these summaries replace. `speculative`: loaded
    before its quiet period ended, so `Store.publish` stores it only if nothing arrived since.
    `first`: no stored request held any of its traces when the caller looked
    (`Store.previous_summaries`, under its lease), so storing it deletes no old rows first;
    should one have appeared meanwhile, the insert fails on its key and nothing is stored.
    """

    summaries: list[RequestSummary]
    marks: dict[str, int]
    superseded: set[str] = field(default_factory=set)
    speculative: bool = False
    first: bool = False


class Publisher(Job):
    """Assembly's results stored: request rows, flags, rollup and the traces' dirty marks."""

    def save_assembly(
        self,
        summaries: Sequence[RequestSummary],
        group: dict[str, int],
        superseded: Iterable[str],
        now_ns: int,
    ) -> None:
        """Store summaries and clear their traces' dirty marks, whatever arrived meanwhile.

        `group` maps each trace id to the last arrival seen when it was loaded: a trace that got
        new spans since stays dirty and is assembled again. `superseded` are primary trace ids
        whose old request rows are replaced (a trace later stitched into another request).
        """
        self.publish([AssembledGroup(list(summaries), dict(group), set(superseded))], now_ns)

    def publish(
        self, groups: Sequence[AssembledGroup], now_ns: int, owner: str | None = None
    ) -> list[AssembledGroup]:
        """Store the summaries of these groups in one transaction; returns the groups stored.

        A speculative group (loaded before its quiet period ended) is stored only if none of
        its traces got a span since it was loaded. The check locks those trace rows first (a
        write on each, so SQLite's write lock is held too): an export committing a span to
        one of them either came before, and the group is dropped (its traces stay dirty and
        are assembled again after their new quiet period), or waits for this commit and marks
        the trace dirty again. `owner`'s leases on every trace of `groups` are given up.
        """
        built = [_request_rows(g.summaries, now_ns) for g in groups]
        with self._begin() as conn:
            speculative = {t: seen for g in groups if g.speculative for t, seen in g.marks.items()}
            unchanged = _unchanged(conn, speculative) if speculative else set()
            keep = [not g.speculative or g.marks.keys() <= unchanged for g in groups]
            stored = [g for g, k in zip(groups, keep, strict=True) if k]
            marks = {t: seen for g in stored for t, seen in g.marks.items()}
            kept = [b for b, k in zip(built, keep, strict=True) if k]
            # Old rows to delete: those these summaries supersede, and any under their own
            # primary trace unless the group is known to be the first stored of its traces.
            replaced = {p for g in stored for p in g.superseded}
            replaced.update(p for g, b in zip(stored, kept, strict=True) if not g.first for p in b.rows)
            marked = _save(conn, kept, marks, replaced, now_ns)
            # Marking a trace assembled gives up its lease; the rest are given up here: the
            # traces of groups not stored, and those that got a span since they were loaded.
            if owner is not None and (len(stored) < len(groups) or marked < len(marks)):
                held = sorted({tid for g in groups for tid in g.marks})
                if held:
                    _release(conn, owner, held, self.sqlite)
        return stored


def _delete_requests(conn: Connection, trace_ids: Sequence[str], delta: RollupDelta) -> None:
    """Delete these request rows and their flags, subtracting what they had added to the
    rollup (the columns come back from the DELETE itself, so a row two writers race to
    delete is subtracted only by the one that deleted it)."""
    if not trace_ids:
        return
    sqlite = is_sqlite(conn)
    q, ids = _statements(sqlite), {"ids": listed(trace_ids, sqlite)}
    flag_rows = conn.execute(q.delete_flags, ids).mappings().all()
    old = conn.execute(q.delete_requests, ids).mappings().all()
    delta.removed(old, flag_rows)


@dataclass(slots=True)
class _RequestRows:
    """The rows one group's summaries become: built before the storing transaction, which
    holds the write lock (on SQLite the whole database's) from its first statement on."""

    rows: dict[str, dict[str, Any]]  # by primary trace id
    flags: list[dict[str, Any]]
    trace_to_request: dict[str, str]


def _request_rows(summaries: Sequence[RequestSummary], now_ns: int) -> _RequestRows:
    trace_to_request: dict[str, str] = {}
    for s in summaries:
        for tid in s.trace_ids or [s.trace_id]:
            trace_to_request.setdefault(tid, s.trace_id)
    rows: dict[str, dict[str, Any]] = {}
    flag_rows: list[dict[str, Any]] = []
    for s in summaries:
        if s.trace_id in rows:  # two requests under one primary trace: the first is kept
            continue
        names = sorted(_flags(s))
        row = rows[s.trace_id] = _request_row(s, now_ns, names)
        # The list's sort keys are repeated in the flag's rows: `?flag=` in each order walks
        # one index of request_flags (schema.py).
        keys = {k: row[k] for k in ("start_ns", "ttft_s", "kv_duration_s")}
        flag_rows += [{"flag": n, "trace_id": s.trace_id, **keys} for n in names]
    return _RequestRows(rows, flag_rows, trace_to_request)


def _save(
    conn: Connection,
    built: Sequence[_RequestRows],
    group: dict[str, int],
    replaced: Iterable[str],
    now_ns: int,
) -> int:
    """Delete the request rows (and flags) of the primary traces `replaced`, write the request
    rows, flags and rollup of disjoint groups; clear the dirty mark (and the lease) of each
    trace of `group` whose last arrival is still the one seen. Returns how many were cleared."""
    rows: dict[str, dict[str, Any]] = {}
    flag_rows: list[dict[str, Any]] = []
    trace_to_request: dict[str, str] = {}
    for b in built:
        rows.update(b.rows)
        flag_rows += b.flags
        trace_to_request.update(b.trace_to_request)
    delta = RollupDelta()
    for row in rows.values():
        delta.request(row, +1)
    for f in flag_rows:
        delta.flag(f["flag"], f["start_ns"], rows[f["trace_id"]], +1)
    _delete_requests(conn, sorted(set(replaced)), delta)
    q = _statements(is_sqlite(conn))
    if rows:
        _write_rows(conn, q.insert_requests, list(rows.values()))
    if flag_rows:
        _write_rows(conn, q.insert_flags, flag_rows)
    marked = 0
    if group:
        marked = _write_rows(
            conn,
            q.mark_assembled,
            [
                {"tid": tid, "seen": seen, "rtid": trace_to_request.get(tid)}
                for tid, seen in sorted(group.items())
            ],
            {"now": now_ns},
        )
    delta.apply(conn)  # last: holds the shared rollup rows' locks only until commit
    return marked


def _write_rows(
    conn: Connection, stmt: Executable, rows: Sequence[dict[str, Any]], common: dict[str, Any] | None = None
) -> int:
    """Run `stmt` (one of `_Statements`' row writes) for these rows, with `common` bound once;
    returns the rows it wrote.

    SQLite: the one-row statement for each row, handed to the driver. PostgreSQL: the statement
    takes each column as one array (`_rows_as_arrays`), so all rows are one execution.
    """
    if is_sqlite(conn):
        return _executemany(conn, stmt, [{**row, **common} for row in rows] if common else rows)
    params = {k: [row[k] for row in rows] for k in rows[0]}
    sql, _ = _compiled(stmt, conn.dialect)
    return conn.exec_driver_sql(sql, {**params, **(common or {})}).rowcount


def _start_ns(s: RequestSummary) -> int:
    try:
        dt = datetime.fromisoformat(s.start.replace("Z", "+00:00"))
    except ValueError:
        return 0
    return round(dt.timestamp() * 1e6) * 1000


def _flags(s: RequestSummary) -> set[str]:
    return {str(f.name)[:64] for f in s.flags}


def _request_row(s: RequestSummary, now_ns: int, flag_names: list[str]) -> dict[str, Any]:
    kv = s.kv_transfer
    return {
        "trace_id": s.trace_id,
        "request_id": _text((s.request_id or None) and s.request_id[:256]),
        "model": _text((s.model or None) and s.model[:256]),
        "start_ns": _start_ns(s),
        # Floats as floats: PostgreSQL takes a page's values of a column as one array, which
        # must be of one Python type (an int among floats would fail the whole page).
        "ttft_s": _float(s.ttft_s),
        "e2e_s": _float(s.e2e_s),
        "path_class": (kv.path_class if kv else None) or "unknown",
        "transport": (kv.transport if kv else None) or "unknown",
        "kv_duration_s": _float(kv.duration_s) if kv else None,
        "kv_bytes": kv.bytes if kv else None,
        "prefill_pod": _text(s.prefill.get("pod")),
        # The stats' pair is the two ends the KV cache travelled between: a P2P source
        # (`kv_transfer.source`) stands in for the prefill pod (docs/api.md, stats).
        "prefill_node": _text((kv.source if kv and kv.source else s.prefill).get("node")),
        "decode_pod": _text(s.decode.get("pod")),
        "decode_node": _text(s.decode.get("node")),
        "pairing_level": _text(s.pairing_level),
        "coverage": _text(str(s.coverage.get("recipe") or "")[:32] or None),
        "resolution": resolution_label(s.resolved, s.identity),
        "flag_names": ",".join(flag_names),
        "summary": orjson.dumps(s.to_dict(), option=orjson.OPT_NON_STR_KEYS),
        "updated_ns": now_ns,
    }
