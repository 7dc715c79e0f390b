"""llm-d's coordinator, end to end through `railtrace serve` on both stores.

The coordinator (llm-d-router `cmd/coordinator` at HEAD `ebab687927f5`) is untraced and sends
each phase back through the gateway: for an untraced client a request arrives as a prefill
phase and a decode phase, two traces that share only `x-request-id`
(tests/server/release_corpus.py `emit_coordinator`, docs/normalisation.md §10). The spans go
through the official OpenTelemetry SDK and OTLP exporters, each process forwarded for its
pod's address; the topology is the live cluster's objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from railtrace.server.runner import Service
from railtrace.simulator.fleet import Pod
from tests.server.release_corpus import Endpoints, emit_coordinator, live_cluster
from tests.service_helpers import settings_for, wait_for

FORGER = "10.66.66.66"  # an address no pod has


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("cluster")
    return folder, live_cluster(folder)


def _pods(fleet: Any) -> tuple[Pod, Pod]:
    return fleet.pods_of("topology-aware", "prefill")[0], fleet.pods_of("topology-aware", "decode")[0]


def _summary(svc: Service, trace_id: str, traces: int) -> dict[str, Any]:
    def assembled() -> dict[str, Any] | None:
        r = httpx.get(f"{svc.http_url}/api/v1/requests/{trace_id}")
        body = r.json() if r.status_code == 200 else None
        return body if body and len(body["trace_ids"]) == traces else None

    return wait_for(assembled, what=f"request of {traces} traces assembled")


def _service(db_url: str, folder: Path) -> Service:
    return Service(settings_for(db_url, topology=[str(folder)], trusted_proxies=["127.0.0.1/32"]))


def _assert_whole(summary: dict[str, Any], ids: dict[str, Any], prefill: Pod, decode: Pod) -> None:
    assert summary["trace_id"] == ids["prefill_trace"]
    assert sorted(summary["trace_ids"]) == sorted(ids["traces"])
    assert summary["prefill"]["pod"] == prefill.name and summary["prefill"]["node"] == prefill.node.name
    assert summary["decode"]["pod"] == decode.name and summary["decode"]["node"] == decode.node.name
    assert summary["prefill"]["rail"] and summary["decode"]["rail"]
    assert summary["pairing_level"] is not None
    kv = summary["kv_transfer"]
    assert kv["transport"] == "rdma" and kv["path_class"].startswith("rdma_")
    assert {"prefill_engine", "decode_engine", "kv_transfer", "epp"} <= set(summary["coverage"]["hops"])
    assert not summary["coverage"].get("unverified")
    assert "broken_trace" not in [f["name"] for f in summary["flags"]]


def test_coordinator_phases_are_one_request_with_both_legs(db_url: str, fleet_dir: tuple[Path, Any]) -> None:
    folder, fleet = fleet_dir
    prefill, decode = _pods(fleet)
    with _service(db_url, folder) as svc:
        ids = emit_coordinator(Endpoints(svc.http_url, svc.grpc_endpoint), prefill, decode)
        summary = _summary(svc, ids["prefill_trace"], 3)
        _assert_whole(summary, ids, prefill, decode)
        assert not summary["coverage"].get("rejected")
        assert "topology_blind_pairing" not in [f["name"] for f in summary["flags"]]
        assert summary["e2e_s"] > 3.0  # both phases, on the EPP's clock
        # One request: the decode phase's trace finds the same one, and the list holds one.
        by_decode = httpx.get(f"{svc.http_url}/api/v1/requests/{ids['decode_trace']}").json()
        assert by_decode["trace_id"] == summary["trace_id"]
        items = httpx.get(f"{svc.http_url}/api/v1/requests").json()["items"]
        assert [r["trace_id"] for r in items] == [summary["trace_id"]]


def test_pairing_is_judged_from_both_phases_picks(db_url: str, fleet_dir: tuple[Path, Any]) -> None:
    """The prefill phase's pick placed prefill in one block; the decode phase's pick passed a
    decode pod of that block over for one in another block at the same score."""
    folder, fleet = fleet_dir
    prefill, near = _pods(fleet)
    far = next(
        p for p in fleet.pods_of("topology-aware", "decode") if p.ip.split(".")[1] != prefill.ip.split(".")[1]
    )
    with _service(db_url, folder) as svc:
        url = Endpoints(svc.http_url, svc.grpc_endpoint)
        ids = emit_coordinator(url, prefill, far, decode_candidates=[near, far])
        summary = _summary(svc, ids["prefill_trace"], 3)
        _assert_whole(summary, ids, prefill, far)
        (flag,) = [f for f in summary["flags"] if f["name"] == "topology_blind_pairing"]
        assert f"{far.name}-rank-0" in flag["evidence"] and f"{near.name}-rank-0" in flag["evidence"]
        assert prefill.node.name in flag["evidence"]


def test_a_decode_phase_from_another_sender_stays_out(db_url: str, fleet_dir: tuple[Path, Any]) -> None:
    folder, fleet = fleet_dir
    prefill, decode = _pods(fleet)
    with _service(db_url, folder) as svc:
        url = Endpoints(svc.http_url, svc.grpc_endpoint)
        ids = emit_coordinator(url, prefill, decode)
        forged = emit_coordinator(
            url,
            prefill,
            decode,
            rid=ids["epp_id"],
            phases=("decode",),
            start_ms=60,
            decode_sender=FORGER,
            kv=False,
        )
        summary = _summary(svc, ids["prefill_trace"], 3)
        _assert_whole(summary, ids, prefill, decode)
        assert forged["decode_trace"] not in summary["trace_ids"]
        rejected = summary["coverage"]["rejected"]
        assert any(forged["decode_trace"] in note and "decode phase" in note for note in rejected)
        # The forged phase is a request of its own, placed on no pod and with no KV hop.
        other = _summary(svc, forged["decode_trace"], 1)
        assert other["decode"]["pod"] is None and other["kv_transfer"] is None
        assert other["prefill"]["pod"] is None


def test_a_decode_phase_arriving_minutes_later_joins(db_url: str, fleet_dir: tuple[Path, Any]) -> None:
    """The prefill phase is stored as a request of its own first; the decode phase, three
    minutes later by its spans' clock and sent after that request was stored, joins it."""
    folder, fleet = fleet_dir
    prefill, decode = _pods(fleet)
    with _service(db_url, folder) as svc:
        url = Endpoints(svc.http_url, svc.grpc_endpoint)
        first = emit_coordinator(url, prefill, decode, phases=("prefill",))
        alone = _summary(svc, first["prefill_trace"], 1)
        assert alone["decode"]["pod"] is None
        later = emit_coordinator(
            url, prefill, decode, rid=first["epp_id"], phases=("decode",), start_ms=180_000
        )
        summary = _summary(svc, first["prefill_trace"], 3)
        _assert_whole(summary, {**first, "traces": first["traces"] + later["traces"]}, prefill, decode)
        assert summary["e2e_s"] > 180.0
        items = httpx.get(f"{svc.http_url}/api/v1/requests").json()["items"]
        assert [r["trace_id"] for r in items] == [first["prefill_trace"]]
