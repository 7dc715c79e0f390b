"""Hypothesis strategies for hostile OTLP trace exports, and the outcome each one must get.

Inputs come in three kinds: well-formed requests whose spans carry hostile values (odd ids,
absurd times, huge or deeply nested attributes, values of the wrong type under the keys the
service parses itself), the same requests with their bytes mangled, and arbitrary JSON. The
expected answer is worked out independently of the service: the protobuf library decides
whether bytes are a request at all, and the OTLP span rules (16/8-byte non-zero ids, times
in range, end after start) decide how many spans `partial_success` must reject.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from railtrace_tracing import semconv

MIN_TIME_NS = 946_684_800 * 10**9  # 2000-01-01: the receiver's documented accepted range
MAX_TIME_NS = 7_258_118_400 * 10**9  # 2200-01-01 (exclusive)
U64 = 2**64 - 1

# Keys whose values the service reads straight from the wire (request keys) or must drop.
SPECIAL_KEYS = [
    "gen_ai.request.id",
    "llm_d.pd_proxy.request_id",
    "llm_d.kv_transfer.request_id",
    "http.request.header.x-request-id",
    "x-request-id",
    "service.name",
    *semconv.CONTENT_ATTRIBUTES,
]

text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)
keys = st.one_of(text, st.sampled_from(SPECIAL_KEYS))
big_text = st.integers(0, 12_000).map(lambda n: "x" * n)


def _leaf() -> st.SearchStrategy[AnyValue]:
    return st.one_of(
        text.map(lambda s: AnyValue(string_value=s)),
        big_text.map(lambda s: AnyValue(string_value=s)),
        st.booleans().map(lambda b: AnyValue(bool_value=b)),
        st.integers(-(2**63), 2**63 - 1).map(lambda i: AnyValue(int_value=i)),
        st.floats().map(lambda f: AnyValue(double_value=f)),
        st.binary(max_size=64).map(lambda b: AnyValue(bytes_value=b)),
        st.just(AnyValue()),  # no value at all
    )


def array_value(items: list[AnyValue]) -> AnyValue:
    v = AnyValue()
    v.array_value.values.extend(items)
    return v


def kvlist_value(items: list[tuple[str, AnyValue]]) -> AnyValue:
    v = AnyValue()
    v.kvlist_value.values.extend(KeyValue(key=k, value=x) for k, x in items)
    return v


def varint(n: int) -> bytes:
    """An integer as a protobuf varint, negative ones as 64-bit two's complement (ten bytes),
    as protobuf writes an int64: for hand-built wire bytes."""
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _nested(depth: int) -> AnyValue:
    """Built top-down in place: copying a deep message would hit protobuf's own depth limit."""
    top = AnyValue()
    cur = top
    for i in range(depth):
        cur = cur.array_value.values.add() if i % 2 else cur.kvlist_value.values.add(key="k").value
    cur.string_value = "bottom"
    return top


# Mostly small values (so that many inputs run per minute), sometimes deep or long ones.
any_values = st.one_of(
    st.recursive(
        _leaf(),
        lambda inner: st.one_of(
            st.lists(inner, max_size=6).map(array_value),
            st.lists(st.tuples(keys, inner), max_size=6).map(kvlist_value),
        ),
        max_leaves=6,
    ),
    st.integers(0, 38).map(_nested),  # deep; deeper than protobuf allows is a targeted test
    st.integers(0, 3000).map(lambda n: array_value([AnyValue(int_value=i) for i in range(n)])),
)
key_values = st.lists(st.tuples(keys, any_values), max_size=3).map(
    lambda kvs: [KeyValue(key=k, value=v) for k, v in kvs]
)

trace_ids = st.one_of(
    st.binary(min_size=16, max_size=16),
    st.binary(max_size=24),
    st.just(b""),
    st.just(b"\0" * 16),
)
valid_trace_ids = st.binary(min_size=16, max_size=16).filter(any)
valid_span_ids = st.binary(min_size=8, max_size=8).filter(any)
span_ids = st.one_of(
    st.binary(min_size=8, max_size=8), st.binary(max_size=12), st.just(b""), st.just(b"\0" * 8)
)
times = st.one_of(
    st.integers(MIN_TIME_NS, MAX_TIME_NS - 1),
    st.integers(0, U64),
    st.sampled_from([0, 1, MIN_TIME_NS - 1, MIN_TIME_NS, MAX_TIME_NS - 1, MAX_TIME_NS, U64]),
)


@st.composite
def export_requests(draw: st.DrawFn) -> ExportTraceServiceRequest:
    """A well-formed export request whose spans carry hostile values."""
    req = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        rs = req.resource_spans.add()
        rs.resource.attributes.extend(draw(key_values))
        for _ in range(draw(st.integers(1, 2))):
            ss = rs.scope_spans.add()
            ss.scope.name = draw(text)
            for _ in range(draw(st.integers(0, 3))):
                s = ss.spans.add()
                sane = draw(st.booleans())  # half the spans valid, so the storing path is fuzzed too
                s.trace_id = draw(valid_trace_ids if sane else trace_ids)
                s.span_id = draw(valid_span_ids if sane else span_ids)
                s.parent_span_id = draw(st.one_of(st.just(b""), valid_span_ids if sane else span_ids))
                s.name = draw(st.one_of(text, big_text))
                s.kind = draw(st.integers(0, 5))
                start = draw(st.integers(MIN_TIME_NS, MAX_TIME_NS - 10**13) if sane else times)
                s.start_time_unix_nano = start
                ends = st.integers(0, 10**12).map(lambda d, a=start: min(a + d, U64))
                s.end_time_unix_nano = draw(ends if sane else st.one_of(times, ends))
                s.attributes.extend(draw(key_values))
                for _ in range(draw(st.integers(0, 1))):
                    e = s.events.add(name=draw(text), time_unix_nano=draw(times))
                    e.attributes.extend(draw(key_values))
                for _ in range(draw(st.integers(0, 1))):
                    link = s.links.add(trace_id=draw(trace_ids), span_id=draw(span_ids))
                    link.attributes.extend(draw(key_values))
                s.status.code = draw(st.integers(0, 2))
                s.status.message = draw(text)
    return req


def span_valid(s: Any) -> bool:
    """The OTLP rules for one span, written out independently of the service."""
    if len(s.trace_id) != 16 or not any(s.trace_id):
        return False
    if len(s.span_id) != 8 or not any(s.span_id):
        return False
    if s.parent_span_id and len(s.parent_span_id) != 8:
        return False
    for t in (s.start_time_unix_nano, s.end_time_unix_nano):
        if not MIN_TIME_NS <= t < MAX_TIME_NS:
            return False
    return s.end_time_unix_nano >= s.start_time_unix_nano


@dataclass
class Expected:
    """What the receiver must answer: a 4xx status, or 200 with this many rejected spans."""

    status: int
    rejected: int = 0
    accepted: set[tuple[str, str]] = field(default_factory=set)


def expect_for(req: ExportTraceServiceRequest | None) -> Expected:
    if req is None:
        return Expected(400)
    exp = Expected(200)
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for s in ss.spans:
                if span_valid(s):
                    exp.accepted.add((s.trace_id.hex(), s.span_id.hex()))
                else:
                    exp.rejected += 1
    return exp


def parse_or_none(body: bytes) -> ExportTraceServiceRequest | None:
    try:
        return ExportTraceServiceRequest.FromString(body)
    except Exception:
        return None


@st.composite
def mangled(draw: st.DrawFn, data: bytes) -> bytes:
    """Bytes with flips, inserts, deletions and truncation: broken varints, lengths, UTF-8."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "utf8"]))
        pos = draw(st.integers(0, max(len(buf) - 1, 0)))
        if op == "flip" and buf:
            buf[pos] ^= draw(st.integers(1, 255))
        elif op == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and buf:
            del buf[pos : pos + draw(st.integers(1, 8))]
        elif op == "truncate":
            del buf[pos:]
        elif op == "utf8" and buf:
            buf[pos] = draw(st.sampled_from([0x80, 0xC0, 0xED, 0xF5, 0xFF]))
    return bytes(buf)


def to_otlp_json(req: ExportTraceServiceRequest) -> dict[str, Any]:
    """OTLP/JSON: the protobuf JSON mapping with ids as hex instead of base64."""
    doc = json_format.MessageToDict(req)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for s in ss.get("spans", []):
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in s:
                        s[k] = base64.b64decode(s[k]).hex()
                for link in s.get("links", []):
                    for k in ("traceId", "spanId"):
                        if k in link:
                            link[k] = base64.b64decode(link[k]).hex()
    return doc


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), text),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)),
    max_leaves=15,
)
OTLP_JSON_KEYS = [
    "resourceSpans",
    "scopeSpans",
    "spans",
    "resource",
    "attributes",
    "traceId",
    "spanId",
    "parentSpanId",
    "startTimeUnixNano",
    "endTimeUnixNano",
    "events",
    "links",
    "value",
    "stringValue",
    "arrayValue",
    "kvlistValue",
    "values",
    "key",
    "intValue",
    "name",
    "status",
]


@st.composite
def hostile_json_documents(draw: st.DrawFn) -> Any:
    """OTLP/JSON shaped documents with random subtrees swapped for random JSON."""
    doc: Any = to_otlp_json(draw(export_requests()))
    for _ in range(draw(st.integers(1, 3))):
        path: list[Any] = []
        node = doc
        while isinstance(node, (dict, list)) and node and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
            path.append(key)
            node = node[key]
        replacement = draw(st.one_of(json_values, st.sampled_from(["zz", "", "0" * 31, "1" * 33])))
        if not path:
            doc = {draw(st.sampled_from(OTLP_JSON_KEYS)): replacement} if draw(st.booleans()) else replacement
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = replacement
    return doc


def json_depth_ok(req: ExportTraceServiceRequest) -> bool:
    """Whether the protobuf JSON parser (depth limit 64, as the receiver uses) takes it."""
    try:
        json_format.ParseDict(
            json_format.MessageToDict(req), ExportTraceServiceRequest(), max_recursion_depth=64
        )
    except json_format.ParseError:
        return False
    return True


def message_depth(msg: Any) -> int:
    """Levels of nested messages (JSON parsers refuse documents past a depth limit)."""
    deepest = 0
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        items = value if isinstance(value, Sequence) or hasattr(value, "add") else [value]
        for item in items:
            deepest = max(deepest, message_depth(item))
    return deepest + 1
