"""Shared fixtures. `db_url` runs a test once on SQLite and once on PostgreSQL.

PostgreSQL: each test gets its own throwaway schema on the server at
`RAILTRACE_TEST_PG` (default `postgresql+psycopg://postgres@127.0.0.1:5432/test`), selected
through `search_path`, dropped afterwards; other users of the server are not touched.

Services started by tests assemble in a thread (`RAILTRACE_ASSEMBLY_PROCESSES=0`, set for every
test and inherited by the `railtrace` processes they start): many tests step the assembler by
hand, and two spawned interpreters per service would add minutes to the suite. The shipped
default (`auto`, child processes) is tested where a test clears it:
tests/scheduling/test_assembly_processes.py.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

PG_URL = os.environ.get("RAILTRACE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture(autouse=True)
def _assemble_in_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAILTRACE_ASSEMBLY_PROCESSES", "0")


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[object]:
    engine = create_engine(PG_URL, isolation_level="AUTOCOMMIT", pool_size=1)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # pragma: no cover - depends on the machine
        engine.dispose()
        pytest.skip(f"PostgreSQL not reachable at {make_url(PG_URL).render_as_string()}: {exc}")
    yield engine
    engine.dispose()


def _pg_schema_url(pg_admin: object) -> Iterator[str]:
    schema = f"rt_test_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:  # type: ignore[attr-defined]
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with pg_admin.connect() as conn:  # type: ignore[attr-defined]
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database URL: a SQLite file, or a PostgreSQL schema of its own."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'railtrace.db'}"
    else:
        yield from _pg_schema_url(request.getfixturevalue("pg_admin"))


@pytest.fixture
def new_database(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """Make another fresh, empty database of a kind (`sqlite` or `postgresql`), as `db_url`
    makes them, removed after the test: for tests that need two or more."""

    def make(kind: str) -> str:
        if kind == "sqlite":
            return f"sqlite:///{tmp_path / f'railtrace-{uuid.uuid4().hex[:8]}.db'}"
        schema = _pg_schema_url(request.getfixturevalue("pg_admin"))
        url = next(schema)
        request.addfinalizer(lambda: next(schema, None))
        return url

    return make


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI a skipped test is a failure: a skip there means a missing install, not a choice.

    Locally, tests that need PostgreSQL, promtool, kubectl or NIXL skip with the reason and the
    command that installs what is missing (`scripts/setup-test-env` installs all of it).
    """
    if os.environ.get("CI", "").lower() not in ("true", "1") or exitstatus != 0:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped:
        reporter.write_line(f"CI: {len(skipped)} test(s) skipped; in CI every test must run:", red=True)
        for report in skipped[:20]:
            reporter.write_line(f"  {report.nodeid}: {report.longrepr[-1] if report.longrepr else ''}")
        session.exitstatus = 1


@pytest.fixture
def store(db_url: str) -> Iterator[Any]:
    """An empty `railtrace.store.Store` with its schema migrated, on each database of `db_url`
    (a test module may define its own `store`, which takes precedence there)."""
    from railtrace.store import Store, make_engine, migrate

    engine = make_engine(db_url)
    migrate(engine)
    yield Store(engine)
    engine.dispose()
