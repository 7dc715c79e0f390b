"""Per-trace bounds: a trace id holds at most `max_spans_per_trace` spans (more are dropped,
answered as partial success with the reason, and counted), and `GET /api/v1/traces/{id}`
pages through a big trace. On SQLite and PostgreSQL, over HTTP and gRPC."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from sqlalchemy import create_engine, select

from railtrace.server.runner import Service
from railtrace.settings import Settings
from railtrace.store.schema import traces
from tests.reliability.reliability_helpers import EXPORT_PATH, post, stored_keys

T0 = 1_790_000_000 * 10**9
CAP = 100


def export(trace: int, first: int, n: int) -> bytes:
    """`n` spans of trace `trace`, span ids first..first+n-1."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "bounds"
    ss = rs.scope_spans.add()
    for i in range(first, first + n):
        s = ss.spans.add()
        s.trace_id = trace.to_bytes(16, "big")
        s.span_id = (i + 1).to_bytes(8, "big")
        s.name = f"s{i}"
        s.start_time_unix_nano = T0 + i * 1000
        s.end_time_unix_nano = T0 + i * 1000 + 500
    return req.SerializeToString()


def two_traces(a: int, b: int, first: int, n: int) -> bytes:
    req = ExportTraceServiceRequest.FromString(export(a, first, n))
    req.MergeFromString(export(b, first, n))
    return req.SerializeToString()


@pytest.fixture
def svc(db_url: str, tmp_path: Path) -> Iterator[Service]:
    s = Settings(db=db_url, port=0, grpc_port=0, topology=[], max_spans_per_trace=CAP)
    with Service(s) as service:
        yield service


def _metric(svc: Service, prefix: str) -> float:
    for line in httpx.get(svc.http_url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(prefix + " ") or line.startswith(prefix + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_spans_past_the_cap_are_dropped_answered_and_counted(svc: Service, db_url: str) -> None:
    with httpx.Client(base_url=svc.http_url, timeout=60) as client:
        for first in (0, 40):
            r = post(client, export(1, first, 40))
            assert r.status_code == 200
            assert not ExportTraceServiceResponse.FromString(r.content).HasField("partial_success")
        # 80 + 40 > 100: trace 1 takes 20 of this call's spans, the other 20 are refused;
        # trace 2 is within its own cap.
        r = post(client, two_traces(1, 2, 80, 40))
        assert r.status_code == 200
        ps = ExportTraceServiceResponse.FromString(r.content).partial_success
        assert ps.rejected_spans == 20
        assert (
            ps.error_message
            == f"20 spans dropped: their trace already holds the most spans one trace may ({CAP})"
        )
    channel = grpc.insecure_channel(svc.grpc_endpoint)
    try:
        call = channel.unary_unary(EXPORT_PATH)
        out = ExportTraceServiceResponse.FromString(call(export(1, 200, 30), timeout=30))
        assert out.partial_success.rejected_spans == 30
        out = ExportTraceServiceResponse.FromString(call(export(2, 200, 20), timeout=30))
        assert out.partial_success.rejected_spans == 0  # trace 2: 40 + 20, within the cap
    finally:
        channel.close()
    keys = stored_keys(db_url)
    assert {k for k in keys if k[0] == format(1, "032x")} == {
        (format(1, "032x"), format(i + 1, "016x")) for i in range(100)
    }
    assert len({k for k in keys if k[0] == format(2, "032x")}) == 60
    assert _metric(svc, "llm_d_tracing_trace_span_limit_dropped_spans_total") == 50
    assert _metric(svc, 'llm_d_tracing_spans_rejected_total{reason="trace_span_limit"}') == 50


def _has_root(db_url: str, trace: int) -> bool:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return bool(
                conn.execute(
                    select(traces.c.has_root).where(traces.c.trace_id == format(trace, "032x"))
                ).scalar()
            )
    finally:
        engine.dispose()


def test_one_call_past_the_cap_keeps_spans_up_to_it(svc: Service, db_url: str) -> None:
    """A call with 150 spans of a new trace (cap 100): the first 100 are stored, 50 refused with
    the reason; a retry of the same call stores nothing more and refuses all 150. Over gRPC, a
    trace holding 90 takes 10 of a 25-span call."""
    tid = format(3, "032x")
    call = export(3, 0, 150)
    with httpx.Client(base_url=svc.http_url, timeout=60) as client:
        ps = ExportTraceServiceResponse.FromString(post(client, call).content).partial_success
        assert ps.rejected_spans == 50
        assert (
            ps.error_message
            == f"50 spans dropped: their trace already holds the most spans one trace may ({CAP})"
        )
        again = ExportTraceServiceResponse.FromString(post(client, call).content).partial_success
        assert again.rejected_spans == 150
        assert post(client, export(4, 0, 90)).status_code == 200
    channel = grpc.insecure_channel(svc.grpc_endpoint)
    try:
        out = ExportTraceServiceResponse.FromString(
            channel.unary_unary(EXPORT_PATH)(export(4, 90, 25), timeout=30)
        )
    finally:
        channel.close()
    assert out.partial_success.rejected_spans == 15
    keys = stored_keys(db_url)
    assert {k[1] for k in keys if k[0] == tid} == {format(i + 1, "016x") for i in range(100)}
    assert len({k for k in keys if k[0] == format(4, "032x")}) == 100
    assert _has_root(db_url, 3)  # every span of `export` is a root; the kept part keeps the mark
    r = httpx.get(f"{svc.http_url}/api/v1/traces/{tid}", timeout=60)
    assert r.status_code == 200 and len(r.json()["spans"]) == 100


def test_a_cut_chunk_without_its_root_is_not_marked_rooted(svc: Service, db_url: str) -> None:
    """The root is the last of the call's spans and falls past the cap: the stored part has
    no root, so the trace is not taken for complete."""
    req = ExportTraceServiceRequest.FromString(export(5, 0, 120))
    spans = req.resource_spans[0].scope_spans[0].spans
    for s in spans[:-1]:
        s.parent_span_id = (999).to_bytes(8, "big")
    with httpx.Client(base_url=svc.http_url, timeout=60) as client:
        r = post(client, req.SerializeToString())
        assert ExportTraceServiceResponse.FromString(r.content).partial_success.rejected_spans == 20
    assert not _has_root(db_url, 5)


def test_cap_zero_means_no_cap(db_url: str) -> None:
    s = Settings(db=db_url, port=0, grpc_port=0, topology=[], max_spans_per_trace=0)
    with Service(s) as svc, httpx.Client(base_url=svc.http_url, timeout=60) as client:
        for first in range(0, 300, 100):
            r = post(client, export(5, first, 100))
            assert not ExportTraceServiceResponse.FromString(r.content).HasField("partial_success")
    assert len(stored_keys(db_url)) == 300


def _cursor(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize("limit", [1, 7, 100, 250, 1000])
def test_a_big_trace_is_read_page_by_page(db_url: str, limit: int) -> None:
    s = Settings(db=db_url, port=0, grpc_port=0, topology=[], max_spans_per_trace=0)
    tid = format(9, "032x")
    with Service(s) as svc, httpx.Client(base_url=svc.http_url, timeout=60) as client:
        for first in range(0, 1000, 100):  # ten chunks of 100 spans
            assert post(client, export(9, first, 100)).status_code == 200
        post(client, export(9, 0, 100))  # a retry: the same chunk again, stored once
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            params: dict[str, object] = {"limit": limit}
            if cursor:
                params["cursor"] = cursor
            r = client.get(f"/api/v1/traces/{tid}", params=params)
            assert r.status_code == 200, r.text
            body = r.json()
            assert len(body["spans"]) <= limit
            seen += [sp["span_id"] for sp in body["spans"]]
            pages += 1
            assert body["truncated"] == (body["next_cursor"] is not None)
            cursor = body["next_cursor"]
            if not cursor:
                break
            assert pages <= 1000 // limit + 2
        assert len(seen) == len(set(seen)) == 1000
        assert pages == -(-1000 // limit)
        whole = client.get(f"/api/v1/traces/{tid}").json()  # default page: all of it, in start order
        assert [sp["span_id"] for sp in whole["spans"]] == [format(i + 1, "016x") for i in range(1000)]
        assert whole["truncated"] is False and whole["next_cursor"] is None
        bad = [
            b'["' + tid.encode() + b'",9223372036854775808,0]',
            b'["' + tid.encode() + b'",true,0]',
            b'["' + tid.encode() + b'",1,-1]',
            b'["' + b"0" * 32 + b'",1,0]',  # a trace this request does not hold
            b"[1,2,3]",
            b"{}",
            b"zz",
        ]
        for raw in bad:
            r = client.get(f"/api/v1/traces/{tid}", params={"cursor": _cursor(raw)})
            assert r.status_code == 400, (raw, r.text)


def test_page_memory_does_not_grow_with_the_trace(tmp_path: Path) -> None:
    """A page of 100 spans of a 20,000-span trace answers without reading the trace whole."""
    db = f"sqlite:///{tmp_path / 'big.db'}"
    s = Settings(db=db, port=0, grpc_port=0, topology=[], max_spans_per_trace=0)
    tid = format(11, "032x")
    with Service(s) as svc, httpx.Client(base_url=svc.http_url, timeout=120) as client:
        for first in range(0, 20_000, 2000):
            assert post(client, export(11, first, 2000)).status_code == 200
        calls: list[int] = []
        store = svc.runtime.store  # type: ignore[union-attr]
        real = store.load_spans

        def spy(*a: object, **k: object) -> object:
            calls.append(1)
            return real(*a, **k)  # type: ignore[arg-type]

        store.load_spans = spy  # type: ignore[method-assign]
        body = client.get(f"/api/v1/traces/{tid}", params={"limit": 100}).json()
        assert len(body["spans"]) == 100 and body["next_cursor"]
        assert not calls  # the whole-trace reader was not used
        pos = orjson.loads(base64.urlsafe_b64decode(body["next_cursor"] + "=="))
        assert pos[0] == tid and pos[2] == 100
