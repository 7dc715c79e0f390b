"""The request page links to the trace in Grafana when a Grafana URL is configured (and not
otherwise), in a real Chromium over a real service."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from railtrace.server.runner import Service
from railtrace.settings import Settings
from tests.ui.ui_helpers import TOKEN, Page

GRAFANA = "https://grafana.example.test/sub"


def test_open_in_grafana(browser: Any, filled: Path, api: httpx.Client, page: Page) -> None:
    trace_id = api.get("/api/v1/requests", params={"limit": 1}).json()["items"][0]["trace_id"]
    page.open(f"/requests/{trace_id}")
    assert page.page.locator("text=Open in Grafana").count() == 0  # none configured
    settings = Settings(
        db=f"sqlite:///{filled / 'railtrace.db'}",
        topology=[str(filled / "topology")],
        host="127.0.0.1",
        port=0,
        grpc_port=0,
        api_token=TOKEN,
        assembly_processes=0,
        grafana_url=GRAFANA + "/",
        grafana_datasource_uid="rt-tempo",
    )
    with Service(settings) as svc:
        p = Page(browser, svc.http_url)
        try:
            link = p.open(f"/requests/{trace_id}").wait_for_selector("text=Open in Grafana")
            href = link.get_attribute("href")
        finally:
            p.close()
    url = urlsplit(href)
    assert f"{url.scheme}://{url.netloc}{url.path}" == GRAFANA + "/explore"
    left = json.loads(parse_qs(url.query)["left"][0])
    assert left["datasource"] == "rt-tempo"
    assert left["queries"] == [{"refId": "A", "queryType": "traceql", "query": trace_id}]
