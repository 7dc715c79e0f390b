"""`railtrace demo` (serving until Ctrl-C is its default) ends with one URL, the fleet page; the
report's links open UI pages."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

from tests.ui.ui_helpers import Page

URL = re.compile(r"^http://127\.0\.0\.1:\d+/$")


def test_the_demo_prints_one_url_that_shows_the_fleet(browser: Any) -> None:
    env = {**os.environ, "RAILTRACE_ASSEMBLY_PROCESSES": "0"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "railtrace.cli", "demo", "--requests", "24"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 180
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            if URL.match(lines[-1]):
                break
        urls = [u for line in lines for u in re.findall(r"https?://\S+", line)]
        assert URL.match(lines[-1]), lines[-20:]
        base = lines[-1].rstrip("/")
        assert len(urls) > 1, "the report lists no worst requests"
        # Every other URL in the output is a request's UI page on the same service.
        for u in urls[:-1]:
            assert re.fullmatch(re.escape(base) + r"/(requests/[0-9a-f]{32}|)", u), u
        p = Page(browser, base, token=False)  # the demo runs without an API token
        try:
            pg = p.open("/")
            assert pg.locator("h1").inner_text() == "Fleet"
            assert re.search(r"\d+ nodes in \d+ blocks", pg.inner_text("main"))
            for u in urls[:-1][:3]:
                pg = p.open(u[len(base) :])
                assert pg.locator("#kv-path").count() == 1 and pg.locator("#flags li").count() >= 1
            assert p.errors == []
        finally:
            p.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
