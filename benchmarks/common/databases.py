"""Throwaway databases for the benchmarks: a SQLite file or a fresh PostgreSQL database."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text

PG_ADMIN = os.environ.get("RAILTRACE_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


class Database:
    """A throwaway SQLite file or PostgreSQL database, removed afterwards."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.tmp = Path(tempfile.mkdtemp(prefix="railtrace-bench-"))
        if kind == "sqlite":
            self.url = f"sqlite:///{self.tmp / 'bench.db'}"
        else:
            self.name = f"rt_bench_{uuid.uuid4().hex[:10]}"
            self.admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
            with self.admin.connect() as c:
                c.execute(text(f'CREATE DATABASE "{self.name}"'))
            self.url = PG_ADMIN.rsplit("/", 1)[0] + "/" + self.name

    def drop(self) -> None:
        if self.kind == "postgresql":
            with self.admin.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
            self.admin.dispose()
        shutil.rmtree(self.tmp, ignore_errors=True)
