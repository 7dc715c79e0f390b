"""Each llm-d release end to end, with only what its code emits.

For router v0.8.0, v0.9.0, v0.10.0 and HEAD, in the full P/D recipe and llm-d's shipped
decode-only recipe, spans named and attributed as that release's code does (llm-d-router at
the tag; vLLM's `llm_request`; docs/normalisation.md cites file and commit per name) are sent
through the official OpenTelemetry SDK and OTLP/HTTP exporter into a running service. vLLM's
resource carries no `k8s.*` (vLLM sets only `service.name`, `vllm.instrumenting_module_name`,
`vllm.process_id`), the sidecar none either; each process exports through a collector that
forwards for it (`X-Forwarded-For`, a trusted proxy). The topology is the cluster's Nodes,
Pods (status.podIP), ResourceSlices and ResourceClaims as `kubectl get -o yaml` gives them.

Checked per release and recipe: TTFT, no flag at all, both legs resolved to node, GPU and NIC
wherever the spans allow (by which evidence), the tracing coverage, and the request found by
every id an operator may hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from railtrace.server.runner import Service
from tests.server.release_corpus import RECIPES, RELEASES, Endpoints, Release, emit, live_cluster
from tests.service_helpers import settings_for, wait_for


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("cluster")
    return folder, live_cluster(folder)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("rel", RELEASES, ids=[r.name for r in RELEASES])
def test_release_end_to_end(db_url: str, fleet_dir: tuple[Path, Any], rel: Release, recipe: str) -> None:
    folder, fleet = fleet_dir
    prefill = fleet.pods_of("topology-aware", "prefill")[0]
    decode = fleet.pods_of("topology-aware", "decode")[0]
    settings = settings_for(db_url, topology=[str(folder)], trusted_proxies=["127.0.0.1/32"])
    with Service(settings) as svc:
        ids = emit(Endpoints(svc.http_url, svc.grpc_endpoint), rel, recipe, prefill, decode)
        first = ids["traces"][0]

        def assembled() -> dict[str, Any] | None:
            r = httpx.get(f"{svc.http_url}/api/v1/requests/{first}")
            body = r.json() if r.status_code == 200 else None
            want = 5 if recipe == "full" else 1
            return (
                body
                if body and len(body["trace_ids"]) == len(ids["traces"]) and body["span_count"] >= want
                else None
            )

        summary = wait_for(assembled, what=f"{rel.name} {recipe} assembled")
        assert summary["flags"] == [], summary["flags"]
        if recipe == "full":
            assert summary["ttft_s"] == pytest.approx(0.002 + 0.050 + 0.343)
            assert summary["coverage"]["recipe"] == "full"
            legs = (("prefill", prefill), ("decode", decode))
            assert summary["resolved"] is True
        else:
            assert summary["ttft_s"] == pytest.approx(0.343)  # the decode engine's own: nothing else traced
            assert summary["coverage"]["recipe"] == "decode_only"
            legs = (("decode", decode),)
        for leg, pod in legs:
            got = summary[leg]
            assert (got["pod"], got["node"]) == (pod.name, pod.node.name), (leg, got)
            assert got["gpu"] and got["nic"], (leg, got)
            assert summary["identity"][leg] == "otlp_peer"
        forms = [*ids["traces"], ids["epp_id"], ids["public"], ids["engine"], f"cmpl-{ids['epp_id']}-0"]
        if recipe == "full":
            forms.append(ids["sidecar_id"])
        for ident in forms:
            r = httpx.get(f"{svc.http_url}/api/v1/requests/{ident}")
            assert r.status_code == 200 and r.json()["trace_id"] == summary["trace_id"], ident
        listed = httpx.get(f"{svc.http_url}/api/v1/requests").json()["items"]
        assert [r["trace_id"] for r in listed] == [summary["trace_id"]]  # the BBR's span is no request
        groups = httpx.get(f"{svc.http_url}/api/v1/stats", params={"group_by": "coverage"}).json()["groups"]
        resolution = "otlp_peer+otlp_peer" if recipe == "full" else "unresolved"
        assert [(g["recipe"], g["resolution"], g["requests"]) for g in groups] == [(recipe, resolution, 1)]
        series = f'llm_d_tracing_leg_resolution_total{{recipe="{recipe}",resolution="{resolution}"}} 1.0'
        # Assembly children report their counts every few milliseconds after the summary is stored.
        wait_for(lambda: series in httpx.get(f"{svc.http_url}/metrics").text.splitlines(), what=series)


POST_V010 = next(r for r in RELEASES if r.name == "post-v0.10.0")


def _client_span(svc: Service) -> tuple[Any, Any]:
    """A load generator's own span, exported like any OTel client, that holds several requests."""
    provider = TracerProvider(resource=Resource.create({"service.name": "loadgen"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=svc.http_url + "/v1/traces")))
    span = provider.get_tracer("loadgen").start_span("benchmark run", kind=trace.SpanKind.CLIENT)
    return provider, span


@pytest.mark.parametrize("root", ["request", "epp_request_from_a_future_release"])
def test_two_requests_under_one_client_span_keep_their_epp_hop(
    db_url: str, fleet_dir: tuple[Path, Any], root: str
) -> None:
    """Router main after v0.10.0 names its roots `request` / `request_orchestration`; a load
    generator's span holding two requests puts two EPP roots in one trace. Each request keeps
    its picks and its scheduling stage -- also under a root name no table row knows."""
    folder, fleet = fleet_dir
    prefills = fleet.pods_of("topology-aware", "prefill")[:2]
    decodes = fleet.pods_of("topology-aware", "decode")[:2]
    settings = settings_for(db_url, topology=[str(folder)], trusted_proxies=["127.0.0.1/32"])
    with Service(settings) as svc:
        provider, client = _client_span(svc)
        to = Endpoints(svc.http_url, svc.grpc_endpoint)
        sent = [
            emit(to, POST_V010, "full", p, d, client=client, root=root)
            for p, d in zip(prefills, decodes, strict=True)
        ]
        client.end()
        provider.shutdown()
        trace_id = format(client.context.trace_id, "032x")

        def both() -> list[dict[str, Any]] | None:
            items = httpx.get(f"{svc.http_url}/api/v1/requests").json()["items"]
            done = [i for i in items if i["trace_id"] == trace_id and i["span_count"] >= 5]
            return done if len(done) == 2 else None

        listed = wait_for(both, what="two requests of one client trace")
        by_decode = {}
        for item in listed:
            summary = httpx.get(f"{svc.http_url}/api/v1/requests/{item['request_id']}").json()
            by_decode[summary["decode"]["pod"]] = summary
        assert sorted(by_decode) == sorted(d.name for d in decodes)
        for ids, prefill, decode in zip(sent, prefills, decodes, strict=True):
            summary = by_decode[decode.name]
            assert summary["prefill"]["pod"] == prefill.name
            assert "epp" not in summary["coverage"]["missing"], summary["coverage"]
            assert summary["breakdown_s"]["scheduling"] > 0
            assert summary["flags"] == []
            spans = httpx.get(f"{svc.http_url}/api/v1/traces/{summary['trace_id']}").json()
            assert spans, ids


def test_a_tie_among_top_candidates_is_not_the_pick(db_url: str, fleet_dir: tuple[Path, Any]) -> None:
    """`top_endpoints` is recorded before the picker runs and ranks ties by id; the max-score
    picker shuffles ties, so the decode pod it dispatched to may be second. With vLLM's tracing
    off, the legs come from what was dispatched: the sidecar's prefill target and its own pod."""
    folder, fleet = fleet_dir
    prefill = fleet.pods_of("topology-aware", "prefill")[0]
    decode, other = fleet.pods_of("topology-aware", "decode")[:2]
    ranked = sorted([f"llm-d/{decode.name}-rank-0", f"llm-d/{other.name}-rank-0"])
    if ranked[0].endswith(f"{decode.name}-rank-0"):
        decode, other = other, decode  # the dispatched pod must not come first
    settings = settings_for(db_url, topology=[str(folder)], trusted_proxies=["127.0.0.1/32"])
    with Service(settings) as svc:
        ids = emit(
            Endpoints(svc.http_url, svc.grpc_endpoint),
            POST_V010,
            "no_engines",
            prefill,
            decode,
            top_endpoints=ranked,
        )

        def assembled() -> dict[str, Any] | None:
            r = httpx.get(f"{svc.http_url}/api/v1/requests/{ids['traces'][0]}")
            return r.json() if r.status_code == 200 and r.json()["span_count"] >= 4 else None

        summary = wait_for(assembled, what="EPP and sidecar spans assembled")
        assert summary["decode"]["pod"] == decode.name != other.name, summary["identity"]
        assert summary["identity"]["decode"] != "epp_pick"
        assert summary["prefill"]["pod"] == prefill.name
