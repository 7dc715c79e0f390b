"""Engine construction (SQLite pragmas, PostgreSQL) and the programmatic Alembic upgrade."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from psycopg.types.array import ListBinaryDumper
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).with_name("migrations")


def is_sqlite(engine: Engine | Connection) -> bool:
    return engine.dialect.name == "sqlite"


SQLITE_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
# Pages (of 4 KB) the WAL may hold before a commit of an assembly-only engine copies them into
# the database file. SQLite's default, 1,000, made the writer checkpoint every few commits; a
# page that ingest rewrites often (an index leaf) is then copied once per checkpoint instead of
# once per few commits. Measured: 1.1-1.3x the insert rate, growing with history
# (benchmarks/ingest/README.md). The span writer's engine has no automatic checkpoint: it runs
# a passive one itself every 0.5 s, outside its writers' turn (`Store._checkpoint`).
SQLITE_WAL_AUTOCHECKPOINT = 16384
# Frames (pages) the WAL may still hold after the span writer's passive checkpoint before it
# checkpoints the WAL to its end and truncates it (`checkpoint_sqlite_wal`): twice what an
# automatic checkpoint aims at, 128 MB.
SQLITE_WAL_LIMIT_FRAMES = 2 * SQLITE_WAL_AUTOCHECKPOINT


def checkpoint_sqlite_wal(
    engine: Engine,
    turn: Callable[[], AbstractContextManager[Any]] = nullcontext,
    limit_frames: int | None = None,
) -> bool:
    """A passive checkpoint, and a truncating one if the WAL has grown past `limit_frames`
    (default `SQLITE_WAL_LIMIT_FRAMES`); returns whether it truncated.

    The passive checkpoint copies what no reader still needs, never waits for anyone and lets
    writers go on meanwhile. But SQLite starts the WAL afresh only after a checkpoint that
    reached its end, and under sustained ingest with assembly and the API reading all the time
    that moment may never come: the WAL grew to 380 MB within a minute at 8,500 spans/s, and
    every page read searches the WAL's index, which grows with it, so assembly slowed down the
    longer the load lasted. The TRUNCATE checkpoint, in the writer's `turn` because it holds
    other writers out, waits (busy timeout) for the readers of older snapshots to finish,
    copies what the passive one left and empties the file.
    """
    limit = SQLITE_WAL_LIMIT_FRAMES if limit_frames is None else limit_frames
    with engine.connect() as conn:
        _busy, frames, _copied = conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").one()
    if frames <= limit:
        return False
    with turn(), engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    return True


def commit_synchronous(journal_mode: str, wanted: str) -> str:
    """The `synchronous` setting for a connection whose journal mode came out `journal_mode`:
    `wanted` in WAL mode; FULL otherwise (a file system that cannot hold a WAL), where NORMAL
    could leave a corrupt database after a power cut and nothing flushes a WAL afterwards."""
    return wanted if journal_mode.lower() == "wal" else "FULL"


def make_engine(url: str, *, sqlite_synchronous: str = "NORMAL", derived_only: bool = False) -> Engine:
    """An engine for `url`. SQLite gets WAL and a busy timeout; the parent folder is created.

    SQLite commits do not wait for the disk (`synchronous=NORMAL`, which in WAL mode cannot
    corrupt the database on power loss, only lose the newest commits). What is acknowledged
    is made durable by its writer: `Store.insert_batches` flushes the WAL to disk after its
    commit (`SqliteWal`), outside its writers' turn, before any export of that commit is
    answered: the same guarantee as `synchronous=FULL`, without holding every other writer
    out for the fsync. If the file cannot be put in WAL mode, commits wait for the disk
    (`FULL`) instead.

    `derived_only`: the engine writes only what can be derived again from stored spans
    (assembly: request summaries, dirty marks, leases), so its commits need not wait for the
    disk -- on PostgreSQL `synchronous_commit=off` (SQLite commits never wait, see above). Nothing
    acknowledged depends on them: both databases write the log in order, and the ingest
    writer's next durable commit flushes these with it; one lost to a power cut leaves its
    traces dirty, to be assembled again. Why: each assembly commit held SQLite's one write lock
    for an fsync (~3.5 ms on this kind of disk, several per assembly step), which the ingest
    writer and the other assembly processes queued behind.
    """
    if sqlite_synchronous.upper() not in SQLITE_SYNCHRONOUS:
        raise ValueError(f"sqlite_synchronous must be one of {', '.join(SQLITE_SYNCHRONOUS)}")
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise ValueError(
                "railtrace needs a SQLite file, not an in-memory database (several threads share it)"
            )
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, pool_size=8, max_overflow=8, connect_args={"check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            mode = cur.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            cur.execute(f"PRAGMA synchronous={commit_synchronous(mode, sqlite_synchronous)}")
            cur.execute("PRAGMA busy_timeout=10000")
            cur.execute("PRAGMA cache_size=-65536")
            # The span writer checkpoints outside its writers' turn instead (`checkpoint_sqlite_wal`).
            cur.execute(f"PRAGMA wal_autocheckpoint={SQLITE_WAL_AUTOCHECKPOINT if derived_only else 0}")
            cur.close()

        return engine
    if parsed.get_backend_name() == "postgresql":
        # Which part of railtrace holds a connection, in pg_stat_activity and the server's log,
        # unless the URL names it already.
        name = "railtrace-assembly" if derived_only else "railtrace"
        connect_args: dict[str, Any] = {}
        if "application_name" not in parsed.query:
            connect_args["application_name"] = name
        if "connect_timeout" not in parsed.query:
            # Without it a connection attempt to an unreachable server (packets dropped, not
            # refused) waits for the kernel's TCP timeout, minutes, holding the span writer.
            connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
        if "tcp_user_timeout" not in parsed.query:
            # Likewise for a statement on an open connection whose packets go unacknowledged:
            # without it the kernel retransmits for ~15 minutes before the call fails.
            connect_args["tcp_user_timeout"] = PG_TCP_USER_TIMEOUT_MS
        engine = create_engine(url, pool_size=8, max_overflow=8, connect_args=connect_args)
        _ping_idle_connections(engine)

        @event.listens_for(engine, "connect")
        def _binary_arrays(dbapi_conn: Any, _record: Any) -> None:
            """Lists (the id lists of `store.among`, the columns of `store._rows_as_arrays`) are
            sent as arrays in the binary format: psycopg builds the text format in Python, with
            bytes written as hex, 35 us per request row stored against 10 in binary, and one
            sixth of an assembly process's time under load."""
            dbapi_conn.adapters.register_dumper(list, ListBinaryDumper)  # the last one is %s's

        if derived_only:

            @event.listens_for(engine, "connect")
            def _no_commit_wait(dbapi_conn: Any, _record: Any) -> None:
                with dbapi_conn.cursor() as cur:
                    cur.execute("SET synchronous_commit TO off")
                dbapi_conn.commit()

        return engine
    raise ValueError(f"unsupported database URL {parsed.render_as_string(hide_password=True)!r}")


def pg_has_lz4(conn: Connection) -> bool:
    """Whether this PostgreSQL server can compress with lz4 (14 or later, built with it);
    False on SQLite. Migration 0006 compresses span bodies with it where it can."""
    if conn.dialect.name != "postgresql":
        return False
    probe = "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
    return bool(conn.exec_driver_sql(probe).scalar())  # no row before PostgreSQL 14


# Seconds a new PostgreSQL connection may take (unless the URL sets `connect_timeout`).
PG_CONNECT_TIMEOUT_S = 10
# Milliseconds sent data may stay unacknowledged before the connection counts as broken.
PG_TCP_USER_TIMEOUT_MS = 30_000

# A pooled PostgreSQL connection that sat unused this long is checked with a round trip before
# it is handed out (`_ping_idle_connections`).
PING_IDLE_S = 1.0


def _ping_idle_connections(engine: Engine) -> None:
    """Check a pooled connection with a round trip only if it sat unused for `PING_IDLE_S`.

    Why not SQLAlchemy's `pool_pre_ping`: it pings at every checkout, and every store call
    checks a connection out, so under load each assembly step made a dozen extra round trips
    (5 % of an assembly process's time, and the server's work for each). A connection in use
    within the last second is handed out as it is; if the server went away meanwhile, the call
    fails once (an export is then not acknowledged and is retried by its exporter, an assembly
    step is taken again) and SQLAlchemy replaces every pooled connection.
    """

    @event.listens_for(engine, "checkin")
    def _idle_from(_dbapi_conn: Any, record: Any) -> None:
        record.info["railtrace_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("railtrace_idle_since")
        if since is None or time.monotonic() - since < PING_IDLE_S:
            return  # new, or in use just now
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            if engine.dialect.is_disconnect(exc, dbapi_conn, None):  # type: ignore[arg-type]  # any driver error
                # The pool discards this connection and connects anew.
                raise DisconnectionError("pooled connection lost while idle") from exc
            raise


class SqliteWriters:
    """Takes turns among the writers of one SQLite file, across processes, woken as soon as the
    writer before them is done.

    Why: SQLite lets one writer in at a time, and one that finds the file locked polls, asleep
    for 1, 2, 5, 10, 15, 20, 25 ms and so on between tries. With the ingest writer committing
    back to back and assembly processes storing between its commits, an assembly write that
    found the lock taken slept past several free moments, and its process sat idle with work
    queued. Holding an exclusive `flock` on a file beside the database around each write
    transaction queues the writers in the kernel instead, which wakes the next one at once. It
    decides nothing about correctness: SQLite's own lock still does, so a writer that does not
    take turns here (a migration, another tool) is only slower. Reentrant within a thread; the
    lock file's descriptor is opened per turn, so nothing is held between writes.
    """

    def __init__(self, database: str) -> None:
        self.path = f"{database}-writers.lock"
        self._local = threading.local()

    @contextmanager
    def turn(self) -> Iterator[None]:
        depth = getattr(self._local, "depth", 0)
        if depth:  # this thread has the turn already
            self._local.depth = depth + 1
            try:
                yield
            finally:
                self._local.depth = depth
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._local.depth = 1
            try:
                yield
            finally:
                self._local.depth = 0
        finally:
            os.close(fd)  # gives up the lock


class SqliteWal:
    """Flushes a SQLite file's WAL to disk: what makes the span writer's commits durable.

    The span writer commits with `synchronous=NORMAL` in its writers' turn, then calls `sync`
    after the turn and before answering the exports of that commit. Flushing the WAL file
    flushes every frame committed to it so far, which is what `synchronous=FULL` does inside
    the commit; but there the fsync (milliseconds, tens of them under load) held the write
    lock, and every assembly process queued behind it. A WAL file new since the last call (it
    is deleted when its last connection closes) has its directory flushed too, as SQLite does
    for a new WAL file; a WAL that is gone was checkpointed into the database file and that
    file flushed (SQLite syncs the database after a full checkpoint), so there is nothing to do.
    """

    def __init__(self, database: str) -> None:
        self.path = f"{database}-wal"
        self._inode: int | None = None

    def sync(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        if inode != self._inode:
            directory = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
            self._inode = inode


def alembic_config() -> Config:
    # Imported here: only the serve process migrates, and alembic (with mako and its DDL
    # modules) is ~10 MB that every assembly child would otherwise load and keep.
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


# Any fixed 64-bit number: the PostgreSQL advisory lock replicas take around migrations.
MIGRATION_LOCK = 0x7261696C74726163  # "railtrac"


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision (run at every start; idempotent).

    Replicas that start together on one PostgreSQL serialise here: the first takes a
    transaction-scoped advisory lock and migrates; the others wait for its commit, then find
    the schema at head and do nothing. (DDL is transactional in PostgreSQL, so a replica that
    dies mid-migration leaves the previous revision, not half of the next.)
    """
    from alembic import command

    cfg = alembic_config()
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
