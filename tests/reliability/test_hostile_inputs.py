"""Targeted hostile OTLP inputs the fuzzer reaches only by luck: oversized attributes and
arrays, nesting past the parser's limit, invalid UTF-8, bad ids and times, a gzip bomb, a
client that trickles its body, and wrong content types. Each gets its documented answer and
the service keeps serving everyone else."""

from __future__ import annotations

import socket
import threading
import zlib
from collections.abc import Iterator

import grpc
import httpx
import orjson
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from railtrace.server.runner import Service
from railtrace.settings import Settings
from tests.reliability.otlp_strategies import varint
from tests.reliability.reliability_helpers import EXPORT_PATH, JSON, PROTOBUF, peak_rss_bytes, post

T0 = 1_790_000_000 * 10**9
LIMIT = 4_000_000


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    db = tmp_path_factory.mktemp("hostile") / "h.db"
    s = Settings(
        db=f"sqlite:///{db}", port=0, grpc_port=0, topology=[], max_body_bytes=LIMIT, body_timeout_s=2.0
    )
    with Service(s) as service:
        yield service


@pytest.fixture(scope="module")
def client(svc: Service) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=svc.http_url, timeout=60) as c:
        yield c


def one_span(n: int, **fields: object) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    s = req.resource_spans.add().scope_spans.add().spans.add()
    s.trace_id = n.to_bytes(16, "big")
    s.span_id = n.to_bytes(8, "big")
    s.name = "hostile"
    s.start_time_unix_nano = T0
    s.end_time_unix_nano = T0 + 1000
    for k, v in fields.items():
        setattr(s, k, v)
    return req


def read_back(client: httpx.Client, n: int) -> dict:
    r = client.get(f"/api/v1/traces/{n:032x}")
    assert r.status_code == 200, r.text[:200]
    return r.json()["spans"][0]


def test_oversized_attribute_and_array_are_stored_bounded(client: httpx.Client) -> None:
    req = one_span(1)
    s = req.resource_spans[0].scope_spans[0].spans[0]
    s.attributes.add(key="big").value.string_value = "x" * 3_000_000
    arr = s.attributes.add(key="arr").value.array_value
    for i in range(50_000):
        arr.values.add().int_value = i
    assert post(client, req.SerializeToString()).status_code == 200
    span = read_back(client, 1)
    assert 0 < len(span["attributes"]["big"]) <= 8192
    assert 0 < len(span["attributes"]["arr"]) <= 1024


def _nested_bytes(depth: int) -> bytes:
    """An AnyValue nested `depth` array levels deep, built on the wire (protobuf's own builder
    refuses to copy messages this deep)."""
    value = b"\x0a\x01x"  # string_value "x"
    for _ in range(depth):
        inner = b"\x0a" + _len(value) + value  # ArrayValue.values
        value = b"\x2a" + _len(inner) + inner  # AnyValue.array_value
    return value


def _len(b: bytes) -> bytes:
    return varint(len(b))


def test_nesting_past_the_limit_is_refused_whole(svc: Service, client: httpx.Client) -> None:
    req = one_span(2)
    span_bytes = req.resource_spans[0].scope_spans[0].spans[0].SerializeToString()
    value = _nested_bytes(5000)
    kv = b"\x0a\x01k\x12" + _len(value) + value
    span_bytes += b"\x4a" + _len(kv) + kv  # Span.attributes (field 9)
    scope_spans = b"\x12" + _len(span_bytes) + span_bytes  # ScopeSpans.spans (field 2)
    resource_spans = b"\x12" + _len(scope_spans) + scope_spans  # ResourceSpans.scope_spans (2)
    body = b"\x0a" + _len(resource_spans) + resource_spans  # request.resource_spans (1)
    r = post(client, body)
    assert r.status_code == 400 and status_pb2.Status.FromString(r.content).message
    doc: object = {"stringValue": "x"}
    for _ in range(5000):
        doc = {"arrayValue": {"values": [doc]}}
    js = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "00" * 15 + "02",
                                "spanId": "00" * 7 + "02",
                                "attributes": [{"key": "k", "value": doc}],
                            }
                        ]
                    }
                ]
            }
        ]
    }
    r = post(client, _json_dumps_deep(js), ctype=JSON)
    assert r.status_code == 400 and r.json()["message"]
    with grpc.insecure_channel(svc.grpc_endpoint) as ch, pytest.raises(grpc.RpcError) as err:
        ch.unary_unary(EXPORT_PATH)(body, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def _json_dumps_deep(doc: object) -> bytes:
    """orjson and json refuse to *write* documents this deep; hostile clients do not."""
    parts: list[str] = []
    stack: list[object] = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, str) and item.startswith("\0"):
            parts.append(item[1:])
        elif isinstance(item, dict):
            parts.append("{")
            entries = list(item.items())
            stack.append("\0}")
            for i, (k, v) in reversed(list(enumerate(entries))):
                stack.append(v)
                stack.append("\0" + ("," if i else "") + orjson.dumps(k).decode() + ":")
        elif isinstance(item, list):
            parts.append("[")
            stack.append("\0]")
            for i, v in reversed(list(enumerate(item))):
                stack.append(v)
                if i:
                    stack.append("\0,")
        else:
            parts.append(orjson.dumps(item).decode())
    return "".join(parts).encode()


def test_invalid_utf8_is_400_in_both_formats(client: httpx.Client) -> None:
    good = one_span(3)
    good.resource_spans[0].scope_spans[0].spans[0].name = "AAAA"
    body = good.SerializeToString().replace(b"AAAA", b"A\xff\xfeA")
    r = post(client, body)
    assert r.status_code == 400
    js = b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"name":"\xff\xfe"}]}]}]}'
    assert post(client, js, ctype=JSON).status_code == 400


@pytest.mark.parametrize(
    "fields",
    [
        {"trace_id": b""},
        {"trace_id": b"\x01" * 15},
        {"trace_id": b"\x01" * 17},
        {"trace_id": b"\0" * 16},
        {"span_id": b""},
        {"span_id": b"\x01" * 7},
        {"span_id": b"\0" * 8},
        {"parent_span_id": b"\x01" * 3},
        {"start_time_unix_nano": 0},
        {"end_time_unix_nano": 2**64 - 1},
        {"start_time_unix_nano": T0 + 10**9},  # ends before it starts
    ],
)
def test_bad_ids_and_absurd_times_are_partial_success(client: httpx.Client, fields: dict) -> None:
    req = one_span(4, **fields)
    good = one_span(5)
    req.resource_spans[0].scope_spans[0].spans.append(good.resource_spans[0].scope_spans[0].spans[0])
    r = post(client, req.SerializeToString())
    assert r.status_code == 200
    resp = ExportTraceServiceResponse.FromString(r.content)
    assert resp.partial_success.rejected_spans == 1 and resp.partial_success.error_message
    read_back(client, 5)


def test_gzip_bomb_is_stopped_at_the_limit_without_inflating(client: httpx.Client) -> None:
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b"\0" * 2**20
    bomb = b"".join(comp.compress(chunk) for _ in range(256)) + comp.flush()  # 256 MiB inflated
    before = peak_rss_bytes()
    r = post(client, bomb, **{"content-encoding": "gzip"})
    assert r.status_code == 413
    assert peak_rss_bytes() - before < 100 * 2**20  # never inflated in full (256 MiB)
    assert client.get("/healthz").status_code == 200


def test_slow_client_trickling_its_body_is_cut_off_and_others_are_served(
    svc: Service, client: httpx.Client
) -> None:
    body = one_span(6).SerializeToString()
    host, port = svc.http_url.removeprefix("http://").split(":")
    stop = threading.Event()
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(
            f"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-type: {PROTOBUF}\r\n"
            f"content-length: {len(body) + 10_000}\r\n\r\n".encode()
        )

        def trickle() -> None:
            for b in body:
                if stop.wait(0.05):
                    return
                try:
                    sock.send(bytes([b]))
                except OSError:
                    return

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        # Meanwhile the service serves others.
        assert post(client, one_span(7).SerializeToString()).status_code == 200
        answer = sock.recv(4096)  # the server gives up on the body after body_timeout_s
        stop.set()
        t.join()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
    assert client.get("/readyz").status_code == 200


@pytest.mark.parametrize(
    "ctype,encoding,status",
    [
        ("text/plain", None, 415),
        ("application/xml", None, 415),
        ("", None, 415),
        ("application/grpc", None, 415),
        ("multipart/form-data; boundary=x", None, 415),
        (PROTOBUF, "br", 415),
        (PROTOBUF, "zstd", 415),
        (JSON, "gzip", 400),  # claims gzip, is not
    ],
)
def test_wrong_content_types_and_encodings(
    client: httpx.Client, ctype: str, encoding: str | None, status: int
) -> None:
    headers = {"content-encoding": encoding} if encoding else {}
    r = post(client, b"{}", ctype=ctype, **headers)
    assert r.status_code == status
