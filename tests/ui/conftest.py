"""A railtrace service over a store the simulator filled (through the real shims, OTLP exporter,
assembly and verdicts), with an API token, and a real Chromium driven by Playwright.

Chromium is Debian's package (`/usr/bin/chromium`, installed by scripts/setup-test-env);
Playwright's own browser download is not used.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from railtrace.demo import run_demo
from railtrace.server.runner import Service
from railtrace.settings import Settings
from tests.ui.ui_helpers import TOKEN, Page

REQUESTS = 60
SEED = 5
CHROMIUM = os.environ.get("RAILTRACE_CHROMIUM", "/usr/bin/chromium")
# As tests/conftest.py (whose `pg_admin` fixture connects to it).
PG_URL = os.environ.get("RAILTRACE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _fill(work: Path, db: str | None = None) -> None:
    old = os.environ.get("RAILTRACE_ASSEMBLY_PROCESSES")
    os.environ["RAILTRACE_ASSEMBLY_PROCESSES"] = "0"
    try:
        report = run_demo(
            requests=REQUESTS,
            seed=SEED,
            scenario_names=[],
            workdir=work,
            db=db,
            print_report=False,
            quiet_period_s=0.5,
        )
    finally:
        if old is None:
            os.environ.pop("RAILTRACE_ASSEMBLY_PROCESSES", None)
        else:
            os.environ["RAILTRACE_ASSEMBLY_PROCESSES"] = old
    assert report["complete"], report


@pytest.fixture(scope="session")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite store and topology the demo's simulator filled (every scenario, every flag)."""
    work = tmp_path_factory.mktemp("ui-store")
    _fill(work)
    return work


@pytest.fixture(scope="session")
def service(filled: Path) -> Iterator[Service]:
    """`railtrace serve` on the filled store, loopback, free port, API token required."""
    settings = Settings(
        db=f"sqlite:///{filled / 'railtrace.db'}",
        topology=[str(filled / "topology")],
        host="127.0.0.1",
        port=0,
        grpc_port=0,
        api_token=TOKEN,
        assembly_processes=0,
    )
    with Service(settings) as svc:
        yield svc


@pytest.fixture(scope="session")
def api(service: Service) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service.http_url, headers={"authorization": f"Bearer {TOKEN}"}) as client:
        yield client


@pytest.fixture(scope="session")
def pg_api(tmp_path_factory: pytest.TempPathFactory, pg_admin: Any) -> Iterator[httpx.Client]:
    """The same, on a PostgreSQL schema of its own (dropped afterwards)."""
    schema = f"rt_ui_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    db = url.render_as_string(hide_password=False)
    try:
        work = tmp_path_factory.mktemp("ui-store-pg")
        _fill(work, db)
        settings = Settings(
            db=db,
            topology=[str(work / "topology")],
            host="127.0.0.1",
            port=0,
            grpc_port=0,
            api_token=TOKEN,
            assembly_processes=0,
        )
        with (
            Service(settings) as svc,
            httpx.Client(base_url=svc.http_url, headers={"authorization": f"Bearer {TOKEN}"}) as client,
        ):
            yield client
    finally:
        with pg_admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))


@pytest.fixture(params=["sqlite", "postgresql"])
def any_api(request: pytest.FixtureRequest) -> httpx.Client:
    """`api` on each database: the query API's answers must not depend on the store."""
    return request.getfixturevalue("api" if request.param == "sqlite" else "pg_api")


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.skip(f"no Chromium at {CHROMIUM}: run scripts/setup-test-env (installs Debian's chromium)")
    playwright = pytest.importorskip("playwright.sync_api", reason="pip install playwright (test extra)")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, service: Service) -> Iterator[Page]:
    p = Page(browser, service.http_url)
    yield p
    p.close()
