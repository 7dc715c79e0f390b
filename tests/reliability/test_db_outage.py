"""A database outage ends by itself: PostgreSQL unreachable for 5 s (through a TCP proxy that is
cut and restored, the shared server is never stopped), SQLite on a disk that fills up and is
freed. A real `railtrace serve` is fed by official HTTP and gRPC exporters throughout; ingest
must resume without a restart, /readyz must follow, and every span an exporter was told was
accepted must be stored. The 60 s outage is `python -m benchmarks.reliability.outage --seconds 60`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability import outage_harness
from tests.reliability.outage_harness import pg_outage


def test_postgres_unreachable_for_5s_ingest_resumes_by_itself(
    new_database: Callable[[str], str], tmp_path: Path
) -> None:
    figures = pg_outage(new_database("postgresql"), tmp_path, seconds=5, restart_after_s=3)
    assert figures["lost_spans"] == 0, figures
    assert figures["acked_spans"] > figures["acked_spans_before_outage"], figures
    assert figures["exports_ok_in_3s_after_recovery"] > 0, figures  # accepting again, no restart
    # Failing past `write_failure_restart_s` (3 s here) turns the liveness probe; once writes
    # work again it is 200 again.
    assert 503 in figures["healthz_during"], figures
    assert figures["healthz_after"] == [200], figures
    assert figures["sigterm_exit"] == 0, figures


def test_postgres_silent_for_8s_liveness_turns_and_ingest_resumes(
    new_database: Callable[[str], str], tmp_path: Path
) -> None:
    """The network drops PostgreSQL's packets (the proxy stops forwarding, nothing is closed):
    a commit under way gets no answer. /readyz still answers (503) within its ping's 2 s, the
    stuck write turns /healthz 503 past `write_failure_restart_s`, and when packets flow again
    the held commit completes and ingest resumes."""
    figures = pg_outage(new_database("postgresql"), tmp_path, seconds=8, restart_after_s=3, frozen=True)
    assert figures["lost_spans"] == 0, figures
    assert figures["exports_ok_in_3s_after_recovery"] > 0, figures
    assert 503 in figures["healthz_during"], figures
    assert figures["healthz_after"] == [200], figures
    assert figures["sigterm_exit"] == 0, figures


@pytest.mark.parametrize("how", ["full_disk", "file_size_limit"])
def test_sqlite_disk_full_then_freed_ingest_resumes_by_itself(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real full disk (a small tmpfs) where the test may mount one, else (no root, and never
    skipped) the file size limit; and the file size limit on every machine."""
    if how == "file_size_limit":
        monkeypatch.setattr(outage_harness, "can_mount_tmpfs", lambda _path: "not this case")
    figures = outage_harness.sqlite_disk_full(tmp_path, seconds=5)
    assert figures["lost_spans"] == 0, figures
    assert figures["exports_ok_in_3s_after_recovery"] > 0, figures
    assert figures["integrity"] == "ok", figures
    assert figures["healthz_during"] == [200], figures  # 300 s default: no restart asked for
    assert figures["sigterm_exit"] == 0, figures
