"""The UI's time charts, waterfall, topology and error pages in a real browser (Chromium through
Playwright), each figure checked against the query API of the same store."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import httpx

from tests.ui.ui_helpers import Page, first_with_flag


def _titles(pg: Any, selector: str) -> list[str]:
    return pg.eval_on_selector_all(selector, "es => es.map(e => e.textContent)")


def test_the_overview_draws_the_window_over_time(page: Page, api: httpx.Client) -> None:
    pg = page.open("/?window=6h")
    for chart in ("#trend-requests", "#trend-flags", "#trend-ttft"):
        assert pg.locator(f"{chart} svg").count() == 1, chart
    # Each bar's title says its path class and count: they add up to the window's stats.
    drawn: Counter[str] = Counter()
    for title in _titles(pg, "#trend-requests rect title"):
        m = re.search(r" (\w+): ([\d,]+)$", title)
        assert m, title
        drawn[m.group(1)] += int(m.group(2).replace(",", ""))
    since = pg.evaluate("Math.floor(Date.now() / 1000) - 21600")
    stats = api.get("/api/v1/stats", params={"group_by": "path_class", "since": since}).json()["groups"]
    assert dict(drawn) == {g["path_class"]: g["requests"] for g in stats}
    flagged = {
        g["flag"]
        for g in api.get("/api/v1/stats", params={"group_by": "flag", "since": since}).json()["groups"]
    }
    legend = pg.inner_text("#trend-flags .legend")
    assert flagged and all(f in legend for f in flagged)
    assert "p50" in pg.inner_text("#trend-ttft") and pg.locator("#trend-ttft path.line").count() == 2
    assert page.errors == []


def test_the_list_has_a_range_a_total_a_scatter_and_newer_older_paging(page: Page, api: httpx.Client) -> None:
    pg = page.open("/requests?range=24h")
    everything = api.get("/api/v1/requests", params={"limit": 1000}).json()["items"]
    assert f"{len(everything)} requests match in last 24 h" in pg.inner_text("#totals")
    assert pg.locator("select[name=range] option:checked").inner_text() == "last 24 h"
    assert pg.locator("input[name=since]").is_disabled()
    # A flag filter's total is the flag's count.
    pg = page.open("/requests?flag=cross_rail&limit=5")
    n = sum(1 for s in everything if any(f["name"] == "cross_rail" for f in s["flags"]))
    assert pg.inner_text("#totals").startswith(f"{n} requests match")
    # The scatter: one point per shown request with a duration; a click opens it.
    pg = page.open("/requests?limit=20")
    rows = pg.eval_on_selector_all("table.requests tbody tr", "rs => rs.map(r => r.dataset.trace)")
    points = pg.locator("#duration-chart a.point")
    assert points.count() == len([s for s in everything[:20] if (s["e2e_s"] or s["ttft_s"]) is not None]) > 0
    href = points.first.get_attribute("href")
    assert href and href.split("/")[-1] in rows
    points.first.locator("circle").click(force=True)
    pg.wait_for_selector("main[aria-busy=false]")
    assert pg.url.endswith(href) and pg.inner_text("main h1").startswith("Request")
    # Older, older, then newer comes back to the second page.
    pg = page.open("/requests?limit=7")
    first = pg.eval_on_selector_all("table.requests tbody tr", "rs => rs.map(r => r.dataset.trace)")
    assert pg.locator("#prev-page").count() == 0
    pg.click("#next-page")
    pg.wait_for_selector("main[aria-busy=false]")
    second = pg.eval_on_selector_all("table.requests tbody tr", "rs => rs.map(r => r.dataset.trace)")
    pg.click("#next-page")
    pg.wait_for_selector("main[aria-busy=false]")
    pg.click("#prev-page")
    pg.wait_for_selector("main[aria-busy=false]")
    assert pg.eval_on_selector_all("table.requests tbody tr", "rs => rs.map(r => r.dataset.trace)") == second
    pg.click("#prev-page")
    pg.wait_for_selector("main[aria-busy=false]")
    assert pg.eval_on_selector_all("table.requests tbody tr", "rs => rs.map(r => r.dataset.trace)") == first
    assert [s["trace_id"] for s in everything[:14]] == first + second
    assert page.errors == []


def test_the_waterfall_has_a_ruler_durations_a_critical_path_and_a_side_panel(
    page: Page, api: httpx.Client
) -> None:
    s = first_with_flag(api, "kv_transfer_failed")
    spans = api.get(f"/api/v1/traces/{s['trace_id']}").json()["spans"]
    pg = page.open(f"/requests/{s['trace_id']}")
    assert pg.locator("#ruler .tick").count() >= 3
    rows = pg.locator("#waterfall .wrow:not(.axis)")
    assert rows.count() == len(spans) and pg.locator("#waterfall .wrow:not(.axis) .wdur").count() == len(
        spans
    )
    # Tree order: each span after its parent; roots and siblings by start time.
    by_id = {sp["span_id"]: sp for sp in spans}
    order = pg.eval_on_selector_all("#waterfall .wrow:not(.axis)", "rs => rs.map(r => r.id.slice(5))")
    seen: set[str] = set()
    for sid in order:
        parent = by_id[sid]["parent_span_id"]
        assert parent not in by_id or parent in seen, sid
        seen.add(sid)
    roots = [sid for sid in order if by_id[sid]["parent_span_id"] not in by_id]
    assert [by_id[r]["start_ns"] for r in roots] == sorted(by_id[r]["start_ns"] for r in roots)
    # The critical path holds the span that ends last.
    last = max(spans, key=lambda sp: sp["end_ns"])
    assert "critical" in (pg.get_attribute(f"#span-{last['span_id']}", "class") or "")
    # The breakdown bands stay inside their track.
    ends = pg.eval_on_selector_all(
        "#waterfall .stage", "es => es.map(e => parseFloat(e.style.left) + parseFloat(e.style.width))"
    )
    assert ends and max(ends) <= 100.01
    # A click shows every attribute of the span in the side panel.
    kv = next(sp for sp in spans if sp["role"] == "kv_transfer")
    pg.click(f"#span-{kv['span_id']} .sname")
    panel = pg.inner_text("#span-detail")
    assert kv["span_id"] in panel and all(k in panel for k in kv["attributes"])
    # Collapse the first root: its descendants are hidden; expand all shows them again.
    root = roots[0]

    def under(sid: str) -> bool:
        parent = by_id[sid]["parent_span_id"]
        return parent == root or (parent in by_id and under(parent))

    below = [sid for sid in order if under(sid)]
    assert below
    pg.click(f"#span-{root} button.toggle")
    assert all(pg.locator(f"#span-{sid}").is_hidden() for sid in below)
    pg.click("#expand-all")
    assert all(pg.locator(f"#span-{sid}").is_visible() for sid in below)
    assert page.errors == []


def test_topology_draws_rails_pairings_and_transfers(page: Page, api: httpx.Client) -> None:
    topo = api.get("/api/v1/topology").json()
    pg = page.open("/topology?window=3h")
    matrix = pg.locator("table.matrix tbody tr")
    assert matrix.count() == len(topo["nodes"])
    text = pg.inner_text("table.matrix")
    pairs = 0
    for node in topo["nodes"]:
        nics = {n["name"]: n for n in node["nics"]}
        row = pg.inner_text(f"[id='matrix-{node['name']}']")
        for p in node["pairings"]:
            for nic in p["nics"]:
                if nics[nic]["rail"]:
                    assert f"{p['gpu']} ↔ {nics[nic]['rdma_device'] or nic}" in row
                    pairs += 1
    assert pairs > 0 and "rail 0" in text
    since = pg.evaluate("Math.floor(Date.now() / 1000) - 10800")
    groups = api.get("/api/v1/stats/transfers", params={"since": since}).json()["groups"]
    assert pg.locator("#transfers path.edge").count() == len(groups) > 0
    classes = {g["path_class"] for g in groups}
    assert all(c in pg.inner_text("#transfers .legend") for c in classes)
    node = topo["nodes"][0]["name"]
    link = pg.locator(f"[id='matrix-{node}'] a", has_text="requests").first
    assert link.get_attribute("href") == f"/requests?node={node}"
    assert page.errors == []


def test_the_contract_audit_page_writes_its_reasons_out(page: Page, api: httpx.Client) -> None:
    contract = api.get("/api/v1/contract").json()
    pg = page.open("/contract")
    assert pg.locator("main h1").inner_text() == "Contract audit"
    for pod in contract["pods"]:
        row = pg.inner_text(f"[id='pod-{pod['name']}']")
        for ob in pod["obligations"].values():
            assert ob["summary"] in row  # on the page, not in a tooltip
    assert pg.locator("main [title]").count() == 0
    assert page.errors == []


def test_a_refused_filter_shows_the_servers_message(page: Page) -> None:
    pg = page.open("/requests?since=yesterday-ish")
    alert = pg.inner_text("[role=alert]")
    assert "since" in alert and "object Object" not in alert and "datetime" in alert
    assert pg.locator("main h1").count() == 1
    # The browser logs the 422 answer itself; nothing else.
    assert all("422" in e for e in page.errors)


def test_an_unknown_path_answers_an_html_not_found_page(page: Page, service: Any) -> None:
    r = httpx.get(service.http_url + "/no/such/page")
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    assert "<main" in r.text
    # The machine interfaces keep their JSON errors.
    r = httpx.get(service.http_url + "/jaeger/api/nope")
    assert r.status_code in (401, 404) and r.headers["content-type"].startswith("application/json")
    pg = page.open("/no/such/page")
    assert pg.inner_text("main h1") == "Not found" and "/no/such/page" in pg.inner_text("main")
    assert all("404" in e for e in page.errors)
