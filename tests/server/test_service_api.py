"""REST API v1 over stored summaries, on SQLite and PostgreSQL: filters, keyset paging,
validation, stats, OpenAPI, metrics exposition; and the migrations match the models."""

from __future__ import annotations

import base64
import time

import orjson
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from fastapi.testclient import TestClient

from railtrace.model import Flag, KVSummary, RequestSummary, rfc3339
from railtrace.server import create_app
from railtrace.store.queries import Cursor, RequestOrder
from railtrace.store.schema import metadata
from tests.service_helpers import settings_for

T0 = 1_790_000_000 * 10**9
NODES = ["node-a", "node-b", "node-c"]


def summary(n: int) -> RequestSummary:
    flags = []
    if n % 3 == 0:
        flags.append(Flag("tcp_fallback", "UCX used tcp", "00000000000000aa"))
    if n % 5 == 0:
        flags.append(Flag("cross_rail", "mlx5_3 is rail 3, GPU on rail 0", None))
    path = "tcp" if n % 3 == 0 else "rdma_same_rail"
    return RequestSummary(
        trace_id=f"{n:032x}",
        request_id=f"req-{n}",
        model="llama" if n % 2 else "mistral",
        start=rfc3339(T0 + n * 10**9),
        ttft_s=0.1 * (n % 7 + 1),
        e2e_s=1.0,
        breakdown_s={"prefill": 0.05},
        prefill={"pod": f"prefill-{n % 2}", "node": NODES[n % 3], "gpu": None, "nic": None, "rail": None},
        decode={"pod": f"decode-{n % 2}", "node": NODES[(n + 1) % 3], "gpu": None, "nic": None, "rail": None},
        kv_transfer=KVSummary(
            transport=path if path == "tcp" else "rdma", path_class=path, bytes=1 << 20, duration_s=0.01
        ),
        flags=flags,
        trace_ids=[f"{n:032x}"],
        span_count=8,
    )


@pytest.fixture
def client(db_url: str):
    app = create_app(settings_for(db_url, quiet_period_s=3600))
    with TestClient(app) as c:
        rt = app.state.runtime
        rt.store.save_assembly([summary(n) for n in range(1, 31)], {}, (), time.time_ns())
        for n in range(1, 31):
            rt.metrics.request_assembled(summary(n).to_dict(), None)
        yield c


def raw_cursor(fields: object) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(fields)).decode().rstrip("=")


def collect(client: TestClient, **params) -> list[str]:
    ids, cursor, pages = [], None, 0
    while True:
        r = client.get("/api/v1/requests", params={**params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        body = r.json()
        ids += [item["trace_id"] for item in body["items"]]
        pages += 1
        cursor = body["next_cursor"]
        if not cursor:
            return ids


def test_list_pages_newest_first_without_gaps_or_repeats(client: TestClient) -> None:
    ids = collect(client, limit=7)
    assert ids == [f"{n:032x}" for n in range(30, 0, -1)]
    first = client.get("/api/v1/requests").json()
    assert len(first["items"]) == 30 and first["next_cursor"] is None
    item = first["items"][0]
    assert {
        "trace_id",
        "request_id",
        "model",
        "start",
        "ttft_s",
        "e2e_s",
        "breakdown_s",
        "prefill",
        "decode",
        "kv_transfer",
        "flags",
    } <= item.keys()
    assert item["kv_transfer"]["path_class"] in ("tcp", "rdma_same_rail")


def test_filters_combine(client: TestClient) -> None:
    tcp = [f"{n:032x}" for n in range(30, 0, -1) if n % 3 == 0]
    assert collect(client, flag="tcp_fallback", limit=4) == tcp
    assert collect(client, flag="cross_rail", path_class="tcp") == [f"{n:032x}" for n in (30, 15)]
    assert collect(client, model="mistral", node="node-a") == [
        f"{n:032x}" for n in range(30, 0, -1) if n % 2 == 0 and "node-a" in (NODES[n % 3], NODES[(n + 1) % 3])
    ]
    assert collect(client, pod="prefill-1", limit=1000) == [f"{n:032x}" for n in range(29, 0, -2)]
    since, until = rfc3339(T0 + 10 * 10**9), rfc3339(T0 + 13 * 10**9)
    assert collect(client, since=since, until=until) == [f"{n:032x}" for n in (12, 11, 10)]
    assert collect(client, since=(T0 + 29 * 10**9) // 10**9) == [f"{n:032x}" for n in (30, 29)]


@pytest.mark.parametrize("order", ["ttft", "kv_time"])
@pytest.mark.parametrize(
    ("params", "keep"),
    [
        ({}, lambda n: True),
        ({"flag": "tcp_fallback"}, lambda n: n % 3 == 0),
        ({"path_class": "rdma_same_rail"}, lambda n: n % 3 != 0),
        ({"node": "node-b"}, lambda n: "node-b" in (NODES[n % 3], NODES[(n + 1) % 3])),
        ({"pod": "decode-1"}, lambda n: n % 2 == 1),
        ({"model": "mistral", "flag": "cross_rail"}, lambda n: n % 2 == 0 and n % 5 == 0),
        ({"since": rfc3339(T0 + 5 * 10**9), "until": rfc3339(T0 + 20 * 10**9)}, lambda n: 5 <= n < 20),
    ],
)
def test_list_pages_slowest_first_over_the_whole_window(client: TestClient, order: str, params, keep) -> None:
    """Followed to the end three at a time, each order is the filtered requests sorted by its
    value, slowest first (ties by trace id), whatever page a run of equal values straddles."""

    def value(s: RequestSummary) -> float:
        return s.ttft_s if order == "ttft" else s.kv_transfer.duration_s

    rows = [summary(n) for n in range(1, 31) if keep(n)]
    want = [s.trace_id for s in sorted(rows, key=lambda s: (value(s), s.trace_id), reverse=True)]
    assert collect(client, order=order, limit=3, **params) == want
    page = client.get("/api/v1/requests", params={"order": order, "limit": 2, **params}).json()
    assert [i["trace_id"] for i in page["items"]] == want[:2]


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"limit": 0}, 422),
        ({"limit": 100_000}, 422),
        ({"flag": "no_such_flag"}, 422),
        ({"path_class": "warp_drive"}, 422),
        ({"since": "yesterday"}, 422),
        ({"cursor": "not-a-cursor"}, 400),
        ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, 400),
        ({"node": "x" * 300}, 422),
        ({"cursor": Cursor(1, "a\x00b").encode()}, 400),  # no cursor this service issued holds NUL
        ({"order": "slowest"}, 422),
        # A cursor pages on only in the order that issued it.
        ({"order": "ttft", "cursor": Cursor(T0, "a").encode()}, 400),
        ({"cursor": Cursor(0.5, "a", RequestOrder.TTFT).encode()}, 400),
        ({"order": "kv_time", "cursor": Cursor(0.5, "a", RequestOrder.TTFT).encode()}, 400),
        ({"order": "ttft", "cursor": raw_cursor(["ttft", "0.5", "a"])}, 400),
        ({"order": "ttft", "cursor": raw_cursor(["ttft", True, "a"])}, 400),
        ({"order": "ttft", "cursor": raw_cursor(["ttft", 0.5, 7])}, 400),
        ({"order": "ttft", "cursor": raw_cursor(["nope", 0.5, "a"])}, 400),
        ({"order": "ttft", "cursor": raw_cursor(["ttft", 0.5])}, 400),
        ({"cursor": raw_cursor([0.5, "a"])}, 400),  # a start cursor holds integer nanoseconds
        ({"order": "ttft", "cursor": raw_cursor({"ttft": 0.5})}, 400),
    ],
)
def test_bad_parameters_get_clear_errors(client: TestClient, params: dict, status: int) -> None:
    r = client.get("/api/v1/requests", params=params)
    assert r.status_code == status and r.json()["detail"]


def test_one_request_by_trace_or_request_id(client: TestClient) -> None:
    by_trace = client.get(f"/api/v1/requests/{7:032x}").json()
    assert by_trace == client.get("/api/v1/requests/req-7").json()
    assert by_trace["request_id"] == "req-7"
    assert client.get(f"/api/v1/requests/{99:032x}").status_code == 404
    # NUL, which PostgreSQL's text cannot hold, is no error: stored text has U+FFFD in its place.
    assert client.get("/api/v1/requests/req%00-7").status_code == 404
    hostile = {"node": "node\x00a", "pod": "p\x00", "model": "m\x00"}
    assert client.get("/api/v1/requests", params=hostile).json()["items"] == []
    assert client.get("/api/v1/traces/not-hex").status_code == 400
    assert client.get(f"/api/v1/traces/{99:032x}").status_code == 404


def test_stats_group_by(client: TestClient) -> None:
    by_path = {g["path_class"]: g["requests"] for g in client.get("/api/v1/stats").json()["groups"]}
    assert by_path == {"tcp": 10, "rdma_same_rail": 20}
    by_flag = client.get("/api/v1/stats", params={"group_by": "flag"}).json()["groups"]
    assert {g["flag"]: g["requests"] for g in by_flag} == {"tcp_fallback": 10, "cross_rail": 6}
    pairs = client.get("/api/v1/stats", params={"group_by": "pair"}).json()["groups"]
    assert sum(g["requests"] for g in pairs) == 30 and all("prefill_node" in g for g in pairs)
    windowed = client.get("/api/v1/stats", params={"since": rfc3339(T0 + 28 * 10**9)}).json()["groups"]
    assert sum(g["requests"] for g in windowed) == 3
    assert client.get("/api/v1/stats", params={"group_by": "pod"}).status_code == 422


def test_openapi_health_and_metrics(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in (
        "/v1/traces",
        "/api/v1/requests",
        "/api/v1/requests/{ident}",
        "/api/v1/traces/{trace_id}",
        "/api/v1/topology",
        "/api/v1/stats",
        "/healthz",
        "/readyz",
        "/metrics",
    ):
        assert path in paths
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    text = client.get("/metrics").text
    assert 'llm_d_tracing_requests_total{model="llama",path_class="tcp"} 5.0' in text
    om = client.get("/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert '# {trace_id="' in om.text and om.text.rstrip().endswith("# EOF")


def test_topology_endpoint(client: TestClient) -> None:
    r = client.get("/api/v1/topology")
    assert r.status_code == 200 and isinstance(r.json(), dict)
    assert client.post("/api/v1/topology/reload").status_code == 200


def test_migrations_create_exactly_the_models(client: TestClient) -> None:
    engine = client.app.state.runtime.engine
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diff == []
