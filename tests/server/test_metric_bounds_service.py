"""Through the real path (OTLP/HTTP, store, assembly in a thread or in a child process,
`/metrics`): requests that each name their own model, pods and nodes leave `/metrics` bounded,
every request is still counted, and `metrics_token` guards `/metrics` when set."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from railtrace.server.runner import Service
from tests.service_helpers import flood_export, metric_sum, post, settings_for, wait_for

REQUESTS = 240


def series(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    }


@pytest.mark.parametrize("processes", [0, 1])
def test_distinct_labels_per_request_stay_bounded_and_add_up(tmp_path: Path, processes: int) -> None:
    settings = settings_for(
        f"sqlite:///{tmp_path / 'railtrace.db'}",
        assembly_processes=processes,
        metrics_label_values=8,
        metrics_max_series=30,
        metrics_models=["flood-model-200"],
    )
    with Service(settings) as svc:
        empty = httpx.get(svc.http_url + "/metrics").text
        for first in range(0, REQUESTS, 40):
            post(svc, flood_export(first, 40))
        wait_for(
            lambda: metric_sum(svc, "llm_d_tracing_requests_total") == REQUESTS,
            timeout=120,
            what="all counted",
        )
        text = httpx.get(svc.http_url + "/metrics").text
    requests = series(text, "llm_d_tracing_requests_total")
    models = {dict(k)["model"] for k in requests}
    assert "other" in models and "flood-model-200" in models  # listed: its own series though late
    assert len(models) <= 8 + 2
    assert sum(requests.values()) == REQUESTS
    pairings = series(text, "llm_d_tracing_pairings_total")
    assert sum(pairings.values()) == REQUESTS and len(pairings) <= 30 + 1
    # Every family together: what the empty service showed plus a bounded number per family.
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert len(lines) < len([ln for ln in empty.splitlines() if ln and not ln.startswith("#")]) + 200
    assert len(text.encode()) < 64 * 1024


def test_metrics_token(tmp_path: Path) -> None:
    settings = settings_for(f"sqlite:///{tmp_path / 'railtrace.db'}", metrics_token="scrape-secret")
    with Service(settings) as svc:
        assert httpx.get(svc.http_url + "/metrics").status_code == 401
        wrong = httpx.get(svc.http_url + "/metrics", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"].startswith("Bearer")
        ok = httpx.get(svc.http_url + "/metrics", headers={"authorization": "Bearer scrape-secret"})
        assert ok.status_code == 200 and "llm_d_tracing_requests_total" in ok.text
        assert httpx.get(svc.http_url + "/healthz").status_code == 200  # probes stay open
        assert httpx.get(svc.http_url + "/api/v1/requests").status_code == 200  # no API token set


def test_metrics_open_by_default(tmp_path: Path) -> None:
    with Service(settings_for(f"sqlite:///{tmp_path / 'railtrace.db'}")) as svc:
        assert httpx.get(svc.http_url + "/metrics").status_code == 200
