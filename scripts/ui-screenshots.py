#!/usr/bin/env python3
"""Screenshots of every web UI page for docs/ui.md, against a store the demo's simulator fills.

    .venv/bin/python scripts/ui-screenshots.py [--out docs/ui]

Needs Playwright and Debian's chromium (scripts/setup-test-env installs both).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from railtrace.demo import run_demo
from railtrace.server.runner import Service
from railtrace.settings import Settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/ui"))
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RAILTRACE_ASSEMBLY_PROCESSES", "0")
    with tempfile.TemporaryDirectory(prefix="railtrace-shots-") as tmp:
        work = Path(tmp)
        run_demo(requests=60, seed=5, scenario_names=[], workdir=work, print_report=False, quiet_period_s=0.5)
        settings = Settings(
            db=f"sqlite:///{work / 'railtrace.db'}",
            topology=[str(work / "topology")],
            host="127.0.0.1",
            port=0,
            grpc_port=0,
        )
        with Service(settings) as svc, sync_playwright() as p:
            import httpx

            def first(flag: str) -> str:
                r = httpx.get(f"{svc.http_url}/api/v1/requests", params={"flag": flag, "limit": 1})
                return r.json()["items"][0]["trace_id"]

            pages = {
                "overview": "/",
                "requests": "/requests?flag=cross_rail",
                "request-tcp-fallback": f"/requests/{first('tcp_fallback')}",
                "request-cross-rail": f"/requests/{first('cross_rail')}",
                "request-waterfall": f"/requests/{first('kv_transfer_failed')}",
                "topology": "/topology?window=3h",
                "contract": "/contract",
            }
            narrow = ("overview", "request-tcp-fallback", "topology")
            browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
            for width, height, suffix in ((1440, 900, ""), (390, 800, "-narrow")):
                page = browser.new_page(viewport={"width": width, "height": height})
                for name, path in pages.items():
                    if suffix and name not in narrow:
                        continue
                    page.goto(svc.http_url + path)
                    page.wait_for_selector("main[aria-busy=false]")
                    shot = args.out / f"{name}{suffix}.png"
                    if name == "request-waterfall":
                        # The waterfall alone, its KV transfer span selected in the side panel.
                        page.click("#waterfall .wrow.flagged .sname")
                        page.locator("section:has(#waterfall)").screenshot(path=str(shot))
                    else:
                        # Long pages are cut at three screens: the top is what a person sees first.
                        full = page.evaluate("document.documentElement.scrollHeight")
                        clip = {"x": 0, "y": 0, "width": width, "height": min(full, 3 * height)}
                        page.screenshot(path=str(shot), full_page=True, clip=clip)
                    print(shot)
            browser.close()


if __name__ == "__main__":
    main()
