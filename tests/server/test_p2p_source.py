"""P2P KV sources and speculative warm-up prefills, end to end through `railtrace serve`.

Router HEAD's sidecar with `x-kv-cache-source-host-port` and no prefill target has decode
pull the cached prefix from a third pod (`llm_d.pd_proxy.kv_cache_source`); with
`x-speculative-prefill` it sends one more single-token request after the response. The
spans (tests/server/release_corpus.py `emit_p2p`) go through the official OpenTelemetry
SDK and OTLP exporters into a running service on both stores; the topology is the live
cluster's objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from railtrace.server.runner import Service
from railtrace.simulator.fleet import Pod
from tests.server.release_corpus import Endpoints, emit_p2p, live_cluster
from tests.service_helpers import settings_for, wait_for


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("cluster")
    return folder, live_cluster(folder, ("topology-aware", "cross-rail"))


def _rail(pod: Pod) -> int:
    return pod.nics[0].rail


def _pods(fleet: Any) -> tuple[Pod, Pod, Pod]:
    """A decode pod, a prefill pod on its rail (judging against it would say same rail) and a
    P2P source on another rail and another node."""
    decode = fleet.pods_of("topology-aware", "decode")[0]
    pods = list(fleet.pods)
    prefill = next(p for p in pods if p is not decode and _rail(p) == _rail(decode))
    source = next(p for p in pods if _rail(p) != _rail(decode) and p.node.name != decode.node.name)
    return decode, prefill, source


def _summary(svc: Service, ids: dict[str, Any], spans: int) -> dict[str, Any]:
    first = ids["traces"][0]

    def assembled() -> dict[str, Any] | None:
        r = httpx.get(f"{svc.http_url}/api/v1/requests/{first}")
        body = r.json() if r.status_code == 200 else None
        ok = body and len(body["trace_ids"]) == len(ids["traces"]) and body["span_count"] >= spans
        return body if ok else None

    return wait_for(assembled, what="P2P request assembled")


def test_transfer_from_a_p2p_source_is_judged_against_the_source(
    db_url: str, fleet_dir: tuple[Path, Any]
) -> None:
    folder, fleet = fleet_dir
    decode, prefill, source = _pods(fleet)
    settings = settings_for(db_url, topology=[str(folder)], trusted_proxies=["127.0.0.1/32"])
    with Service(settings) as svc:
        ids = emit_p2p(Endpoints(svc.http_url, svc.grpc_endpoint), decode, source)
        summary = _summary(svc, ids, 9)
        kv = summary["kv_transfer"]
        assert kv["source"]["pod"] == source.name and kv["source"]["node"] == source.node.name
        assert kv["source"]["nic"] and kv["source"]["rail"]
        assert summary["decode"]["pod"] == decode.name and summary["decode"]["rail"]
        assert kv["source"]["rail"] != summary["decode"]["rail"]
        assert summary["prefill"]["pod"] is None  # no prefill target: no prefill leg
        assert kv["path_class"] == "rdma_cross_rail"
        (flag,) = [f for f in summary["flags"] if f["name"] == "cross_rail"]
        assert source.name in flag["evidence"] and prefill.name not in flag["evidence"]
        assert f"llm_d.pd_proxy.kv_cache_source={source.ip}:8000" in kv["evidence"]
        assert summary["coverage"]["kv_source"]["address"] == f"{source.ip}:8000"
        assert summary["identity"]["kv_source"] == "pd_address"
        assert summary["pairing_level"] not in (None, "same_host")
        groups = httpx.get(f"{svc.http_url}/api/v1/stats", params={"group_by": "pair"}).json()["groups"]
        pairs = [(g["prefill_node"], g["decode_node"], g["pairing_level"], g["requests"]) for g in groups]
        assert pairs == [(source.node.name, decode.node.name, summary["pairing_level"], 1)]
        listed = httpx.get(f"{svc.http_url}/api/v1/requests", params={"node": source.node.name}).json()[
            "items"
        ]
        assert [r["trace_id"] for r in listed] == [summary["trace_id"]]


def test_speculative_warmup_is_recorded_and_is_not_the_prefill(
    db_url: str, fleet_dir: tuple[Path, Any]
) -> None:
    folder, fleet = fleet_dir
    decode, _prefill, source = _pods(fleet)
    settings = settings_for(db_url, topology=[str(folder)], trusted_proxies=["127.0.0.1/32"])
    with Service(settings) as svc:
        # A vLLM service name without the role: only the request's shape tells the legs apart.
        ids = emit_p2p(
            Endpoints(svc.http_url, svc.grpc_endpoint), decode, source, speculative=True, vllm_service="vllm"
        )
        summary = _summary(svc, ids, 11)
        (note,) = summary["coverage"]["speculative_prefill"]
        assert ids["warmup_span"] in note and "one process" in note
        assert summary["prefill"]["pod"] is None and "prefill_engine" not in summary["coverage"]["hops"]
        assert "prefill" not in summary["breakdown_s"] and "prefill_queue" not in summary["breakdown_s"]
        assert summary["ttft_s"] == pytest.approx(0.002 + 0.343)
        assert summary["kv_transfer"]["source"]["pod"] == source.name
