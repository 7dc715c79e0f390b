"""The web UI in a real browser (Chromium through Playwright) against a store the simulator filled."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.ui.ui_helpers import TOKEN, Page, first_with_flag

PAGES = [
    "/",
    "/?window=15m",
    "/?window=6h",
    "/?window=24h",
    "/requests",
    "/requests?range=1h",
    "/requests?range=custom&since=2020-01-01T00:00:00Z",
    "/topology",
    "/topology?window=3h",
    "/contract",
]


def _pages(api: httpx.Client) -> list[str]:
    """Every page kind, and every request page of the flags whose pages overflowed (their
    breakdown bands were laid end to end past the spans' time)."""
    tcp = first_with_flag(api, "tcp_fallback")["trace_id"]
    xr = first_with_flag(api, "cross_rail")["trace_id"]
    wide = [
        s["trace_id"]
        for flag in ("kv_transfer_failed", "broken_trace")
        for s in api.get("/api/v1/requests", params={"flag": flag, "limit": 200}).json()["items"]
    ]
    return [
        *PAGES,
        f"/requests/{tcp}",
        f"/requests/{xr}",
        "/requests?flag=cross_rail&order=ttft",
        *(f"/requests/{t}" for t in dict.fromkeys(wide)),
    ]


@pytest.mark.parametrize("width", [1440, 390])
def test_every_page_renders_without_console_errors(
    browser: Any, service: Any, api: httpx.Client, width: int
) -> None:
    p = Page(browser, service.http_url, width=width)
    try:
        for path in _pages(api):
            page = p.open(path)
            assert page.locator("main h1").count() == 1, path
            assert page.locator("main [role=alert]").count() == 0, (path, page.inner_text("main")[:500])
            # Usable: nothing pushes the page wider than the window (tables scroll inside their card).
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 1, (path, width, overflow)
        assert p.errors == []
    finally:
        p.close()


def test_the_overview_shows_the_fleet(page: Page, api: httpx.Client) -> None:
    pg = page.open("/")
    text = pg.inner_text("main")
    topo = api.get("/api/v1/topology").json()
    assert f"{len(topo['nodes'])} nodes in {len(topo['blocks'])} blocks" in text
    assert f"{len(topo['pods'])} pods" in text
    for part in ("By path class", "By pairing level", "Flags", "Ingest health", "Slowest prefill"):
        assert part in text
    # TTFT quantiles per path class, as the quantile endpoint computes them over the window.
    q = api.get("/api/v1/stats/ttft", params={"since": 0}).json()
    tcp = next(g for g in q["path_class"] if g["path_class"] == "tcp")
    row = pg.locator("section:has(h2:text('By path class')) tr", has_text="tcp").first.inner_text()
    assert f"{tcp['ttft_s_p50']:.2f} s" in row and f"{tcp['ttft_s_p99']:.2f} s" in row
    total = sum(g["requests"] for g in api.get("/api/v1/stats").json()["groups"])
    assert pg.locator(".tile").first.inner_text().split("\n")[-1] == str(total)
    # A flag's count links to the list of those requests.
    pg.locator("section:has(h2:text('Flags')) a", has_text="tcp_fallback").first.click()
    pg.wait_for_selector("main[aria-busy=false]")
    assert "flag=tcp_fallback" in pg.url
    assert page.errors == []


def test_a_tcp_fallback_request_shows_its_path_and_evidence(page: Page, api: httpx.Client) -> None:
    s = first_with_flag(api, "tcp_fallback")
    pg = page.open(f"/requests/{s['trace_id']}")
    path = pg.inner_text("#kv-path")
    assert "tcp/eth0" in path and "100% of bytes" in path
    assert s["prefill"]["gpu"] in path and s["decode"]["nic"] in path
    assert "Expected instead" in pg.inner_text(
        "main"
    ) and f"RDMA from {s['prefill']['nic']}" in pg.inner_text(".expected")
    flag = next(f for f in s["flags"] if f["name"] == "tcp_fallback")
    item = pg.locator("#flags li", has_text="tcp_fallback").first
    assert flag["evidence"][:60] in item.inner_text()
    # The evidence links to the span it names, which the waterfall opens and marks.
    item.locator("a.spanlink").click()
    row = pg.locator(f"#span-{flag['span_id']}")
    assert "target" in (row.get_attribute("class") or "")
    assert "llm_d.kv_transfer" in row.inner_text()
    # Its details, every attribute, are in the side panel.
    panel = pg.inner_text("#span-detail")
    assert flag["span_id"] in panel and "llm_d.kv_transfer.transport" in panel
    assert pg.locator("#waterfall .wrow").count() == s["span_count"] + 1  # + the axis row
    assert page.errors == []


def test_a_cross_rail_request_shows_lanes_with_their_share(page: Page, api: httpx.Client) -> None:
    s = first_with_flag(api, "cross_rail")
    pg = page.open(f"/requests/{s['trace_id']}")
    lanes = pg.locator("#kv-path .lane")
    assert lanes.count() == len(s["kv_transfer"]["devices"]) >= 2
    text = pg.inner_text("#kv-path")
    for device in s["kv_transfer"]["devices"]:
        assert device in text
    assert "% of bytes" in text and "not the paired NIC" in text
    assert pg.locator("#kv-path .lane.offrail").count() >= 1
    assert "Expected instead" in pg.inner_text("main")
    flag = next(f for f in s["flags"] if f["name"] == "cross_rail")
    assert flag["evidence"][:60] in pg.inner_text("#flags")
    assert page.errors == []


def test_a_stitched_request_shows_each_trace(page: Page, api: httpx.Client) -> None:
    items = api.get("/api/v1/requests", params={"flag": "broken_trace", "limit": 200}).json()["items"]
    stitched = [s for s in items if len(s["trace_ids"]) > 1]
    assert stitched, "the simulator made no request split over traces"
    s = stitched[0]
    pg = page.open(f"/requests/{s['trace_ids'][-1]}")  # opened by its second trace
    text = pg.inner_text("#waterfall").replace("\n", " ") + pg.inner_text("main")
    assert f"Stitched from {len(s['trace_ids'])} traces" in text
    for tid in s["trace_ids"]:
        assert tid in text
    assert page.errors == []


def test_filters_and_keyset_paging(page: Page, api: httpx.Client) -> None:
    pg = page.open("/requests")
    pg.select_option("select[name=flag]", "cross_rail")
    pg.fill("input[name=node]", "")
    pg.click("form.filters button[type=submit]")
    pg.wait_for_selector("main[aria-busy=false]")
    assert "flag=cross_rail" in pg.url
    rows = pg.locator("table.requests tbody tr")
    expected = api.get("/api/v1/requests", params={"flag": "cross_rail", "limit": 50}).json()["items"]
    assert rows.count() == len(expected) > 0
    for i in range(rows.count()):
        assert "cross_rail" in rows.nth(i).inner_text()
    # Paging: small pages, followed to the end, give every request once, newest first.
    pg = page.open("/requests?limit=7")
    seen: list[str] = []
    for _ in range(50):
        seen += pg.eval_on_selector_all("table.requests tbody tr", "rs => rs.map(r => r.dataset.trace)")
        nxt = pg.locator("#next-page")
        if nxt.count() == 0:
            break
        nxt.click()
        pg.wait_for_selector("main[aria-busy=false]")
    everything = api.get("/api/v1/requests", params={"limit": 1000}).json()["items"]
    assert seen == [s["trace_id"] for s in everything]
    assert pg.locator("#first-page").count() == 1
    assert page.errors == []


@pytest.mark.parametrize(("order", "column"), [("ttft", 3), ("kv_time", 4)])
def test_the_ttft_and_kv_time_orders_hold_across_pages(
    page: Page, api: httpx.Client, order: str, column: int
) -> None:
    """Chosen on the page, the order is the API's over the whole list: small pages, followed to
    the end, show every request that has the value once, slowest first."""
    pg = page.open("/requests?limit=7")
    pg.click(f"#order-{order}")
    pg.wait_for_selector("main[aria-busy=false]")
    assert f"order={order}" in pg.url and "limit=7" in pg.url
    assert "slowest" in pg.inner_text(".tabs") and "this page" not in pg.inner_text("main")
    seen: list[str] = []
    shown: list[str] = []
    for _ in range(100):
        seen += pg.eval_on_selector_all("table.requests tbody tr", "rs => rs.map(r => r.dataset.trace)")
        shown += pg.eval_on_selector_all(
            f"table.requests tbody tr td:nth-child({column})", "cs => cs.map(c => c.textContent)"
        )
        nxt = pg.locator("#next-page")
        if nxt.count() == 0:
            break
        nxt.click()
        pg.wait_for_selector("main[aria-busy=false]")
    everything = api.get("/api/v1/requests", params={"limit": 1000}).json()["items"]

    def value(s: dict[str, Any]) -> float | None:
        return s["ttft_s"] if order == "ttft" else (s["kv_transfer"] or {}).get("duration_s")

    ranked = sorted((s for s in everything if value(s) is not None), key=lambda s: (value(s), s["trace_id"]))
    assert seen == [s["trace_id"] for s in reversed(ranked)] and len(seen) > 7  # several pages
    assert "—" not in shown
    assert page.errors == []


def test_the_api_token_is_asked_for_once(browser: Any, service: Any) -> None:
    p = Page(browser, service.http_url, token=False)
    try:
        pg = p.open("/requests")
        assert pg.locator("input[type=password]").count() == 1
        assert pg.locator("table.requests").count() == 0  # nothing shown without the token
        pg.fill("input[type=password]", TOKEN)
        pg.click("form button[type=submit]")
        pg.wait_for_selector("table.requests")
        pg.goto(service.http_url + "/topology")
        pg.wait_for_selector("main[aria-busy=false]")
        assert "Contract audit per pod" in pg.inner_text("main")
        # The page shell holds no data; the data stays behind the token.
        assert httpx.get(service.http_url + "/api/v1/requests").status_code == 401
    finally:
        p.close()
    # 401 answers to the API are console errors by design before the token is entered.


def test_an_unknown_request_says_so(page: Page) -> None:
    pg = page.open("/requests/" + "0" * 32)
    assert "no request" in pg.inner_text("[role=alert]")
