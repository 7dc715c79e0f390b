"""OTLP trace payloads (protobuf or OTLP/JSON) to `Span`s, with per-span validation.

A malformed payload raises `PayloadError` (the receiver answers 400); a well-formed payload
with some invalid spans yields the valid ones plus a count and a message for
`partial_success`, as the OTLP specification asks. Content attributes (prompt and
completion text) are dropped here, before anything is stored.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from railtrace.model import Span
from railtrace_tracing import semconv

# Bounds that keep one hostile span from costing more than it is worth.
MAX_ATTR_VALUE_CHARS = 8192
MAX_ARRAY_ITEMS = 1024
MAX_DEPTH = 8
MAX_ATTRIBUTES = 256
MAX_EVENTS = 128
# Anything outside [2000-01-01, 2200-01-01) is a broken clock or a hostile sender.
MIN_TIME_NS = 946_684_800 * 10**9
MAX_TIME_NS = 7_258_118_400 * 10**9


class PayloadError(ValueError):
    """The whole payload cannot be decoded (maps to HTTP 400 / gRPC INVALID_ARGUMENT)."""


@dataclass(slots=True)
class DecodeResult:
    spans: list[Span] = field(default_factory=list)
    rejected: int = 0
    errors: list[str] = field(default_factory=list)
    dropped_content_attributes: int = 0

    @property
    def error_message(self) -> str:
        if not self.errors:
            return ""
        head = "; ".join(self.errors[:5])
        more = len(self.errors) - 5
        return head + (f"; and {more} more" if more > 0 else "")


def parse_protobuf(body: bytes) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except (DecodeError, RuntimeError, ValueError) as exc:  # upb raises DecodeError
        raise PayloadError(f"not an OTLP ExportTraceServiceRequest protobuf: {exc}") from None
    return request


def _hex_to_b64(value: Any, what: str) -> Any:
    """OTLP/JSON carries ids as hex; protobuf's JSON mapping wants base64."""
    if not isinstance(value, str) or value == "":
        return value
    try:
        return base64.b64encode(bytes.fromhex(value)).decode("ascii")
    except ValueError:
        raise PayloadError(f"{what} {value[:40]!r} is not hex, as OTLP/JSON requires") from None


def parse_json(body: bytes) -> ExportTraceServiceRequest:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise PayloadError(f"invalid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise PayloadError("OTLP/JSON body must be an object with `resourceSpans`")
    for rs in _dicts(document.get("resourceSpans")):
        for ss in _dicts(rs.get("scopeSpans")):
            for span in _dicts(ss.get("spans")):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = _hex_to_b64(span[key], key)
                for link in _dicts(span.get("links")):
                    for key in ("traceId", "spanId"):
                        if key in link:
                            link[key] = _hex_to_b64(link[key], f"link {key}")
    request = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(document, request, ignore_unknown_fields=True, max_recursion_depth=64)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise PayloadError(f"not an OTLP/JSON ExportTraceServiceRequest: {str(exc)[:300]}") from None
    return request


def _dicts(value: Any) -> Iterable[dict[str, Any]]:
    if isinstance(value, list):
        return (item for item in value if isinstance(item, dict))
    return ()


def any_value(value: AnyValue, depth: int = 0) -> Any:
    """AnyValue to a bounded plain Python value."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        s = value.string_value
        return s if len(s) <= MAX_ATTR_VALUE_CHARS else s[:MAX_ATTR_VALUE_CHARS]
    if kind == "bool_value":
        return value.bool_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        return value.double_value
    if kind == "array_value":
        if depth >= MAX_DEPTH:
            return None
        return [any_value(v, depth + 1) for v in value.array_value.values[:MAX_ARRAY_ITEMS]]
    if kind == "kvlist_value":
        if depth >= MAX_DEPTH:
            return None
        return {kv.key: any_value(kv.value, depth + 1) for kv in value.kvlist_value.values[:MAX_ATTRIBUTES]}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value[:MAX_ATTR_VALUE_CHARS]).decode("ascii")
    return None


def attributes(items: Sequence[Any], drop: frozenset[str], result: DecodeResult) -> dict[str, Any]:
    """KeyValues to a bounded dict, without the `drop` keys (counted). Strings, most values,
    are read here rather than through `any_value`: this runs for every stored span read."""
    out: dict[str, Any] = {}
    for kv in items[:MAX_ATTRIBUTES]:
        key = kv.key
        if key in drop:
            result.dropped_content_attributes += 1
            continue
        value = kv.value
        s = value.string_value  # "" unless a non-empty string is set: no oneof lookup for strings
        if s:
            out[key] = s if len(s) <= MAX_ATTR_VALUE_CHARS else s[:MAX_ATTR_VALUE_CHARS]
        else:
            out[key] = any_value(value)
    return out


DEFAULT_DROP = frozenset(semconv.CONTENT_ATTRIBUTES)


def spans_from_request(
    request: ExportTraceServiceRequest, drop: frozenset[str] = DEFAULT_DROP
) -> DecodeResult:
    """Flatten an export request into spans, rejecting (and counting) the invalid ones."""
    result = DecodeResult()
    for rs in request.resource_spans:
        resource = attributes(rs.resource.attributes, drop, result)
        service = resource.get(semconv.RES_SERVICE_NAME)
        service_name = service if isinstance(service, str) else "unknown_service"
        for ss in rs.scope_spans:
            scope_name = ss.scope.name
            for s in ss.spans:
                problem = _invalid(s)
                if problem:
                    result.rejected += 1
                    if len(result.errors) < 50:
                        result.errors.append(problem)
                    continue
                events = [
                    {
                        "name": e.name[:256],
                        "time_ns": e.time_unix_nano,
                        "attributes": attributes(e.attributes, drop, result),
                    }
                    for e in s.events[:MAX_EVENTS]
                ]
                result.spans.append(
                    Span(
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex() if s.parent_span_id else None,
                        name=s.name[:512],
                        kind=int(s.kind),
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        status_code=int(s.status.code),
                        status_message=s.status.message[:1024],
                        service_name=service_name,
                        scope_name=scope_name,
                        attributes=attributes(s.attributes, drop, result),
                        resource=resource,
                        events=events,
                    )
                )
    return result


def _invalid(s: Any) -> str | None:
    if len(s.trace_id) != 16 or s.trace_id == b"\0" * 16:
        return f"span {s.span_id.hex() or '?'}: trace_id must be 16 non-zero bytes"
    if len(s.span_id) != 8 or s.span_id == b"\0" * 8:
        return f"span in trace {s.trace_id.hex()}: span_id must be 8 non-zero bytes"
    if s.parent_span_id and len(s.parent_span_id) != 8:
        return f"span {s.span_id.hex()}: parent_span_id must be empty or 8 bytes"
    if not (MIN_TIME_NS <= s.start_time_unix_nano < MAX_TIME_NS):
        return f"span {s.span_id.hex()}: start time {s.start_time_unix_nano} is out of range"
    if not (MIN_TIME_NS <= s.end_time_unix_nano < MAX_TIME_NS):
        return f"span {s.span_id.hex()}: end time {s.end_time_unix_nano} is out of range"
    if s.end_time_unix_nano < s.start_time_unix_nano:
        return f"span {s.span_id.hex()}: ends before it starts"
    return None


def decode(body: bytes, content_type: str, drop: frozenset[str] = DEFAULT_DROP) -> DecodeResult:
    """Decode an already-decompressed body of the given media type."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/x-protobuf":
        request = parse_protobuf(body)
    elif media == "application/json":
        request = parse_json(body)
    else:
        raise PayloadError(f"unsupported content type {media!r}")
    return spans_from_request(request, drop)


def hex_id(raw: str) -> bytes:
    try:
        return binascii.unhexlify(raw)
    except (binascii.Error, ValueError):
        raise PayloadError(f"{raw[:40]!r} is not a hex id") from None
