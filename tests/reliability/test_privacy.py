"""Privacy: prompt and completion text never reaches the database, by default and with a
configured list, whatever the protocol and wherever the attribute sits (resource, span,
event, link). Checked on the stored bytes themselves, not through the API."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import orjson
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sqlalchemy import create_engine, inspect, select
from sqlalchemy import table as sa_table

from railtrace.server.runner import Service
from railtrace.settings import Settings
from tests.reliability.reliability_helpers import EXPORT_PATH, JSON, PROTOBUF

T0 = 1_790_000_000 * 10**9
SECRET = "TOP-SECRET-PROMPT-7f3a"
CONTENT_KEYS = [
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.prompt",
    "gen_ai.completion",
    "gen_ai.prompt.0.content",
    "gen_ai.completion.0.content",
    "llm.input_messages.0.message.content",
    "llm.output_messages.0.message.content",
    "input.value",
    "output.value",
]


def request_with_content(n: int, keys: list[str]) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "vllm-decode"
    for k in keys:
        rs.resource.attributes.add(key=k).value.string_value = SECRET
    s = rs.scope_spans.add().spans.add()
    s.trace_id = n.to_bytes(16, "big")
    s.span_id = n.to_bytes(8, "big")
    s.name = "llm_request"
    s.start_time_unix_nano, s.end_time_unix_nano = T0, T0 + 1000
    s.attributes.add(key="gen_ai.request.model").value.string_value = "llama"
    for k in keys:
        s.attributes.add(key=k).value.string_value = SECRET
        s.attributes.add(key=k + "_list").value.array_value.values.add().string_value = "keep"
    e = s.events.add(name="gen_ai.choice", time_unix_nano=T0 + 10)
    link = s.links.add(trace_id=(n + 1).to_bytes(16, "big"), span_id=(n + 1).to_bytes(8, "big"))
    for k in keys:
        e.attributes.add(key=k).value.string_value = SECRET
        link.attributes.add(key=k).value.string_value = SECRET
    e.attributes.add(key="finish_reason").value.string_value = "stop"
    return req


def send_all_ways(svc: Service, keys: list[str]) -> None:
    """The same content over HTTP protobuf, HTTP JSON (with hex ids) and gRPC."""
    r = httpx.post(
        svc.http_url + "/v1/traces",
        content=request_with_content(1, keys).SerializeToString(),
        headers={"content-type": PROTOBUF},
    )
    assert r.status_code == 200
    doc = json_format.MessageToDict(request_with_content(2, keys))
    for rs in doc["resourceSpans"]:
        for s in rs["scopeSpans"][0]["spans"]:
            s["traceId"], s["spanId"] = (2).to_bytes(16, "big").hex(), (2).to_bytes(8, "big").hex()
            for link in s.get("links", []):
                link["traceId"], link["spanId"] = (3).to_bytes(16, "big").hex(), (3).to_bytes(8, "big").hex()
    # A key spelled with JSON escapes is the same key.
    body = orjson.dumps(doc).replace(b'"gen_ai.input.messages"', b'"gen_ai.input\\u002emessages"')
    r = httpx.post(svc.http_url + "/v1/traces", content=body, headers={"content-type": JSON})
    assert r.status_code == 200, r.text
    with grpc.insecure_channel(svc.grpc_endpoint) as ch:
        ch.unary_unary(EXPORT_PATH)(request_with_content(4, keys).SerializeToString(), timeout=30)


def database_bytes(db_url: str) -> bytes:
    """Everything every table holds, as bytes."""
    engine = create_engine(db_url)
    out = bytearray()
    try:
        with engine.connect() as conn:
            for name in inspect(conn).get_table_names():
                cols = [c["name"] for c in inspect(conn).get_columns(name)]
                t = sa_table(name, *[__import__("sqlalchemy").column(c) for c in cols])
                for row in conn.execute(select(t)):
                    for v in row:
                        out += v if isinstance(v, (bytes, bytearray, memoryview)) else str(v).encode()
    finally:
        engine.dispose()
    return bytes(out)


def settings(db_url: str, **kw: object) -> Settings:
    return Settings(db=db_url, port=0, grpc_port=0, topology=[], quiet_period_s=0.2, **kw)


def test_content_never_stored_by_default(db_url: str, tmp_path: Path) -> None:
    with Service(settings(db_url)) as svc:
        send_all_ways(svc, CONTENT_KEYS)
        spans = httpx.get(f"{svc.http_url}/api/v1/traces/{1:032x}").json()["spans"]
        assert spans and spans[0]["events"][0]["attributes"] == {"finish_reason": "stop"}
        assert spans[0]["attributes"]["gen_ai.request.model"] == "llama"
    stored = database_bytes(db_url)
    assert b"llama" in stored and b"keep" in stored  # the check can see attributes at all
    assert SECRET.encode() not in stored
    if db_url.startswith("sqlite:///"):  # not even in free pages or the write-ahead log
        for f in Path(db_url.removeprefix("sqlite:///")).parent.glob("*.db*"):
            assert SECRET.encode() not in f.read_bytes(), f


def test_drop_list_is_configurable(db_url: str) -> None:
    custom = ["app.user.email", "app.secret.*"]
    with Service(settings(db_url, drop_attributes=custom)) as svc:
        send_all_ways(svc, ["app.user.email", "app.secret.token", "gen_ai.input.messages"])
        assert SECRET.encode() not in database_bytes(db_url)
        # Not in the configured list (which replaces the default prefixes): kept, as configured.
        kept = request_with_content(9, ["gen_ai.prompt.0.content"])
        r = httpx.post(
            svc.http_url + "/v1/traces", content=kept.SerializeToString(), headers={"content-type": PROTOBUF}
        )
        assert r.status_code == 200
        span = httpx.get(f"{svc.http_url}/api/v1/traces/{9:032x}").json()["spans"][0]
    assert span["attributes"]["gen_ai.prompt.0.content"] == SECRET
