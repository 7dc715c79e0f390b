"""The SQLite settings every connection of the embedded store must have, and what makes an
acknowledged commit durable: WAL, commits that do not wait for the disk (`synchronous=NORMAL`)
and the span writer flushing the WAL itself after its writers' turn, before it answers; and
what keeps the writer from checkpointing every few commits. Assembly's own engine, which
writes only state derived from stored spans, commits without waiting for the disk, on both
databases."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from railtrace.server.runtime import Runtime
from railtrace.settings import Settings
from railtrace.store import make_engine
from railtrace.store.engine import SQLITE_WAL_AUTOCHECKPOINT, SqliteWal, commit_synchronous


def test_every_connection_gets_the_settings(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'railtrace.db'}")
    try:
        with engine.connect() as first, engine.connect() as second:  # two pool connections
            for conn in (first, second):
                pragma = lambda name, c=conn: c.exec_driver_sql(f"PRAGMA {name}").scalar_one()  # noqa: E731
                assert pragma("journal_mode") == "wal"
                assert pragma("synchronous") == 1  # NORMAL: the span writer flushes the WAL itself
                # The span writer checkpoints outside its turn (Store._checkpoint), not in commits.
                assert pragma("wal_autocheckpoint") == 0
                assert pragma("busy_timeout") == 10000
        derived = make_engine(f"sqlite:///{tmp_path / 'railtrace.db'}", derived_only=True)
        with derived.connect() as conn:  # a process that only assembles still checkpoints
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar_one() == SQLITE_WAL_AUTOCHECKPOINT
        derived.dispose()
    finally:
        engine.dispose()


def test_a_file_that_is_not_in_wal_mode_waits_for_the_disk_at_commit() -> None:
    """NORMAL is safe only with a WAL: a file SQLite could not switch (another journal mode)
    gets FULL. (A file system that refuses WAL is not available to a test; the rule is.)"""
    assert commit_synchronous("wal", "NORMAL") == "NORMAL"
    assert commit_synchronous("WAL", "OFF") == "OFF"
    for mode in ("delete", "truncate", "persist", "memory", "off"):
        assert commit_synchronous(mode, "NORMAL") == "FULL"


def _commit_wait(engine: object) -> object:
    with engine.connect() as conn:  # type: ignore[attr-defined]
        if conn.dialect.name == "sqlite":
            return conn.exec_driver_sql("PRAGMA synchronous").scalar_one()
        return conn.exec_driver_sql("SHOW synchronous_commit").scalar_one()


def test_commit_waits_of_the_ingest_and_derived_state_engines(db_url: str) -> None:
    sqlite = db_url.startswith("sqlite")
    ingest, derived = make_engine(db_url), make_engine(db_url, derived_only=True)
    try:
        # SQLite: NORMAL, the span writer flushes the WAL after its commit (tested below).
        assert _commit_wait(ingest) == (1 if sqlite else "on")
        assert _commit_wait(derived) == (1 if sqlite else "off")  # NORMAL / off
        with derived.connect() as a, derived.connect() as b:  # every pooled connection
            for conn in (a, b):
                if sqlite:
                    assert conn.exec_driver_sql("PRAGMA synchronous").scalar_one() == 1
                else:
                    assert conn.exec_driver_sql("SHOW synchronous_commit").scalar_one() == "off"
    finally:
        ingest.dispose()
        derived.dispose()


def test_postgresql_connections_say_which_part_of_railtrace_holds_them(
    new_database: Callable[[str], str],
) -> None:
    """pg_stat_activity (and a log line prefix with %a) tells the ingest and API connections
    from assembly's; a name in the URL is kept."""
    url = new_database("postgresql")
    named = make_url(url).update_query_dict({"application_name": "railtrace-eu-1"}).render_as_string(False)
    engines = [make_engine(url), make_engine(url, derived_only=True), make_engine(named, derived_only=True)]
    try:
        names = []
        for e in engines:
            with e.connect() as conn:
                names.append(conn.exec_driver_sql("SHOW application_name").scalar_one())
        assert names == ["railtrace", "railtrace-assembly", "railtrace-eu-1"]
    finally:
        for e in engines:
            e.dispose()


def test_postgresql_lists_are_sent_as_binary_arrays(new_database: Callable[[str], str]) -> None:
    """psycopg builds text-format arrays in Python (bytes as hex): 3.5x the client's time for
    a page of request rows. Both engines' connections dump lists in the binary format."""
    from psycopg.adapt import PyFormat
    from psycopg.types.array import ListBinaryDumper

    url = new_database("postgresql")
    engines = [make_engine(url), make_engine(url, derived_only=True)]
    try:
        for engine in engines:
            with engine.connect() as conn:
                dbapi = conn.connection.driver_connection
                assert dbapi.adapters.get_dumper(list, PyFormat.AUTO) is ListBinaryDumper
                got = conn.exec_driver_sql(
                    "SELECT %(b)s::bytea[], %(s)s::varchar[]", {"b": [b"\x00\xff", None], "s": ["é", ""]}
                ).one()
                assert got == ([b"\x00\xff", None], ["é", ""])
    finally:
        for engine in engines:
            engine.dispose()


def test_a_pooled_connection_is_checked_only_after_sitting_idle(
    new_database: Callable[[str], str], pg_admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: a connection killed by the server while it sat in the pool longer than
    `PING_IDLE_S` is replaced at checkout, unseen by the caller; one used just before is handed
    out without a round trip (so a kill inside that second fails the one call that meets it,
    and the next gets a fresh connection)."""
    from railtrace.store import engine as engine_module

    engine = make_engine(new_database("postgresql"))

    def backend() -> int:
        with engine.connect() as conn:
            return conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()

    def kill(pid: int) -> None:
        with pg_admin.connect() as conn:
            conn.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)}, 5000)")

    try:
        monkeypatch.setattr(engine_module, "PING_IDLE_S", 0.0)  # every pooled connection counts as idle
        first = backend()
        kill(first)
        second = backend()  # pinged, found dead, replaced
        assert second != first
        monkeypatch.setattr(engine_module, "PING_IDLE_S", 3600.0)  # none has been idle that long
        kill(second)
        with pytest.raises(OperationalError):
            backend()  # not pinged: the call meets the dead connection
        assert backend() not in (first, second)
    finally:
        engine.dispose()


def test_the_assembler_thread_writes_through_the_derived_state_engine(db_url: str) -> None:
    from railtrace.scheduling.assembler import Pipeline

    pipeline = Pipeline(request_keys=lambda s: [], assemble=lambda spans, now_ns=None: [], judge=lambda f: f)
    runtime = Runtime(Settings(db=db_url), pipeline=pipeline).start()
    try:
        assert runtime.assembler is not None
        assert _commit_wait(runtime.engine) == (1 if db_url.startswith("sqlite") else "on")
        assert _commit_wait(runtime.assembler.store.engine) == (1 if db_url.startswith("sqlite") else "off")
    finally:
        runtime.stop()


def test_a_wal_that_readers_kept_from_starting_afresh_is_truncated(tmp_path: Path) -> None:
    """A reader on an old snapshot keeps the passive checkpoint from copying the newer frames,
    so the WAL grows past the bound; once that reader is done, the span writer's checkpoint
    copies everything and empties the file. Under the bound it leaves the WAL alone."""
    from railtrace.store.engine import checkpoint_sqlite_wal

    engine = make_engine(f"sqlite:///{tmp_path / 'railtrace.db'}")
    wal = tmp_path / "railtrace.db-wal"
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB)")
        reader = sqlite3.connect(tmp_path / "railtrace.db", isolation_level=None)
        try:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM t").fetchone()  # holds its snapshot
            for _ in range(100):  # ~2 MB of commits, each followed by the writer's checkpoint
                with engine.begin() as conn:
                    conn.exec_driver_sql("INSERT INTO t (body) VALUES (randomblob(20000))")
                assert not checkpoint_sqlite_wal(engine)  # far under the default bound
            grown = wal.stat().st_size
            assert grown > 64 * 4096
            reader.execute("ROLLBACK")
        finally:
            reader.close()
        assert not checkpoint_sqlite_wal(engine, limit_frames=10**6)  # under this bound: kept
        assert wal.stat().st_size == grown
        assert checkpoint_sqlite_wal(engine, limit_frames=64)  # past it: copied and truncated
        assert wal.stat().st_size == 0
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar_one() == 100
    finally:
        engine.dispose()


def test_the_span_writer_checkpoints_the_wal_after_its_commits(tmp_path: Path, monkeypatch: object) -> None:
    from railtrace.otlp.export import prepare
    from railtrace.store import Store, migrate
    from railtrace.store import upkeep as store_mod  # the span writer's checkpoint
    from tests.fixtures.otlp_fixtures import protobuf_body

    real = store_mod.checkpoint_sqlite_wal
    calls: list[object] = []

    def recorded(engine: object, turn: object) -> bool:
        calls.append(engine)
        return real(engine, turn)  # type: ignore[arg-type]

    monkeypatch.setattr(store_mod, "checkpoint_sqlite_wal", recorded)  # type: ignore[attr-defined]
    # An interval no stall of a busy test machine outlasts between the two commits below.
    monkeypatch.setattr(store_mod, "CHECKPOINT_INTERVAL_S", 600.0)  # type: ignore[attr-defined]
    engine = make_engine(f"sqlite:///{tmp_path / 'railtrace.db'}")
    try:
        migrate(engine)
        database = tmp_path / "railtrace.db"
        before = database.stat().st_size  # no automatic checkpoint: the schema is in the WAL
        store = Store(engine)
        store.insert_batches([prepare(protobuf_body("pd-rdma-happy-path"))])
        assert calls == [engine]
        assert database.stat().st_size > before  # the writer's passive checkpoint copied pages
        store.insert_batches([prepare(protobuf_body("pd-tcp-fallback"))])
        assert calls == [engine]  # not again within CHECKPOINT_INTERVAL_S
    finally:
        engine.dispose()


def test_the_span_writer_flushes_the_wal_after_its_turn_and_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What makes an acknowledged commit durable with `synchronous=NORMAL`: `insert_batches`
    (whose return is what the exports wait for) fsyncs the WAL file holding its commit, after
    giving up its writers' turn; the first time, and whenever the WAL file is a new one, also
    its directory. (Power loss itself is not available to a test; the order of the calls is.)"""
    from railtrace.otlp.export import prepare
    from railtrace.store import Store, migrate
    from railtrace.store import engine as engine_mod
    from tests.fixtures.otlp_fixtures import protobuf_body

    database = tmp_path / "railtrace.db"
    engine = make_engine(f"sqlite:///{database}")
    events: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        events.append("fsync " + ("wal" if target == f"{database}-wal" else Path(target).name))
        real_fsync(fd)

    try:
        migrate(engine)
        store = Store(engine)
        real_turn = store._writers.turn  # type: ignore[union-attr]

        depth = 0

        @contextmanager
        def turn() -> Iterator[None]:  # the outermost turn (the commit's transaction enters again)
            nonlocal depth
            with real_turn():
                depth += 1
                if depth == 1:
                    events.append("turn")
                try:
                    yield
                finally:
                    depth -= 1
                    if depth == 0:
                        events.append("turn over")

        store._writers.turn = turn  # type: ignore[union-attr,method-assign]
        monkeypatch.setattr(engine_mod.os, "fsync", fsync)
        store.insert_batches([prepare(protobuf_body("pd-rdma-happy-path"))])
        # The commit, its turn given up, then the WAL and (a WAL new to this writer) its folder.
        assert events[:4] == ["turn", "turn over", "fsync wal", f"fsync {tmp_path.name}"]
        events.clear()
        store.insert_batches([prepare(protobuf_body("pd-tcp-fallback"))])
        assert events[:3] == ["turn", "turn over", "fsync wal"]  # the same WAL: no folder again
        assert f"fsync {tmp_path.name}" not in events
    finally:
        engine.dispose()


def test_a_wal_that_is_gone_needs_no_flush(tmp_path: Path) -> None:
    """The WAL is deleted when its last connection closes, after a checkpoint that copied all of
    it into the database file and flushed that file: nothing is left to make durable."""
    wal = SqliteWal(str(tmp_path / "railtrace.db"))
    wal.sync()  # no file: nothing to do, no error
    assert wal._inode is None
    (tmp_path / "railtrace.db-wal").write_bytes(b"")
    wal.sync()  # a WAL again: flushed, and remembered so that its folder is flushed only once
    assert wal._inode == (tmp_path / "railtrace.db-wal").stat().st_ino


def test_writers_take_turns_across_instances_and_reenter_within_a_thread(tmp_path: Path) -> None:
    """Two gates on one file (as two processes have) never hold a turn at once; a thread that
    has its turn can enter again; a turn ended by an exception is given up."""
    import threading
    import time

    from railtrace.store.engine import SqliteWriters

    database = str(tmp_path / "railtrace.db")
    gates = [SqliteWriters(database), SqliteWriters(database)]
    inside: list[int] = []
    overlaps: list[int] = []
    done = 0

    def write(gate: SqliteWriters) -> None:
        nonlocal done
        for _ in range(300):
            with gate.turn():
                inside.append(1)
                time.sleep(0.0002)  # let the other writer run, as a process would
                if len(inside) > 1:
                    overlaps.append(len(inside))
                with gate.turn():  # reentrant
                    pass
                inside.pop()
                done += 1

    threads = [threading.Thread(target=write, args=(g,)) for g in gates]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert done == 600 and not overlaps

    try:
        with gates[0].turn():
            raise RuntimeError("a failed write")
    except RuntimeError:
        pass
    taken = threading.Event()

    def take() -> None:
        with gates[1].turn():
            taken.set()

    other = threading.Thread(target=take)
    other.start()
    other.join(timeout=10)
    assert taken.is_set()


def test_every_store_write_takes_a_turn_on_sqlite_and_none_on_postgresql(db_url: str) -> None:
    from railtrace.otlp.export import prepare
    from railtrace.store import Store, migrate
    from tests.fixtures.otlp_fixtures import protobuf_body

    engine = make_engine(db_url)
    try:
        migrate(engine)
        store = Store(engine)
        if not db_url.startswith("sqlite"):
            assert store._writers is None
            return
        turns = 0
        real = store._writers.turn  # type: ignore[union-attr]

        def counted() -> object:
            nonlocal turns
            turns += 1
            return real()

        store._writers.turn = counted  # type: ignore[union-attr,method-assign]
        store.insert_batches([prepare(protobuf_body("pd-rdma-happy-path"))])
        assert turns == 2  # the commit's turn, which its transaction enters again
        claimed = store.claim_ready("me", 2**62, 2**62, 0, 10**9, limit=10)
        assert claimed and turns == 3
        store.release("me", [t.trace_id for t in claimed])
        assert turns == 4
    finally:
        engine.dispose()
