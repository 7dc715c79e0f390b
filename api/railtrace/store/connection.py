"""What the store's jobs share: one engine's dialect, statements, transactions and the SQLite
writers' turns (`StoreContext`), and the base of each job (`Job`). In one place so that every
job opens its transactions the same way and takes the same turn.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sqlalchemy import (
    Connection,
    Engine,
)

from railtrace.store.engine import SqliteWal, SqliteWriters, is_sqlite
from railtrace.store.statements import _per_value_plans, _statements

MAX_KNOWN_RESOURCES = 100_000


class StoreContext:
    """What every job of one store shares: the engine, its dialect, the statements built for it,
    and the SQLite writers' turns and WAL flush. Thread-safe: each transaction takes its own
    connection."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sqlite = is_sqlite(engine)
        self.q = _statements(self.sqlite)
        # Writers of a SQLite file take turns through a lock that wakes the next at once.
        self.writers = SqliteWriters(engine.url.database or "") if self.sqlite else None
        # SQLite commits do not wait for the disk; the span writer flushes the WAL after its turn.
        self.wal = SqliteWal(engine.url.database or "") if self.sqlite else None

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """This writer's turn among the SQLite file's writers (`SqliteWriters`); PostgreSQL
        needs none."""
        if self.writers is None:
            yield
        else:
            with self.writers.turn():
                yield

    @contextlib.contextmanager
    def read(self, per_value_plans: bool = False) -> Iterator[Connection]:
        """A read-only transaction, ended by COMMIT (`per_value_plans`: see `_per_value_plans`).

        Why not the ROLLBACK that closing a connection would send: psycopg forgets every
        statement it prepared on a connection at each ROLLBACK (and has the server drop them),
        so no statement of the store stayed prepared from one call to the next, and PostgreSQL
        parsed and planned each run anew (planning alone 0.15-0.5 ms per run of an assembly
        statement, and of the request detail lookup; benchmarks/verdicts/README.md). A read that
        fails still rolls back.
        """
        with self.engine.connect() as conn:
            with _per_value_plans(conn) if per_value_plans else contextlib.nullcontext():
                yield conn
            conn.commit()

    @contextlib.contextmanager
    def begin(self, per_value_plans: bool = False) -> Iterator[Connection]:
        """A write transaction, in this writer's turn."""
        with (
            self.turn(),
            self.engine.begin() as conn,
            _per_value_plans(conn) if per_value_plans else contextlib.nullcontext(),
        ):
            yield conn


class Job:
    """A job of the store (writes, leases, reads, publish, upkeep) over a shared `StoreContext`."""

    def __init__(self, ctx: StoreContext) -> None:
        self.ctx = ctx
        self.engine = ctx.engine
        self.sqlite = ctx.sqlite
        self._q = ctx.q
        self._wal = ctx.wal
        self._turn = ctx.turn
        self._read = ctx.read
        self._begin = ctx.begin
