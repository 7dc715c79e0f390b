"""Browser page wrapper and lookups shared by the UI tests."""

from __future__ import annotations

from typing import Any

import httpx

TOKEN = "ui-test-token"


def first_with_flag(api: httpx.Client, flag: str) -> dict[str, Any]:
    items = api.get("/api/v1/requests", params={"flag": flag, "limit": 1}).json()["items"]
    assert items, f"the simulator made no {flag} request"
    return items[0]


class Page:
    """A browser page that records console errors and uncaught exceptions."""

    def __init__(self, browser: Any, base: str, width: int = 1280, height: int = 800, token: bool = True):
        self.context = browser.new_context(viewport={"width": width, "height": height})
        if token:  # as if the user had entered the token once in this tab
            self.context.add_init_script(f"sessionStorage.setItem('railtrace.api_token', {TOKEN!r})")
        self.page = self.context.new_page()
        self.base = base
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, path: str) -> Any:
        self.page.goto(self.base + path)
        self.page.wait_for_selector("main[aria-busy=false]", timeout=15_000)
        return self.page

    def close(self) -> None:
        self.context.close()
