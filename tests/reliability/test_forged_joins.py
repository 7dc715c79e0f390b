"""A holder of the ingest token cannot change another request's verdict by reusing its ids.

Each test sends a real request as llm-d emits it (tests/server/release_corpus.py: the
official OpenTelemetry SDK and OTLP/HTTP exporter, each process forwarded for its pod's
address by a trusted proxy, the cluster's objects as topology), waits for its summary, then
attacks it from another sender address with the request's ids, and checks that the summary's
verdict, primary trace and stitching are unchanged and the evidence names what was rejected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

import tests.server.release_corpus as corpus
from railtrace.scheduling.grouping import MAX_KEY_FANOUT
from railtrace.server.runner import Service
from tests.service_helpers import get_request, settings_for, wait_for

ATTACKER = "10.66.6.6"
HEAD = next(r for r in corpus.RELEASES if r.name == "HEAD")
V0_9 = next(r for r in corpus.RELEASES if r.name == "v0.9.0")
VERDICT = ("flags", "kv_transfer", "ttft_s", "prefill", "decode", "trace_id", "trace_ids")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("cluster")
    return folder, corpus.live_cluster(folder)


def _victim(svc: Service, fleet: Any, rel: corpus.Release) -> tuple[dict[str, Any], dict[str, Any]]:
    prefill = fleet.pods_of("topology-aware", "prefill")[0]
    decode = fleet.pods_of("topology-aware", "decode")[0]
    ids = corpus.emit(_endpoints(svc), rel, "full", prefill, decode)

    def stitched() -> dict[str, Any] | None:
        body = get_request(svc, ids["traces"][0])
        return body if body and len(body["trace_ids"]) == len(ids["traces"]) else None

    before = wait_for(stitched, what="the victim's request assembled")
    assert before["flags"] == [] and before["kv_transfer"]["transport"] == "rdma", before
    return ids, before


def _endpoints(svc: Service) -> corpus.Endpoints:
    return corpus.Endpoints(svc.http_url, svc.grpc_endpoint)


def _attacker(svc: Service) -> corpus.Process:
    return corpus.Process(
        _endpoints(svc),
        {**corpus.vllm_resource("vllm-decode"), "vllm.process_kind": "worker"},
        "railtrace.kv_transfer",
        ATTACKER,
    )


def _rejected_once(svc: Service, trace_id: str, forged: str) -> dict[str, Any]:
    def noted() -> dict[str, Any] | None:
        body = get_request(svc, trace_id)
        rejected = " ".join((body or {}).get("coverage", {}).get("rejected", []))
        return body if forged in rejected or (forged == "" and rejected) else None

    return wait_for(noted, what="the forged candidate reported")


def _same_verdict(before: dict[str, Any], after: dict[str, Any]) -> None:
    for key in VERDICT:
        assert after[key] == before[key], (key, before[key], after[key])


def test_forged_kv_span_from_another_sender_changes_no_verdict(
    db_url: str, cluster: tuple[Path, Any]
) -> None:
    folder, fleet = cluster
    with Service(settings_for(db_url, topology=[str(folder)], trusted_proxies=["127.0.0.1/32"])) as svc:
        ids, before = _victim(svc, fleet, HEAD)
        attacker = _attacker(svc)
        forged = attacker.span(
            "llm_d.kv_transfer",
            61,
            900,
            {
                "llm_d.kv_transfer.request_id": ids["engine"],
                "llm_d.kv_transfer.transport": "tcp",
                "llm_d.kv_transfer.operation": "read",
            },
        )
        attacker.close()
        after = _rejected_once(svc, ids["traces"][0], format(forged.context.trace_id, "032x"))
        _same_verdict(before, after)
        assert "tcp_fallback" not in {f["name"] for f in after["flags"]}
        assert ATTACKER in " ".join(after["coverage"]["rejected"])


def test_forged_earlier_gateway_request_is_not_the_primary_trace(
    db_url: str, cluster: tuple[Path, Any]
) -> None:
    folder, fleet = cluster
    with Service(settings_for(db_url, topology=[str(folder)], trusted_proxies=["127.0.0.1/32"])) as svc:
        ids, before = _victim(svc, fleet, HEAD)
        attacker = corpus.Process(
            _endpoints(svc),
            {"service.name": "llm-d-router/epp"},
            "llm-d-router/pkg/epp/handlers",
            ATTACKER,
            grpc=True,  # the EPP exports OTLP/gRPC
        )
        forged = attacker.span(
            "gateway.request",
            -1000,
            5000,
            {"gen_ai.request.id": ids["epp_id"], "http.request.header.x-request-id": [ids["epp_id"]]},
            kind=trace.SpanKind.SERVER,
        )
        attacker.close()
        forged_trace = format(forged.context.trace_id, "032x")
        after = _rejected_once(svc, ids["traces"][0], forged_trace)
        _same_verdict(before, after)
        assert after["trace_id"] == ids["traces"][0] and forged_trace not in after["trace_ids"]
        # Found by its own ids, the request is still the victim's.
        assert get_request(svc, ids["epp_id"])["trace_id"] == ids["traces"][0]


def test_junk_traces_past_the_cap_keep_the_stitch_and_kv_verdict(
    db_url: str, cluster: tuple[Path, Any]
) -> None:
    folder, fleet = cluster
    with Service(settings_for(db_url, topology=[str(folder)], trusted_proxies=["127.0.0.1/32"])) as svc:
        ids, before = _victim(svc, fleet, V0_9)  # orphan engine traces: stitched by the ids
        assert len(before["trace_ids"]) > 1
        attacker = _attacker(svc)
        for i in range(MAX_KEY_FANOUT + 1):
            attacker.span(
                "junk",
                i,
                i + 1,
                {
                    "gen_ai.request.id": ids["public"],
                    "llm_d.pd_proxy.request_id": ids["sidecar_id"],
                    "llm_d.kv_transfer.request_id": ids["engine"],
                },
            )
        attacker.close()
        after = _rejected_once(svc, ids["traces"][0], "later traces carrying request id")
        _same_verdict(before, after)
        assert after["kv_transfer"]["transport"] == "rdma" and sorted(after["trace_ids"]) == sorted(
            before["trace_ids"]
        )
