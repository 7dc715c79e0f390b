"""`GET /api/v1/contract` and the contract gauge on a running service, on real DRA objects."""

from __future__ import annotations

import httpx

from railtrace.server.runner import Service
from railtrace.settings import Settings
from railtrace_tracing import semconv
from tests.contract.test_offline_fixtures import AZURE_GB300


def _service(tmp_path) -> Service:
    return Service(
        Settings(
            db=f"sqlite:///{tmp_path / 'rt.db'}",
            port=0,
            grpc_port=0,
            topology=[str(p) for p in AZURE_GB300],
        )
    )


def test_route_reports_the_misaligned_claim_and_filters(tmp_path) -> None:
    with _service(tmp_path) as svc:
        body = httpx.get(f"{svc.http_url}/api/v1/contract", timeout=10).json()
        pods = {p["name"]: p for p in body["pods"]}
        pod = pods["nccl-test-dra-worker-0"]
        assert pod["obligations"]["preserved"]["status"] == "broken"
        # No traffic yet: verified can only be unknown, never ok by default.
        assert pod["obligations"]["verified"]["status"] == "unknown"

        broken = httpx.get(
            f"{svc.http_url}/api/v1/contract",
            params={"obligation": "preserved", "status": "broken"},
            timeout=10,
        ).json()
        assert [p["name"] for p in broken["pods"]] == ["nccl-test-dra-worker-0"]

        bad = httpx.get(f"{svc.http_url}/api/v1/contract", params={"obligation": "nope"}, timeout=10)
        assert bad.status_code == 400

        metrics = httpx.get(f"{svc.http_url}/metrics", timeout=10).text
        line = f'{semconv.M_CONTRACT}{{obligation="preserved",status="broken"}} 1.0'
        assert line in metrics
