"""The overview says how much of the traffic is traced: a share below 1 in words above the
figures and in its tile, an unknown share as unknown (Chromium through Playwright)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from railtrace.server.runner import Service
from tests.server.test_sampling import _traces
from tests.service_helpers import settings_for
from tests.ui.ui_helpers import Page


def _tile(page: Any, label: str) -> str:
    return page.locator(".tile", has_text=label).first.inner_text().split("\n")[-1]


def test_unknown_share_is_shown_as_unknown(page: Page) -> None:
    pg = page.open("/")
    assert _tile(pg, "traced share") == "unknown"
    assert "Traced share of traffic: unknown" in pg.locator("p.sampling").inner_text()
    assert page.errors == []


def test_a_sampled_share_is_labelled(browser: Any, tmp_path: Path) -> None:
    with Service(settings_for(f"sqlite:///{tmp_path / 'rt.db'}", max_trace_wait_s=0.5)) as svc:
        exporter = OTLPSpanExporter(endpoint=svc.http_url + "/v1/traces")
        try:
            assert exporter.export(_traces("ot=th:c", 4, 0)) == SpanExportResult.SUCCESS
        finally:
            exporter.shutdown()
        p = Page(browser, svc.http_url)
        try:
            pg = p.open("/")
            assert _tile(pg, "traced share") == "25.0%"
            note = pg.locator("p.sampling.warn")
            assert note.get_attribute("data-share") == "0.25"
            assert "about 25.0% of the requests served" in note.inner_text()
            assert "sampling thresholds in tracestate" in note.inner_text()
            assert p.errors == []
        finally:
            p.close()
