"""The SQLite settings every connection of the embedded store must have: they are what makes an
acknowledged commit durable (WAL, synchronous FULL) and what keeps the writer from
checkpointing every few commits."""

from __future__ import annotations

from pathlib import Path

from railtrace.store import make_engine
from railtrace.store.engine import SQLITE_WAL_AUTOCHECKPOINT


def test_every_connection_gets_the_settings(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'railtrace.db'}")
    try:
        with engine.connect() as first, engine.connect() as second:  # two pool connections
            for conn in (first, second):
                pragma = lambda name, c=conn: c.exec_driver_sql(f"PRAGMA {name}").scalar_one()  # noqa: E731
                assert pragma("journal_mode") == "wal"
                assert pragma("synchronous") == 2  # FULL
                assert pragma("wal_autocheckpoint") == SQLITE_WAL_AUTOCHECKPOINT > 1000
                assert pragma("busy_timeout") == 10000
    finally:
        engine.dispose()
