"""Incidents through a running `railtrace serve` on both stores: the demo's simulator drives the
real shims and the official OTLP exporter into the service, and the test reads
`GET /api/v1/incidents` against the faults it injected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from railtrace.demo import run_demo


@pytest.fixture
def run(db_url: str, tmp_path: Path) -> dict[str, Any]:
    return run_demo(
        requests=160,
        seed=3,
        scenario_names=["topology-aware", "tcp-fallback", "dra-aligned", "cross-rail"],
        workdir=tmp_path,
        db=db_url,
        print_report=False,
        include_requests=True,
    )


def test_incidents_name_the_broken_part(run: dict[str, Any]) -> None:
    items = run["incidents"]["items"]
    detail = {r["trace_id"]: r for r in run["requests_detail"] if r["trace_id"]}
    in_incident = {t for i in items for t in i["trace_ids"]}
    # Healthy requests belong to no incident.
    healthy = {t for t, r in detail.items() if not r["flags"]}
    assert healthy and not healthy & in_incident
    # A TCP fallback on one pod's NIC: one incident scoped to that NIC (and pod, and node),
    # holding exactly the requests that fell back through it.
    tcp = [i for i in items if i["cause"] == "tcp_fallback" and i["scope"]["kind"] != "request"]
    assert tcp
    for inc in tcp:
        scope = inc["scope"]
        assert (
            scope["kind"] == "nic" and len(scope["pods"]) == 1 and scope["pods"][0].startswith("tcp-decode")
        )
        assert scope["nodes"] == [scope["node"]]
        ids = {
            t
            for t, r in detail.items()
            if "tcp_fallback" in r["flags"] and r["decode_pod"] == scope["pods"][0]
        }
        assert set(inc["trace_ids"]) == ids and inc["requests"] == len(ids)
        assert inc["seconds_lost"] > 0 and inc["gpu_hours_lost"] > 0
        assert "UCX_NET_DEVICES" in inc["next_step"] and scope["nic"] in inc["next_step"]
    assert len({i["scope"]["pods"][0] for i in tcp}) == len(tcp)  # one incident per faulty NIC
    # A pairing problem: a pool-pair incident of the blind pool.
    pairing = [i for i in items if i["cause"] == "topology_blind_pairing"]
    assert pairing and all(i["scope"]["kind"] == "pool_pair" for i in pairing)
    assert {i["scope"]["decode_pool"] for i in pairing} == {"dra-aligned-decode"}


def test_tcp_loses_more_seconds_than_a_cross_rail_hop(run: dict[str, Any]) -> None:
    lost: dict[str, list[float]] = {"tcp": [], "rdma_cross_rail": []}
    for r in run["requests_detail"]:
        cost = r.get("cost") or {}
        if (
            r["path_class"] in lost
            and cost.get("kv_s_lost") is not None
            and "kv_transfer_failed" not in r["flags"]
        ):
            lost[r["path_class"]].append(cost["kv_s_lost"])
    assert lost["tcp"] and lost["rdma_cross_rail"]
    mean = {k: sum(v) / len(v) for k, v in lost.items()}
    assert mean["tcp"] > mean["rdma_cross_rail"] > 0


def test_incident_detail_and_paging(db_url: str, tmp_path: Path) -> None:
    from railtrace.server.runner import Service
    from tests.service_helpers import settings_for

    # The read path alone: an empty window answers an empty page, a bad cursor a 400.
    with Service(settings_for(db_url)) as svc:
        page = httpx.get(f"{svc.http_url}/api/v1/incidents").json()
        assert page["items"] == [] and page["next_cursor"] is None and page["partial"] is None
        assert httpx.get(f"{svc.http_url}/api/v1/incidents", params={"cursor": "!!"}).status_code == 400
        assert httpx.get(f"{svc.http_url}/api/v1/incidents/0123456789abcdef").status_code == 404
