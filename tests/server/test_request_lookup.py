"""`GET /api/v1/requests/{id}` finds a request by its primary trace, by a stitched trace of it
or by its request id, in that order, in one statement, and answers with the summary exactly as
stored (no parse and encode again), on SQLite and PostgreSQL."""

from __future__ import annotations

import orjson
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert

from railtrace.server.app import create_app
from railtrace.store import Store, make_engine, migrate
from railtrace.store.schema import requests, trace_keys, traces
from railtrace.store.statements import _statements, listed
from tests.service_helpers import query_plan, settings_for, trace_id


def _summary(primary: str, request_id: str | None, start_ns: int) -> bytes:
    # A float that Python's json and orjson write differently shows the stored bytes are sent.
    return orjson.dumps({"trace_id": primary, "request_id": request_id, "ttft_s": 1e-07, "start": start_ns})


def _request_row(primary: str, request_id: str | None, start_ns: int) -> dict[str, object]:
    return {
        "trace_id": primary,
        "request_id": request_id,
        "start_ns": start_ns,
        "path_class": "rdma_same_rail",
        "transport": "rdma",
        "flag_names": "",
        "summary": _summary(primary, request_id, start_ns),
        "updated_ns": start_ns,
    }


def _trace_row(tid: str, primary: str | None) -> dict[str, object]:
    return {
        "trace_id": tid,
        "first_arrival_ns": 1,
        "last_arrival_ns": 1,
        "span_count": 1,
        "has_root": True,
        "dirty": False,
        "late_spans": 0,
        "request_trace_id": primary,
    }


@pytest.fixture
def store(db_url: str) -> Store:
    engine = make_engine(db_url)
    migrate(engine)
    s = Store(engine)
    a, b, c = trace_id(1), trace_id(2), trace_id(3)
    with engine.begin() as conn:
        conn.execute(
            insert(requests),
            [
                _request_row(a, "req-shared", 100),  # older request with the same request id
                _request_row(c, "req-shared", 300),  # newest: what the request id finds
                _request_row(trace_id(4), trace_id(1), 50),  # a request id that is another's trace id
            ],
        )
        # b is a hop of request a that arrived in a trace of its own (stitched).
        conn.execute(insert(traces), [_trace_row(a, a), _trace_row(b, a), _trace_row(c, c)])
    return s


def test_lookup_prefers_primary_then_stitched_then_request_id(store: Store) -> None:
    def found(ident: str) -> tuple[str, int] | None:
        summary = store.get_request(ident)
        return (summary["trace_id"], summary["start"]) if summary else None

    assert found(trace_id(1)) == (trace_id(1), 100)  # its own trace, not the request id naming it
    assert found(trace_id(2)) == (trace_id(1), 100)  # a stitched hop finds its request
    assert found("req-shared") == (trace_id(3), 300)  # newest request with that id
    assert found(trace_id(9)) is None
    assert found("") is None
    assert store.get_request_json(trace_id(2)) == _summary(trace_id(1), "req-shared", 100)


def test_lookups_through_a_stitched_trace_read_both_tables_by_primary_key(db_url: str) -> None:
    """The detail lookup and the summaries a group supersedes find the trace by its key, then
    its request by the request's key: `traces.request_trace_id` needs no index of its own
    (migration 0007 dropped it; every row version of `traces` wrote an entry into it)."""
    engine = make_engine(db_url)
    migrate(engine)
    s = Store(engine)
    n = 2_000
    with engine.begin() as conn:
        conn.execute(insert(requests), [_request_row(trace_id(i), f"r{i}", i) for i in range(0, n, 2)])
        conn.execute(insert(traces), [_trace_row(trace_id(i), trace_id(i - i % 2)) for i in range(n)])
        if not s.sqlite:
            conn.exec_driver_sql("ANALYZE traces")
            conn.exec_driver_sql("ANALYZE requests")
    q = _statements(s.sqlite)
    ids = listed([trace_id(3), trace_id(5)], s.sqlite)
    by_ident = {"ident": trace_id(3), "key": "r3", "engine_key": "r3"}
    for stmt, params in ((q.summary_by_ident, by_ident), (q.previous_summaries, {"ids": ids})):
        plan = query_plan(s, stmt, params)
        scans = (
            "Seq Scan on traces",
            "Seq Scan on requests",
            "Seq Scan on trace_keys",
            "SCAN traces",
            "SCAN requests",
            "SCAN trace_keys",
        )
        assert not [line for line in plan if any(scan in line for scan in scans)], plan
        assert "ix_traces_request" not in " ".join(plan)
    assert sorted(s.previous_summaries([trace_id(3), trace_id(4)])) == [trace_id(2), trace_id(4)]
    engine.dispose()


def test_detail_answers_with_the_stored_json(db_url: str, store: Store) -> None:
    app = create_app(settings_for(db_url, quiet_period_s=60))
    with TestClient(app) as client:
        r = client.get(f"/api/v1/requests/{trace_id(2).upper()}")
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/json"
        assert r.content == _summary(trace_id(1), "req-shared", 100)
        missing = client.get(f"/api/v1/requests/{trace_id(9)}")
        assert missing.status_code == 404
        assert "quiet period" in missing.json()["detail"]
        assert client.get("/api/v1/requests/" + "x" * 300).status_code == 400
        schema = client.get("/openapi.json").json()["paths"]["/api/v1/requests/{ident}"]["get"]
        assert "application/json" in schema["responses"]["200"]["content"]


def test_every_id_form_of_a_request_finds_it(db_url: str) -> None:
    """The EPP's x-request-id, vLLM's public id (`chatcmpl-`, `cmpl-...-N`), vLLM's engine id
    (`-<8 hex>`, vLLM PR #27987) and the sidecar's UUID, each carried by some span of one of the
    request's traces (`trace_keys`), all find it -- and a client's own id that merely ends in
    `-<8 hex>` is not cut short when another request holds the shorter id."""
    engine = make_engine(db_url)
    migrate(engine)
    s = Store(engine)
    epp_id = "6f1c2b0e-9d7a-4c1e-8b2f-3a4d5e6f7a8b"
    sidecar = "0b8e9d5c-b1a2-11f0-9c3d-0242ac120002"
    a, b, c = trace_id(1), trace_id(2), trace_id(3)
    with engine.begin() as conn:
        conn.execute(
            insert(requests), [_request_row(a, sidecar, 100), _request_row(c, "client-abcdef12", 200)]
        )
        conn.execute(insert(traces), [_trace_row(a, a), _trace_row(b, a), _trace_row(c, c)])
        conn.execute(
            insert(trace_keys),
            [
                {"request_key": epp_id, "trace_id": a},  # EPP spans' gen_ai.request.id
                {"request_key": sidecar, "trace_id": a},  # sidecar's llm_d.pd_proxy.request_id
                {"request_key": epp_id, "trace_id": b},  # an orphan vLLM llm_request
                {"request_key": "client", "trace_id": c},
            ],
        )
    forms = [
        epp_id,
        epp_id.upper(),
        f"chatcmpl-{epp_id}",
        f"cmpl-{epp_id}",
        f"cmpl-{epp_id}-0",
        f"chatcmpl-{epp_id}-99ae74c8",
        f"cmpl-{epp_id}-0-99ae74c8",
        sidecar,
        b,
    ]
    for ident in forms:
        found = s.get_request(ident)
        assert found is not None and found["trace_id"] == a, ident
    assert s.get_request("client-abcdef12")["trace_id"] == c  # type: ignore[index]
    assert s.get_request("chatcmpl-unknown-99ae74c8") is None
    engine.dispose()


def test_a_kv_span_alone_is_stored_under_the_public_key_too() -> None:
    """A KV span, a root in vLLM's worker process, carries only vLLM's engine id: its trace is
    stored under that id's public key as well, so the request's other traces find it (both
    the C-accelerated and the Python row paths)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from railtrace.otlp.encode import key_value
    from railtrace.otlp.export import prepare

    public = "6f1c2b0e-9d7a-4c1e-8b2f-3a4d5e6f7a8b"
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend([key_value("service.name", "vllm-decode")])
    span = rs.scope_spans.add().spans.add()
    span.trace_id, span.span_id = bytes.fromhex(trace_id(7)), bytes.fromhex("00000000000000a1")
    span.name, span.start_time_unix_nano, span.end_time_unix_nano = "llm_d.kv_transfer", 10**18, 10**18 + 5
    span.attributes.extend([key_value("llm_d.kv_transfer.request_id", f"chatcmpl-{public}-99ae74c8")])
    for batch in (prepare(req.SerializeToString()), prepare(req)):
        assert batch.keys == {(f"{public}-99ae74c8", trace_id(7)), (public, trace_id(7))}
