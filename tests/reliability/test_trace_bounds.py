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

from railtrace.server.runner import Service
from railtrace.settings import Settings
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
        # 80 + 40 > 100: this call's spans of trace 1 are dropped; trace 2 is within its own cap.
        r = post(client, two_traces(1, 2, 80, 40))
        assert r.status_code == 200
        ps = ExportTraceServiceResponse.FromString(r.content).partial_success
        assert ps.rejected_spans == 40
        assert f"({CAP})" in ps.error_message and "spans dropped" in ps.error_message
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
    assert len({k for k in keys if k[0] == format(1, "032x")}) == 80
    assert len({k for k in keys if k[0] == format(2, "032x")}) == 60
    assert _metric(svc, "llm_d_tracing_trace_span_limit_dropped_spans_total") == 70
    assert _metric(svc, 'llm_d_tracing_spans_rejected_total{reason="trace_span_limit"}') == 70


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
