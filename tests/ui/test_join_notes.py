"""The request page shows what the join rules left out (`coverage.rejected`) as plain text:
the notes quote sender-chosen values (a forger's claimed pod name), which must never become
markup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tests.server.release_corpus as corpus
from railtrace.server.runner import Service
from tests.service_helpers import get_request, settings_for, wait_for
from tests.ui.ui_helpers import Page

HEAD = next(r for r in corpus.RELEASES if r.name == "HEAD")
FORGER = "10.99.99.99"
MARKUP = '<img src=x onerror="window.__forged=1">'


def test_rejected_kv_span_is_shown_as_text(browser: Any, tmp_path: Path) -> None:
    fleet = corpus.live_cluster(tmp_path / "cluster")
    settings = settings_for(
        f"sqlite:///{tmp_path / 'railtrace.db'}",
        topology=[str(tmp_path / "cluster")],
        trusted_proxies=["127.0.0.1/32"],
    )
    with Service(settings) as svc:
        url = corpus.Endpoints(svc.http_url, svc.grpc_endpoint)
        prefill = fleet.pods_of("topology-aware", "prefill")[0]
        decode = fleet.pods_of("topology-aware", "decode")[0]
        ids = corpus.emit(url, HEAD, "full", prefill, decode)
        victim = ids["traces"][0]
        wait_for(lambda: (b := get_request(svc, victim)) and len(b["trace_ids"]) == len(ids["traces"]))
        forger = corpus.Process(
            url,
            {**corpus.vllm_resource("vllm-decode"), "k8s.pod.name": MARKUP, "k8s.pod.ip": decode.ip},
            "railtrace.kv_transfer",
            FORGER,
        )
        forger.span(
            "llm_d.kv_transfer",
            61,
            900,
            {"llm_d.kv_transfer.request_id": ids["engine"], "llm_d.kv_transfer.transport": "tcp"},
        )
        forger.close()
        body = wait_for(
            lambda: (b := get_request(svc, victim)) and b["coverage"].get("rejected") and b,
            what="the forged KV span rejected",
        )
        assert MARKUP in " ".join(body["coverage"]["rejected"])
        p = Page(browser, svc.http_url)
        try:
            page = p.open(f"/requests/{victim}")
            notes = page.locator("#rejected li")
            assert notes.count() == len(body["coverage"]["rejected"])
            text = notes.first.inner_text()
            assert FORGER in text and MARKUP in text  # shown as the characters it is
            assert page.locator("main img").count() == 0
            assert page.evaluate("window.__forged === undefined")
            assert p.errors == []
        finally:
            p.close()
