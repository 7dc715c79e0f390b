"""A railtrace service over a store the simulator filled (through the real shims, OTLP exporter,
assembly and verdicts), with an API token, and a real Chromium driven by Playwright.

Chromium is Debian's package (`/usr/bin/chromium`, installed by scripts/setup-test-env);
Playwright's own browser download is not used.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ui_helpers import TOKEN, Page

from railtrace.demo import run_demo
from railtrace.server.runner import Service
from railtrace.settings import Settings

REQUESTS = 60
SEED = 5
CHROMIUM = os.environ.get("RAILTRACE_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="session")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite store and topology the demo's simulator filled (every scenario, every flag)."""
    work = tmp_path_factory.mktemp("ui-store")
    old = os.environ.get("RAILTRACE_ASSEMBLY_PROCESSES")
    os.environ["RAILTRACE_ASSEMBLY_PROCESSES"] = "0"
    try:
        report = run_demo(
            requests=REQUESTS,
            seed=SEED,
            scenario_names=[],
            workdir=work,
            print_report=False,
            quiet_period_s=0.5,
        )
    finally:
        if old is None:
            os.environ.pop("RAILTRACE_ASSEMBLY_PROCESSES", None)
        else:
            os.environ["RAILTRACE_ASSEMBLY_PROCESSES"] = old
    assert report["complete"], report
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
