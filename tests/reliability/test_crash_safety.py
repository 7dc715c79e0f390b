"""Crash safety of a real `railtrace serve` process on SQLite and PostgreSQL.

kill -9 in the middle of ingest from the official exporters, restart, repeat: every span an
exporter was told was accepted is in the database after each restart, the database opens
without repair, and requests that were waiting for assembly when the process died are
assembled after the restart. SIGTERM commits everything acknowledged and exits 0. CI kills
a few times per database; `benchmarks/reliability/crash.py` does 20+ per database.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.reliability.crash_harness import Ledger, Senders, Server, assembled, crash_rounds, stored

ROUNDS = int(os.environ.get("RAILTRACE_CRASH_ROUNDS", "2"))


def _wait(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_kill_9_mid_ingest_loses_nothing_acknowledged(db_url: str, tmp_path: Path) -> None:
    figures = crash_rounds(db_url, tmp_path, ROUNDS)
    ledger: Ledger = figures["ledger"]  # type: ignore[assignment]
    assert ledger.ok_exports >= ROUNDS and ledger.failed_exports >= 1  # kills landed mid-ingest
    server = Server(db_url, tmp_path)
    try:
        server.wait_ready()
        assert not ledger.acked - stored(db_url)
        # Half-assembled requests: every acknowledged trace gets its summary after restart.
        traces = {t for t, _ in ledger.acked}
        _wait(lambda: traces <= assembled(db_url), "every acknowledged trace to be assembled")
    finally:
        assert server.terminate() == 0


def test_sigterm_commits_everything_acknowledged(db_url: str, tmp_path: Path) -> None:
    ledger = Ledger()
    server = Server(db_url, tmp_path)
    server.wait_ready()
    with Senders(server, ledger):
        while ledger.ok_exports < 4:
            time.sleep(0.01)
        code = server.terminate()  # while exports keep coming
    assert code == 0
    assert ledger.acked and not ledger.acked - stored(db_url)
