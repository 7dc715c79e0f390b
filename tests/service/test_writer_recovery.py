"""The span writer's refusal ends by itself: the logic, with a store that fails on command.
The same path against real databases (PostgreSQL cut off, SQLite on a full disk) is
tests/reliability/test_db_outage.py."""

from __future__ import annotations

import threading
import time

import pytest

from railtrace.ingest import BulkWriter, WriterUnavailable
from railtrace.ingest.writer import FAILURES_BEFORE_REFUSING
from railtrace.store import InsertResult, RowBatch


class FlakyStore:
    """Fails every write while `down` is set; counts probes."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.probes = 0
        self.inserted = 0

    def insert_batches(self, batches: list[RowBatch]) -> InsertResult:
        if self.down.is_set():
            raise ConnectionError("database unreachable")
        n = sum(len(b) for b in batches)
        self.inserted += n
        return InsertResult(n, 0)

    def probe_write(self) -> None:
        self.probes += 1
        if self.down.is_set():
            raise ConnectionError("database unreachable")


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
