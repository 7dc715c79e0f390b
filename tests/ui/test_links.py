"""Every railtrace link in the dashboards, the datasource provisioning and the alerts' annotations
opens a page of the web UI (not a JSON document), and the service answers it with the UI."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from dashboards import build

GENERATED = Path(build.GENERATED)
UI_PATH = re.compile(r"^/(requests(/[^/?]+)?|topology)?(\?.*)?$")
BASE = "https://railtrace.example"


def _strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for v in node.values() for s in _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [node] if isinstance(node, str) else []


def _railtrace_links() -> list[str]:
    """Paths (after railtrace's base URL) of every link the generated files make to railtrace."""
    links = []
    for path in GENERATED.glob("*.json"):
        for s in _strings(json.loads(path.read_text())):
            if s.startswith("${railtrace_url}"):
                links.append(s.removeprefix("${railtrace_url}"))
    for s in _strings(yaml.safe_load((GENERATED / build.DATASOURCES).read_text())):
        if s.startswith("${RAILTRACE_URL}/"):
            links.append(s.removeprefix("${RAILTRACE_URL}"))
    rule = yaml.safe_load(build.render_prometheus_rule(railtrace_url=BASE))
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            if "alert" in r:
                assert r["annotations"]["railtrace_url"].startswith(BASE + "/"), r["alert"]
                links.append(r["annotations"]["railtrace_url"].removeprefix(BASE))
    return links


def test_every_railtrace_link_is_a_ui_page() -> None:
    links = _railtrace_links()
    assert len(links) >= 15  # dashboards' data links, exemplar link, one per alert
    for link in links:
        assert UI_PATH.match(link), f"{link} is not a page of railtrace's web UI"


def test_the_service_answers_each_link_with_the_ui(service: Any, api: httpx.Client) -> None:
    trace_id = api.get("/api/v1/requests", params={"limit": 1}).json()["items"][0]["trace_id"]
    for link in _railtrace_links():
        # Grafana's variables as Grafana fills them in.
        path = (
            link.replace("$${__value.raw}", trace_id)
            .replace("${__value.raw}", trace_id)
            .replace("${__field.labels.flag}", "tcp_fallback")
            .replace("${__field.labels.cause}", "tcp_fallback")
            .replace("${__field.labels.path_class}", "tcp")
        )
        assert "$" not in path, path
        resp = httpx.get(service.http_url + path)  # no token: the page itself holds no data
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html"), path
        assert '<script type="module" src="/ui/static/app.js">' in resp.text
        assert urlsplit(path).path in ("/", "/requests", "/topology") or path.startswith("/requests/")


def test_runbooks_point_at_ui_pages() -> None:
    """Runbooks name the UI page to open next to their API commands."""
    found = 0
    for path in sorted((Path(build.__file__).resolve().parents[1] / "docs" / "runbooks").glob("*.md")):
        for link in re.findall(r"\$RAILTRACE(/[^\s`'\"]*)", path.read_text()):
            if link.startswith(("/api/", "/readyz", "/healthz", "/metrics", "/v1/")):
                continue
            found += 1
            assert UI_PATH.match(link.replace("<trace_id>", "0" * 32)), (path.name, link)
    assert found >= 7
