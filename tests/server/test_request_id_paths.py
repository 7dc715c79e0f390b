"""Any request id has its API answer and its UI page: ids holding `/` (or `?`, `#`, `%`) are sent
percent-encoded (`%2F`), which the server decodes before routing, so the routes take the rest
of the path as the id. Before, such an id's page and summary answered 404."""

from __future__ import annotations

from urllib.parse import quote

import orjson
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert

from railtrace.server.app import create_app
from railtrace.server.ui import request_path
from railtrace.store import make_engine, migrate
from railtrace.store.schema import requests
from tests.service_helpers import settings_for, trace_id

IDS = ["tenant-a/req/42", "ns/req-7", "odd ?#% id/", "/leading", "team-a/6f1c2b0e-9d7a-4c1e"]


@pytest.fixture
def client(db_url: str) -> TestClient:
    engine = make_engine(db_url)
    migrate(engine)
    rows = []
    for n, rid in enumerate(IDS, 1):
        tid = trace_id(n)
        rows.append(
            {
                "trace_id": tid,
                "request_id": rid,
                "start_ns": n,
                "path_class": "rdma_same_rail",
                "transport": "rdma",
                "flag_names": "",
                "summary": orjson.dumps({"trace_id": tid, "request_id": rid}),
                "updated_ns": n,
            }
        )
    with engine.begin() as conn:
        conn.execute(insert(requests), rows)
    engine.dispose()
    return TestClient(create_app(settings_for(db_url, quiet_period_s=60)))


@pytest.mark.parametrize("n_rid", list(enumerate(IDS, 1)))
def test_an_encoded_request_id_finds_its_summary_and_page(client: TestClient, n_rid: tuple[int, str]) -> None:
    n, rid = n_rid
    with client:
        r = client.get("/api/v1/requests/" + quote(rid, safe=""))
        assert r.status_code == 200, r.text
        assert r.json() == {"trace_id": trace_id(n), "request_id": rid}
        page = client.get(request_path(rid))
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert request_path(rid) == "/requests/" + quote(rid, safe="")


def test_unknown_ids_with_slashes_are_404_and_other_routes_stay(client: TestClient) -> None:
    with client:
        assert client.get("/api/v1/requests/" + quote("no/such", safe="")).status_code == 404
        assert client.get("/api/v1/requests").status_code == 200
        assert client.get("/requests").status_code == 200
        schema = client.get("/openapi.json").json()["paths"]
        assert "/api/v1/requests/{ident}" in schema
