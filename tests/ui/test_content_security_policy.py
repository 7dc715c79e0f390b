"""The web UI works under the Content-Security-Policy the service sends: every page renders in
a real browser with no policy violation reported and no console error."""

from __future__ import annotations

from typing import Any

import httpx

from railtrace.server.security import CONTENT_SECURITY_POLICY
from tests.ui.ui_helpers import Page, first_with_flag

# Recorded by the page itself: each violation the browser reports for the document.
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) =>
  window.__cspViolations.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`));
"""


def test_pages_run_under_the_policy(browser: Any, service: Any, api: httpx.Client) -> None:
    request = first_with_flag(api, "tcp_fallback")["trace_id"]
    p = Page(browser, service.http_url)
    p.context.add_init_script(RECORD_VIOLATIONS)
    try:
        for path in ("/", "/requests", "/topology", f"/requests/{request}", "/requests?flag=cross_rail"):
            response = p.page.goto(service.http_url + path)
            assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            p.page.wait_for_selector("main[aria-busy=false]", timeout=15_000)
            assert p.page.locator("main h1").count() == 1, path
            assert p.page.evaluate("window.__cspViolations") == [], path
        assert p.errors == []
        # The check can see a violation: an inline script is what the policy forbids.
        p.page.evaluate(
            "() => { const s = document.createElement('script'); s.textContent = '1';"
            " document.body.append(s); }"
        )
        p.page.wait_for_function("window.__cspViolations.length > 0", timeout=5_000)
        assert "script-src" in p.page.evaluate("window.__cspViolations")[0]
        assert any("Content Security Policy" in e for e in p.errors)  # and the console says so
    finally:
        p.close()
