"""OTLP receivers against a running in-process service, on SQLite and PostgreSQL.

Clients are the official OpenTelemetry SDK exporters (HTTP and gRPC) and raw HTTP for the
error cases the exporters never produce.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import httpx
import orjson
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import create_engine, select, text

from railtrace.server.runner import Service
from railtrace.store.schema import span_chunks
from railtrace.store.schema import traces as traces_table
from tests.service_helpers import export_request, settings_for, span_id, trace_id, wait_for

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


@pytest.fixture
def service(db_url: str):
    with Service(settings_for(db_url, max_body_bytes=1_000_000)) as svc:
        yield svc


def post(svc: Service, body: bytes, ctype: str = PROTOBUF, encoding: str | None = None) -> httpx.Response:
    headers = {"content-type": ctype}
    if encoding:
        headers["content-encoding"] = encoding
    return httpx.post(svc.http_url + "/v1/traces", content=body, headers=headers, timeout=60)


def stored_spans(svc: Service) -> int:
    return svc.runtime.store.count_spans()


def metric(svc: Service, name: str, labels: str = "") -> float:
    for line in httpx.get(svc.http_url + "/metrics").text.splitlines():
        if line.startswith(name + (labels and "{" + labels + "}")) and not line.startswith("#"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _sdk_spans(service_name: str) -> list:
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": service_name, "k8s.pod.name": "decode-0", "k8s.node.name": "node-b"}
        )
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("railtrace.test")
    engine_attrs = {
        "gen_ai.latency.time_to_first_token": 0.343,
        "gen_ai.request.id": "chatcmpl-r-1",
        "gen_ai.input.messages": "secret prompt text",
    }
    with (
        tracer.start_as_current_span("forward_request", attributes={"llm_d.pd_proxy.request_id": "r-1"}),
        tracer.start_as_current_span("prefill", attributes={"llm_d.pd_proxy.connector": "nixlv2"}),
        tracer.start_as_current_span("llm_request", attributes=engine_attrs),
    ):
        pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def test_official_exporters_http_and_grpc_round_trip(service: Service) -> None:
    over_http = _sdk_spans("routing-sidecar")
    over_grpc = _sdk_spans("vllm-decode")
    http_exporter = HttpExporter(endpoint=service.http_url + "/v1/traces", compression=Compression.Gzip)
    grpc_exporter = GrpcExporter(endpoint=service.grpc_endpoint, insecure=True)
    try:
        assert http_exporter.export(over_http) == SpanExportResult.SUCCESS
        assert grpc_exporter.export(over_grpc) == SpanExportResult.SUCCESS
        # An exporter retry of the same spans: accepted, stored once, counted as duplicates.
        assert grpc_exporter.export(over_http) == SpanExportResult.SUCCESS
    finally:
        http_exporter.shutdown()
        grpc_exporter.shutdown()
    # Acknowledged means committed: readable at once, no waiting.
    for sent in (over_http, over_grpc):
        tid = format(sent[0].context.trace_id, "032x")
        body = httpx.get(f"{service.http_url}/api/v1/traces/{tid}").json()
        got = {s["span_id"]: s for s in body["spans"]}
        assert len(got) == len(sent) == 3
        for s in sent:
            stored = got[format(s.context.span_id, "016x")]
            assert stored["name"] == s.name
            assert stored["start_ns"] == s.start_time and stored["end_ns"] == s.end_time
            assert stored["resource"]["service.name"] == s.resource.attributes["service.name"]
            assert stored["resource"]["k8s.pod.name"] == "decode-0"
            expected = {k: v for k, v in s.attributes.items() if k != "gen_ai.input.messages"}
            assert stored["attributes"] == expected  # content attributes never stored
            assert stored["role"]  # normalised
    assert stored_spans(service) == 6
    assert metric(service, "llm_d_tracing_duplicate_spans_total") == 3
    assert metric(service, "llm_d_tracing_spans_received_total", 'protocol="http"') == 3
    assert metric(service, "llm_d_tracing_spans_received_total", 'protocol="grpc"') == 3


def test_json_payload_with_hex_ids_gets_json_answer(service: Service) -> None:
    tid, sid = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"
    doc = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "llm-d-router/epp"}}]
                },
                "scopeSpans": [
                    {
                        "scope": {"name": "epp"},
                        "spans": [
                            {
                                "traceId": tid,
                                "spanId": sid,
                                "name": "gateway.request",
                                "kind": 2,
                                "startTimeUnixNano": "1790000000000000000",
                                "endTimeUnixNano": "1790000003146000000",
                                "attributes": [
                                    {"key": "gen_ai.request.model", "value": {"stringValue": "llama"}},
                                    {
                                        "key": "llm_d.epp.picker.top_scores",
                                        "value": {"arrayValue": {"values": [{"doubleValue": 0.5}]}},
                                    },
                                ],
                            }
                        ],
                    }
                ],
            }
        ]
    }
    r = post(service, orjson.dumps(doc), ctype="application/json; charset=utf-8")
    assert r.status_code == 200 and r.headers["content-type"].startswith(JSON)
    assert r.json() == {}
    spans = httpx.get(f"{service.http_url}/api/v1/traces/{tid}").json()["spans"]
    assert [(s["span_id"], s["attributes"]["llm_d.epp.picker.top_scores"]) for s in spans] == [(sid, [0.5])]


@pytest.mark.parametrize("as_json", [False, True])
def test_partial_success_keeps_the_valid_spans(service: Service, as_json: bool) -> None:
    req = export_request([1], invalid=2)
    if as_json:
        from google.protobuf import json_format

        doc = json_format.MessageToDict(req)
        for rs in doc["resourceSpans"]:
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):  # OTLP/JSON carries hex ids
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in s:
                            import base64

                            s[key] = base64.b64decode(s[key]).hex()
        r = post(service, orjson.dumps(doc), ctype=JSON)
        assert r.status_code == 200
        partial = r.json()["partialSuccess"]
        assert int(partial["rejectedSpans"]) == 2 and "trace_id" in partial["errorMessage"]
    else:
        r = post(service, req.SerializeToString())
        assert r.status_code == 200 and r.headers["content-type"] == PROTOBUF
        resp = ExportTraceServiceResponse.FromString(r.content)
        assert resp.partial_success.rejected_spans == 2
        assert "trace_id" in resp.partial_success.error_message
    assert stored_spans(service) == 8


def test_malformed_payloads_get_400_with_status_and_store_nothing(service: Service) -> None:
    r = post(service, b"\xff\xff\xff\xff not protobuf")
    assert r.status_code == 400 and r.headers["content-type"] == PROTOBUF
    assert "protobuf" in status_pb2.Status.FromString(r.content).message
    r = post(service, b'{"resourceSpans": [', ctype=JSON)
    assert r.status_code == 400 and "invalid JSON" in r.json()["message"]
    bad_hex = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "spanId": "00"}]}]}]}
    r = post(service, orjson.dumps(bad_hex), ctype=JSON)
    assert r.status_code == 400 and "hex" in r.json()["message"]
    r = post(service, b"\x1f\x8b not gzip", encoding="gzip")
    assert r.status_code == 400
    assert stored_spans(service) == 0
    assert post(service, export_request([3]).SerializeToString()).status_code == 200


def test_content_type_and_encoding_errors(service: Service) -> None:
    body = export_request([1]).SerializeToString()
    r = post(service, body, ctype="text/plain")
    assert r.status_code == 415 and "application/x-protobuf" in r.json()["message"]
    assert post(service, body, encoding="br").status_code == 415
    assert stored_spans(service) == 0


def test_size_limit_holds_before_and_after_decompression(service: Service) -> None:
    limit = service.settings.max_body_bytes
    assert post(service, b"\0" * (limit + 1)).status_code == 413
    bomb = gzip.compress(b"\0" * (40 * limit), compresslevel=9)  # ~40 kB that inflates to 40 MB
    assert len(bomb) < limit
    r = post(service, bomb, encoding="gzip")
    assert r.status_code == 413 and "exceeds" in status_pb2.Status.FromString(r.content).message
    deflate_bomb = zlib.compress(b"\0" * (40 * limit), 9)
    assert post(service, deflate_bomb, encoding="deflate").status_code == 413
    # The service is unharmed and compressed exports under the limit pass.
    body = export_request([1, 2]).SerializeToString()
    assert post(service, gzip.compress(body), encoding="gzip").status_code == 200
    assert post(service, zlib.compress(body), encoding="deflate").status_code == 200  # same spans again
    assert stored_spans(service) == 16


def test_duplicates_change_nothing_and_are_counted(service: Service) -> None:
    body = export_request([1, 2]).SerializeToString()
    assert post(service, body).status_code == 200
    with service.runtime.engine.connect() as conn:
        before = conn.execute(select(traces_table.c.trace_id, traces_table.c.span_count)).all()
    for _ in range(2):
        assert post(service, body).status_code == 200
    with service.runtime.engine.connect() as conn:
        after = conn.execute(select(traces_table.c.trace_id, traces_table.c.span_count)).all()
    assert sorted(after) == sorted(before) == [(trace_id(1), 8), (trace_id(2), 8)]
    assert stored_spans(service) == 16
    assert metric(service, "llm_d_tracing_duplicate_spans_total") == 32
    # Half new, half old in one call: only the new half is stored.
    mixed = export_request([2, 3]).SerializeToString()
    assert post(service, mixed).status_code == 200
    assert stored_spans(service) == 24
    assert metric(service, "llm_d_tracing_duplicate_spans_total") == 40


def _lock_spans(db_url: str):
    """Hold a write lock on the span table from another connection, as a stalled disk would."""
    engine = create_engine(db_url)
    conn = engine.connect()
    if engine.dialect.name == "sqlite":
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    else:
        conn.begin()
        conn.execute(text("LOCK TABLE span_chunks IN EXCLUSIVE MODE"))
    return engine, conn


def test_acknowledged_only_after_commit_and_backpressure(db_url: str) -> None:
    settings = settings_for(db_url, max_pending_spans=8, retry_after_s=3)
    with Service(settings) as svc:
        engine, lock = _lock_spans(db_url)
        released = False
        try:
            with ThreadPoolExecutor(1) as pool:
                first = pool.submit(post, svc, export_request([1]).SerializeToString())
                wait_for(lambda: svc.runtime.writer.pending == 8, what="export queued at the writer")
                # The writer cannot commit, so the caller has no answer yet.
                assert not first.done()
                r = post(svc, export_request([2]).SerializeToString())
                assert r.status_code == 429 and r.headers["retry-after"] == "3"
                with grpc.insecure_channel(svc.grpc_endpoint) as channel:
                    stub = trace_service_pb2_grpc.TraceServiceStub(channel)
                    with pytest.raises(grpc.RpcError) as err:
                        stub.Export(export_request([3]), timeout=30)
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                details = dict(err.value.trailing_metadata())["grpc-status-details-bin"]
                retry = error_details_pb2.RetryInfo()
                assert status_pb2.Status.FromString(details).details[0].Unpack(retry)
                assert retry.retry_delay.seconds == 3
                ready = httpx.get(svc.http_url + "/readyz")
                assert ready.status_code == 503 and "writer: behind" in ready.json()["problems"]
                lock.rollback()
                released = True
                assert first.result(timeout=60).status_code == 200
        finally:
            if not released:
                lock.rollback()
            lock.close()
            engine.dispose()
        assert stored_spans(svc) == 8
        assert metric(svc, "llm_d_tracing_throttled_exports_total", 'protocol="http"') == 1
        assert metric(svc, "llm_d_tracing_throttled_exports_total", 'protocol="grpc"') == 1
        assert httpx.get(svc.http_url + "/readyz").status_code == 200


def test_concurrent_exports_share_commits_and_all_land(service: Service) -> None:
    bodies = [export_request(list(range(n * 4, n * 4 + 4))).SerializeToString() for n in range(12)]
    with ThreadPoolExecutor(6) as pool:
        codes = list(pool.map(lambda b: post(service, b).status_code, bodies))
    assert codes == [200] * 12
    assert stored_spans(service) == 12 * 4 * 8
    assert service.runtime.writer.commits <= 12
    tid = trace_id(47)
    spans = httpx.get(f"{service.http_url}/api/v1/traces/{tid}").json()["spans"]
    assert {s["span_id"] for s in spans} == {span_id(47, i) for i in range(8)}


def test_stop_answers_in_flight_exports(db_url: str) -> None:
    """Stopping the service while exports are in flight commits them before closing."""
    svc = Service(settings_for(db_url)).start()
    results: list[int] = []

    def send() -> None:
        results.append(post(svc, export_request([5]).SerializeToString()).status_code)

    t = threading.Thread(target=send)
    t.start()
    t.join()
    svc.stop()
    assert results == [200]


def test_grpc_malformed_payload_is_invalid_argument(service: Service) -> None:
    with grpc.insecure_channel(service.grpc_endpoint) as channel:
        export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
        with pytest.raises(grpc.RpcError) as err:
            export(b"\xff\xff\xff\xff not protobuf", timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "protobuf" in err.value.details()
    assert stored_spans(service) == 0


def test_content_is_never_stored(service: Service) -> None:
    req = export_request([1])
    span = req.resource_spans[0].scope_spans[0].spans[0]
    secret = "PROMPT-TEXT-THAT-MUST-NOT-BE-STORED"
    span.attributes.add(key="gen_ai.input.messages").value.string_value = secret
    event = span.events.add(name="gen_ai.choice", time_unix_nano=span.start_time_unix_nano)
    event.attributes.add(key="gen_ai.output.messages").value.string_value = secret
    event.attributes.add(key="finish_reason").value.string_value = "stop"
    assert post(service, req.SerializeToString()).status_code == 200
    spans = httpx.get(f"{service.http_url}/api/v1/traces/{trace_id(1)}").json()["spans"]
    root = next(s for s in spans if s["span_id"] == span_id(1, 0))
    assert "gen_ai.input.messages" not in root["attributes"]
    assert root["events"][0]["attributes"] == {"finish_reason": "stop"}
    with service.runtime.engine.connect() as conn:
        blobs = conn.execute(select(span_chunks.c.body)).scalars().all()
    assert blobs and not any(secret.encode() in bytes(b) for b in blobs)


def test_small_exports_are_parsed_inline_and_large_ones_in_a_worker_thread(db_url: str) -> None:
    """Both routes give the same answers: the threshold only decides where the parse runs."""
    small = export_request([1]).SerializeToString()
    large = export_request([2, 3, 4]).SerializeToString()
    with Service(settings_for(db_url, parse_inline_max_bytes=len(small))) as svc:
        calls: list[str] = []
        exports = svc.runtime.exports
        rows = exports.rows

        def spy(*args: Any) -> Any:
            calls.append(threading.current_thread().name)
            return rows(*args)

        exports.rows = spy  # type: ignore[method-assign]
        try:
            assert post(svc, small).status_code == 200
            assert post(svc, large).status_code == 200
            assert post(svc, b"\xff" * (len(small) + 1)).status_code == 400
            assert post(svc, b"\xff" * 10).status_code == 400
        finally:
            del exports.rows
        assert stored_spans(svc) == 32
    inline, threaded, threaded_bad, inline_bad = calls
    assert inline == inline_bad and threaded == threaded_bad
    assert inline != threaded  # the event loop's thread, then a worker thread
