"""Trace leases: the traces ready for (re)assembly and the claims replicas hold on them
(FOR UPDATE SKIP LOCKED on PostgreSQL), released and checked. Apart so that the rules of who
may assemble which trace are read in one place.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    func,
    or_,
    select,
    union_all,
)

from railtrace.model import KeyHolder
from railtrace.store.connection import Job
from railtrace.store.engine import is_sqlite
from railtrace.store.schema import (
    FREE,
    LEASED,
    READY,
    traces,
)
from railtrace.store.statements import (
    _statements,
    listed,
)


@dataclass(slots=True)
class DirtyTrace:
    trace_id: str
    last_arrival_ns: int
    late_spans: int
    assembled: bool
    dirty: bool = True


class Leases(Job):
    """Which traces await assembly, and which replica holds each."""

    def dirty_traces(self, quiet_before_ns: int, wait_before_ns: int, limit: int = 500) -> list[DirtyTrace]:
        """Traces whose last span is older than the quiet period and whose root arrived
        (or which waited longer than the maximum)."""
        t = traces.c

        def waiting(lease: ColumnElement[bool]) -> Any:  # free or held: each by its own index
            return (
                select(t.trace_id, t.last_arrival_ns, t.late_spans, t.assembled_ns)
                .where(
                    READY,
                    lease,
                    t.last_arrival_ns <= quiet_before_ns,
                    or_(t.has_root.is_(True), t.first_arrival_ns <= wait_before_ns),
                )
                .order_by(t.last_arrival_ns)
                .limit(limit)
                .subquery()
            )

        found = union_all(*(select(*q.c) for q in (waiting(FREE), waiting(LEASED)))).subquery()
        q = select(*found.c).order_by(found.c.last_arrival_ns, found.c.trace_id).limit(limit)
        with self._read(per_value_plans=True) as conn:
            return [DirtyTrace(r[0], r[1], r[2], r[3] is not None) for r in conn.execute(q)]

    def claim_ready(
        self,
        owner: str,
        quiet_before_ns: int,
        wait_before_ns: int,
        now_ns: int,
        lease_ns: int,
        limit: int = 500,
        skip: Collection[str] = (),
        again: Collection[str] = (),
    ) -> list[DirtyTrace]:
        """Lease up to `limit` ready traces (as `dirty_traces` picks them) to `owner`: free
        ones and, of those `owner` holds already, the ones in `again`. Never returned: those in
        `skip` (traces `owner` has assembled and not stored yet); should their lease have run
        out, it is renewed.

        Replicas sharing one PostgreSQL each claim a disjoint set: the candidate rows are
        locked with FOR UPDATE SKIP LOCKED, so a replica never waits for or takes rows
        another is claiming, and a lease (`claimed_by`, `claimed_until_ns`) keeps them its
        own until it saves or releases them -- or the lease runs out because it died.
        Why `again` and not every lease of `owner`: the traces it has assembled ahead are
        leased to it too, and leaving them out by their lease costs nothing, where testing
        each row against `skip` in the statement cost PostgreSQL a comparison per listed id
        (a claim of 128 took 21 ms instead of 6 with a thousand of them).
        """
        params = {
            "owner": owner,
            "now": now_ns,
            "until": now_ns + lease_ns,
            "quiet_before": quiet_before_ns,
            "wait_before": wait_before_ns,
            "limit": limit,
            "again": listed(again, self.sqlite),
        }
        with self._begin(per_value_plans=True) as conn:
            rows = list(conn.execute(self._q.claim_ready, params).all())
        if skip:  # only if their lease ran out: it is renewed, they are not returned
            rows = [r for r in rows if r[0] not in skip]
        rows.sort(key=lambda r: (r[1], r[0]))
        return [DirtyTrace(r[0], r[1], r[2], r[3] is not None) for r in rows]

    def claim(self, owner: str, trace_ids: Iterable[str], now_ns: int, lease_ns: int) -> set[str]:
        """Lease these traces (dirty or not) to `owner` where no other replica holds them;
        returns the ids now held by `owner` (unknown ids are never returned)."""
        ids = sorted(set(trace_ids))
        if not ids:
            return set()
        params = {"ids": listed(ids, self.sqlite), "owner": owner, "now": now_ns, "until": now_ns + lease_ns}
        with self._begin() as conn:
            return set(conn.execute(self._q.claim, params).scalars())

    def release(self, owner: str, trace_ids: Iterable[str]) -> None:
        """Give up `owner`'s leases on these traces (they stay dirty if they were)."""
        ids = sorted(set(trace_ids))
        if not ids:
            return
        with self._begin() as conn:
            _release(conn, owner, ids, self.sqlite)

    def count_dirty(self) -> int:
        with self._read() as conn:
            # Free and held traces are counted through their own partial indexes.
            free, held = (select(func.count()).where(READY, c).scalar_subquery() for c in (FREE, LEASED))
            return int(conn.execute(select(free + held)).scalar_one())

    def trace_states(self, trace_ids: Iterable[str]) -> dict[str, DirtyTrace]:
        """Arrival state of these traces (unknown ids are absent)."""
        ids = sorted(set(trace_ids))
        if not ids:
            return {}
        with self._read() as conn:
            rows = conn.execute(self._q.trace_states, {"ids": listed(ids, self.sqlite)}).all()
        return {r[0]: DirtyTrace(r[0], r[1], r[2], r[3] is not None, bool(r[4])) for r in rows}

    def traces_for_keys(self, keys: Iterable[str]) -> list[KeyHolder]:
        """(request key, trace id, first arrival) for every trace holding one of these keys
        (stitching), each key's traces in the order they first arrived."""
        ks = sorted({k for k in keys if k})
        if not ks:
            return []
        with self._read() as conn:
            return [
                (r[0], r[1], r[2])
                for r in conn.execute(self._q.traces_for_keys, {"ids": listed(ks, self.sqlite)})
            ]


def _release(conn: Connection, owner: str, trace_ids: Sequence[str], sqlite: bool) -> None:
    conn.execute(_statements(sqlite).release, {"ids": listed(trace_ids, sqlite), "owner": owner})


def _unchanged(conn: Connection, marks: dict[str, int]) -> set[str]:
    """The traces of `marks` whose last arrival is still the one seen. Every row of `marks`
    is locked (to the end of the transaction) as its last arrival is read, so a span
    committed after the check waits for this commit."""
    sqlite = is_sqlite(conn)
    rows = conn.execute(_statements(sqlite).lock_traces, {"ids": listed(marks, sqlite)})
    return {tid for tid, last in rows if marks[tid] == last}
