"""The span writer's refusal ends by itself: the logic, with a store that fails on command.
The same path against real databases (PostgreSQL cut off, SQLite on a full disk) is
tests/reliability/test_db_outage.py."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy.exc import IntegrityError, OperationalError

from railtrace.ingest import BulkWriter, WriterUnavailable
from railtrace.ingest.writer import FAILURES_BEFORE_REFUSING
from railtrace.otlp.rows import RowBatch
from railtrace.store import InsertResult


def _unreachable() -> OperationalError:
    return OperationalError("INSERT ...", {}, ConnectionRefusedError("connection refused"))


class FlakyStore:
    """Fails every write while `down` is set (as SQLAlchemy reports a lost server); counts
    probes and insert attempts."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.probes = 0
        self.inserted = 0
        self.attempts = 0
        self.gate = threading.Event()
        self.gate.set()

    def insert_batches(self, batches: list[RowBatch]) -> InsertResult:
        self.gate.wait(5)
        self.attempts += 1
        if self.down.is_set():
            raise _unreachable()
        n = sum(len(b) for b in batches)
        self.inserted += n
        return InsertResult(n, 0)

    def probe_write(self) -> None:
        self.probes += 1
        if self.down.is_set():
            raise _unreachable()


def _batch() -> RowBatch:
    return RowBatch(span_count=1)


def test_refusal_ends_when_the_database_takes_a_write_again() -> None:
    store = FlakyStore()
    writer = BulkWriter(store, retry_initial_s=0.02, retry_max_s=0.1)  # type: ignore[arg-type]
    writer.start()
    try:
        assert writer.write_sync(_batch(), timeout=5).inserted == 1
        store.down.set()
        for _ in range(FAILURES_BEFORE_REFUSING):
            with pytest.raises(WriterUnavailable):
                writer.write_sync(_batch(), timeout=5)
        assert writer.refusing and not writer.healthy
        with pytest.raises(WriterUnavailable, match="failing"):
            writer.write_sync(_batch(), timeout=5)  # refused without touching the database
        time.sleep(0.5)
        assert store.probes >= 3  # it keeps trying by itself, backing off
        assert writer.failing_for >= 0.5
        store.down.clear()
        deadline = time.monotonic() + 5
        while writer.refusing and time.monotonic() < deadline:
            time.sleep(0.01)
        assert writer.healthy and writer.failing_for == 0
        assert writer.write_sync(_batch(), timeout=5).inserted == 1
        assert writer.alive
    finally:
        writer.stop()
    assert not writer.alive


def test_backoff_grows_to_its_ceiling() -> None:
    store = FlakyStore()
    writer = BulkWriter(store, retry_initial_s=0.01, retry_max_s=0.08)  # type: ignore[arg-type]
    writer.start()
    try:
        store.down.set()
        for _ in range(FAILURES_BEFORE_REFUSING):
            with pytest.raises(WriterUnavailable):
                writer.write_sync(_batch(), timeout=5)
        time.sleep(1.0)
        # 0.02 + 0.04 + 0.08 + 0.08 ...: about 12 tries in 1 s, not a hundred.
        assert 5 <= store.probes <= 20
    finally:
        writer.stop()


def test_a_failing_database_fails_a_group_commit_once_not_once_per_export() -> None:
    """Against an unreachable server each attempt may wait for its connect timeout: the
    exports queued behind one failed commit are answered with it, not retried one by one."""
    store = FlakyStore()
    writer = BulkWriter(store, retry_initial_s=10)  # type: ignore[arg-type]
    writer.start()
    try:
        store.down.set()
        store.gate.clear()  # hold the writer so that exports queue up for one commit
        errors: list[BaseException] = []

        def one() -> None:
            try:
                writer.write_sync(_batch(), timeout=10)
            except BaseException as exc:
                errors.append(exc)

        writer.submit(_batch(), lambda _r, _e: None)  # the commit the writer is held in
        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(0.2)
        store.gate.set()
        for t in threads:
            t.join(10)
        assert len(errors) == 8 and all(isinstance(e, WriterUnavailable) for e in errors)
        assert store.attempts == 2  # the first export's commit, then the eight together
    finally:
        writer.stop()


def test_an_export_the_database_refuses_does_not_fail_the_others() -> None:
    """A data error (not the database failing) still retries the group one by one."""

    class PickyStore(FlakyStore):
        def insert_batches(self, batches: list[RowBatch]) -> InsertResult:
            if any(b.span_count == 13 for b in batches):
                raise IntegrityError("INSERT ...", {}, ValueError("bad row"))
            return super().insert_batches(batches)

    store = PickyStore()
    writer = BulkWriter(store)  # type: ignore[arg-type]
    writer.start()
    try:
        store.gate.clear()
        results: list[object] = []
        writer.submit(RowBatch(span_count=1), lambda r, e: results.append(e or r))
        writer.submit(RowBatch(span_count=13), lambda r, e: results.append(e or r))
        writer.submit(RowBatch(span_count=2), lambda r, e: results.append(e or r))
        store.gate.set()
        deadline = time.monotonic() + 5
        while len(results) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sum(isinstance(r, WriterUnavailable) for r in results) == 1
        assert store.inserted == 3
    finally:
        writer.stop()
