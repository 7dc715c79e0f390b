"""A database outage ends by itself: PostgreSQL unreachable for 5 s (through a TCP proxy that is
cut and restored, the shared server is never stopped), SQLite on a disk that fills up and is
freed. A real `railtrace serve` is fed by official HTTP and gRPC exporters throughout; ingest
must resume without a restart, /readyz must follow, and every span an exporter was told was
accepted must be stored. The 60 s outage is `benchmarks/reliability/outage.py --seconds 60`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from outage_harness import pg_outage, sqlite_disk_full


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


def _can_mount_tmpfs(path: Path) -> str | None:
    if os.geteuid() != 0:
        return "mounting a small tmpfs needs root"
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        return f"cannot mount a tmpfs: {done.stderr.decode().strip()}"
    subprocess.run(["umount", str(path)], check=True)
    return None


def test_sqlite_disk_full_then_freed_ingest_resumes_by_itself(tmp_path: Path) -> None:
    reason = _can_mount_tmpfs(tmp_path / "probe")
    if reason:
        pytest.skip(reason)
    figures = sqlite_disk_full(tmp_path, seconds=5)
    assert figures["lost_spans"] == 0, figures
    assert figures["exports_ok_in_3s_after_recovery"] > 0, figures
    assert figures["integrity"] == "ok", figures
    assert figures["healthz_during"] == [200], figures  # 300 s default: no restart asked for
    assert figures["sigterm_exit"] == 0, figures
