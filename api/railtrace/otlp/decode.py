"""OTLP trace payloads (protobuf or OTLP/JSON) to messages, and attribute values to bounded
Python values: the parsing every other part of the codec builds on.

A malformed payload raises `PayloadError` (the receiver answers 400); a compressed body that
would inflate past the limit raises `TooLarge` (413) before it is inflated in full. Attribute
values are cut to `railtrace.otlp.bounds`, and content attributes (prompt and completion text)
are left out wherever attributes are turned into values.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from railtrace.model import Span
from railtrace.otlp.bounds import (
    INFLATE_STEP,
    MAX_ARRAY_ITEMS,
    MAX_ATTR_VALUE_CHARS,
    MAX_ATTRIBUTES,
    MAX_DEPTH,
    MAX_GZIP_MEMBERS,
)
from railtrace_tracing import semconv


class PayloadError(ValueError):
    """The whole payload cannot be decoded (maps to HTTP 400 / gRPC INVALID_ARGUMENT)."""


class TooLarge(Exception):
    """A body inflates past the size limit (HTTP 413)."""


def inflate_bounded(
    data: bytes | bytearray, encoding: str, limit: int, max_members: int = MAX_GZIP_MEMBERS
) -> bytes:
    """Decompress gzip/deflate, stopping as soon as the output would exceed `limit` (TooLarge).

    Linear in the body: fed to zlib a step at a time through a memoryview, never the rest of
    the body again for each gzip member (a 16 MiB body of 840,000 empty members took seconds
    of copying that way), and at most `max_members` members (PayloadError beyond)."""
    # HTTP "deflate" is zlib-wrapped, but some clients send raw deflate.
    wbits = [16 + zlib.MAX_WBITS] if encoding in ("gzip", "x-gzip") else [zlib.MAX_WBITS, -zlib.MAX_WBITS]
    last_error: zlib.error | None = None
    for wb in wbits:
        try:
            return _inflate(data, wb, limit, max_members)
        except zlib.error as exc:
            last_error = exc
    raise PayloadError(f"body is not valid {encoding} data: {last_error}")


def _inflate(data: bytes | bytearray, wbits: int, limit: int, max_members: int) -> bytes:
    out = bytearray()
    view = memoryview(data)
    pos = 0
    members = 0
    gzip = wbits > zlib.MAX_WBITS
    while True:
        members += 1
        if members > max_members:
            raise PayloadError(f"gzip body has more than {max_members} members")
        d = zlib.decompressobj(wbits)
        while not d.eof:
            if pos >= len(view):
                raise zlib.error("compressed data is truncated")
            piece = view[pos : pos + INFLATE_STEP]
            out += d.decompress(piece, limit + 1 - len(out))
            if len(out) > limit or d.unconsumed_tail:  # the output bound was reached
                raise TooLarge
            pos += len(piece) - len(d.unused_data)
        if pos >= len(view) or not gzip:
            return bytes(out)  # zlib and raw deflate streams end here; trailing bytes ignored


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


def hex_id(raw: str) -> bytes:
    try:
        return binascii.unhexlify(raw)
    except (binascii.Error, ValueError):
        raise PayloadError(f"{raw[:40]!r} is not a hex id") from None
