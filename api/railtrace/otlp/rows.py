"""OTLP protobuf spans <-> rows. Runs where the receiver hands over an export call, so the
writer only inserts.

What is a row and what is a blob: a trace's spans from one export call are one row (a chunk);
each span is kept as its own OTLP protobuf encoding, exactly as received (minus content
attributes), cut out of the call's bytes. Attributes are decoded, bounded and normalised
(`railtrace.normalize.normalize_span`) when spans are read, by the assembler and the API:
turning every attribute into Python values costs far more than the database insert. The
per-span work (grouping by trace, checks, request-id candidates) is done by the C accelerator
straight from the call's bytes when it is built (`rows_from_bytes`), else from the parsed call
in Python (`rows_from_request`); both give the same rows. Resource attribute sets repeat
across every span of a process; they are decoded once per export call and stored once, keyed
by a hash.
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass, field
from typing import Any

import orjson
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from railtrace.model import Span
from railtrace.normalize import normalize_request_id, normalize_span
from railtrace.normalize.table import KEY_ATTRIBUTES
from railtrace.otlp.accelerators import wirescan
from railtrace.otlp.bounds import (
    MAX_EVENT_NAME,
    MAX_EVENTS,
    MAX_KEY,
    MAX_NAME,
    MAX_SCOPE_NAME,
    MAX_SERVICE_NAME,
    MAX_STATUS_MESSAGE,
    MAX_TIME_NS,
    MIN_TIME_NS,
)
from railtrace.otlp.content import KeyScan
from railtrace.otlp.decode import DEFAULT_DROP, DecodeResult, attributes
from railtrace.otlp.validity import span_problem
from railtrace_tracing import semconv
from railtrace_tracing.semconv import RES_OTLP_CLAIMS, RES_OTLP_PEER

# A trace's spans from one export call: [trace_id, chunk_id, received_ns (set by the writer at
# commit), span_count, body, has_root]; the first five are the `span_chunks` columns.
ChunkRow = list[Any]
# A record of a chunk's body: the span's resource id, the length of its encoding, the encoding.
RECORD_HEADER = struct.Struct(">QI")
# A content attribute's key as the Python protobuf library writes it (`_rows_python` looks for
# it in spans it has just re-serialized): length byte, key, AnyValue tag.
CONTENT_NEEDLES = tuple(bytes([len(k)]) + k.encode() + b"\x12" for k in sorted(DEFAULT_DROP) if len(k) < 128)


@dataclass(slots=True)
class RowBatch:
    """Rows of one export call, ready for the writer: span chunks, resources, rejected spans."""

    chunks: list[ChunkRow] = field(default_factory=list)
    span_count: int = 0
    resources: dict[int, bytes] = field(default_factory=dict)
    keys: set[tuple[str, str]] = field(default_factory=set)  # (request key, trace id)
    rejected: int = 0
    errors: list[str] = field(default_factory=list)
    dropped_content_attributes: int = 0

    def __len__(self) -> int:
        return self.span_count

    @property
    def error_message(self) -> str:
        head = "; ".join(self.errors[:5])
        more = len(self.errors) - 5
        return head + (f"; and {more} more" if more > 0 else "")


def service_name_of(resource: dict[str, Any]) -> str:
    service = resource.get(semconv.RES_SERVICE_NAME)
    return (service if isinstance(service, str) else "unknown_service")[:MAX_SERVICE_NAME]


def chunk_id(body: bytes) -> int:
    """A chunk's id within its trace: a 63-bit hash of its body, so that an exporter's retry of
    the same call (the same bytes) stores nothing new. SHA-256, because CPUs with SHA
    instructions hash twice as fast with it as with BLAKE2b, and ingest hashes every byte."""
    return int.from_bytes(hashlib.sha256(body).digest()[:8], "big") >> 1


def chunk_records(body: bytes) -> list[tuple[int, bytes]]:
    """(resource id, span encoding) of each record of a chunk body. Raises ValueError on bad
    framing."""
    out = []
    pos, end = 0, len(body)
    unpack, size = RECORD_HEADER.unpack_from, RECORD_HEADER.size
    while pos < end:
        if pos + size > end:
            raise ValueError("span record header cut short")
        rid, n = unpack(body, pos)
        pos += size
        if pos + n > end:
            raise ValueError("span record runs past its chunk")
        out.append((rid, body[pos : pos + n]))
        pos += n
    return out


def head_of_chunk(row: ChunkRow, n: int) -> ChunkRow | None:
    """A chunk row of the first `n` spans of `row` (in the order the call sent them), with its
    own body, id and root mark; None when `row`'s body cannot be cut (bad framing). For the
    per-trace cap: a call that would pass it keeps the spans up to the cap."""
    try:
        records = chunk_records(row[4])[:n]
    except ValueError:
        return None
    if not records:
        return None
    pack = RECORD_HEADER.pack
    body = b"".join(pack(rid, len(enc)) + enc for rid, enc in records)
    root = bool(row[5]) and any(not PbSpan.FromString(enc).parent_span_id for _rid, enc in records)
    return [row[0], chunk_id(body), row[2], len(records), body, root]


def resource_key(resource: dict[str, Any], scope: str) -> tuple[int, bytes]:
    """A stable 63-bit id for a (resource attributes, scope) pair, and its JSON."""
    blob = orjson.dumps({"resource": resource, "scope": scope}, option=orjson.OPT_SORT_KEYS)
    digest = hashlib.blake2b(blob, digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1, blob


def _invalid(s: PbSpan) -> str | None:
    return span_problem(s.trace_id, s.span_id, s.parent_span_id, s.start_time_unix_nano, s.end_time_unix_nano)


def _strip_content(s: PbSpan) -> int:
    """Remove content attributes (prompt/completion text) from a span, its events and links."""
    dropped = 0
    containers = [s.attributes, *(e.attributes for e in s.events), *(link.attributes for link in s.links)]
    for container in containers:
        for i in range(len(container) - 1, -1, -1):
            if container[i].key in DEFAULT_DROP:
                del container[i]
                dropped += 1
    return dropped


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(buf):
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
    raise ValueError("truncated varint")


def _string_at(body: bytes, pos: int) -> str | None:
    """The string in the AnyValue that starts at `pos` (itself, or an array's first item)."""
    _, pos = _varint(body, pos)  # AnyValue length
    tag = body[pos] if pos < len(body) else 0
    if tag == 0x2A:  # array_value: take its first value
        _, pos = _varint(body, pos + 1)  # ArrayValue length
        if pos >= len(body) or body[pos] != 0x0A:
            return None
        _, pos = _varint(body, pos + 1)  # first AnyValue length
        tag = body[pos] if pos < len(body) else 0
    if tag != 0x0A:  # not a string_value
        return None
    n, pos = _varint(body, pos + 1)
    return body[pos : pos + n].decode("utf-8", "replace")


# A KeyValue's key on the wire: 0x0a <len> key. Finding these needles in the span's own
# encoding reads the join keys without decoding its attributes into Python. Where the value is
# depends on the encoder: the Python SDK (protobuf) writes fields in field order, the value
# after the key (`0x12 <len> AnyValue`); the Collector's pdata writes them in descending order,
# the value before it -- every span that reaches the service through a collector.
KEY_NEEDLES = tuple((a, b"\x0a" + bytes([len(a)]) + a.encode()) for a in KEY_ATTRIBUTES if len(a) < 128)


# After a key needle and the value's tag: AnyValue length, maybe an array wrapper, then a short
# string_value. Request ids are shorter than 128 bytes, so every length is one byte; longer
# values take the general varint path.
_SHORT_STRING = re.compile(rb"[\x00-\x7f](?:\x2a[\x00-\x7f]\x0a[\x00-\x7f])?\x0a([\x00-\x7f])", re.S)


def _value_after(body: bytes, pos: int) -> bytes | None:
    """The short string value of the KeyValue whose key ends at `pos`: after it (field order),
    else before it (`_value_before`)."""
    if pos >= len(body) or body[pos] != 0x12:
        return None
    m = _SHORT_STRING.match(body, pos + 1)
    if m:
        end = m.end()
        return body[end : end + m.group(1)[0]]
    try:
        value = _string_at(body, pos + 1)
    except (ValueError, IndexError):
        return None
    return value.encode() if value is not None else None


def value_before(body: bytes, key_at: int, lo: int = 0) -> bytes | None:
    """The string value written just before the key that starts at `key_at`, as the Collector
    encodes a KeyValue: `0x12 <n+2> 0x0a <n> value` then the key. Short strings only (n < 126);
    the C accelerator's `short_value_before` mirrors this byte for byte."""
    for n in range(126):
        start = key_at - n
        if start - 4 < lo:
            return None
        if body[start - 4 : start] == bytes((0x12, n + 2, 0x0A, n)):
            return body[start:key_at]
    return None


def _value_decoded(body: bytes, attr: str) -> bytes | None:
    """The value read the long way, by decoding the span: any field order, any length."""
    try:
        span = PbSpan.FromString(body)
    except DecodeError:
        return None
    for kv in span.attributes:
        if kv.key == attr:
            v = kv.value
            if v.HasField("array_value") and v.array_value.values:
                v = v.array_value.values[0]
            return v.string_value.encode() if v.HasField("string_value") else None
    return None


_KEY_FINDERS = tuple(needle for _attr, needle in KEY_NEEDLES)
_KEY_ATTR = {needle: attr for attr, needle in KEY_NEEDLES}


KeyPair = tuple[str | None, str | None]
_NO_KEY: KeyPair = (None, None)


def key_pair(text: str) -> KeyPair:
    """The stored keys of one raw id: its public form, and -- when it differs -- the key it
    stands for if it is vLLM's engine id (`<id>-<8 hex>`, docs/normalisation.md §5). Both are
    stored, so a trace holding only a KV connector's id is found by the public id's key; that
    only widens which traces assembly reads together, which joins on the attribute-aware keys
    (`span_request_keys`)."""
    key = normalize_request_id(text)
    key = key[:MAX_KEY] if key else None
    if key is None:
        return _NO_KEY
    short = normalize_request_id(text, engine_form=True)
    short = short[:MAX_KEY] if short else None
    return key, (short if short != key else None)


def _request_key(
    body: bytes, cache: dict[bytes, KeyPair], needles: tuple[bytes, ...] | None = None
) -> KeyPair:
    """The span's strongest join key (and its engine-id form), by the normalisation table's key
    attributes (in order).

    `cache` maps raw id bytes to their keys: a request's spans repeat the same ids.
    `needles`: the key needles worth looking for (those found in the span's scope), strongest
    first; by default all of them.
    """
    if needles is None:
        if b"request" not in body:  # every key attribute's name has it: rules most spans out
            return _NO_KEY
        needles = _KEY_FINDERS
    for needle in needles:
        at = body.find(needle)
        if at < 0:
            continue
        raw = _value_after(body, at + len(needle))
        if raw is None:
            raw = value_before(body, at)
        if raw is None:
            raw = _value_decoded(body, _KEY_ATTR[needle])
        if raw is None:
            continue
        pair = cache.get(raw)
        if pair is None:
            pair = cache[raw] = key_pair(raw.decode("utf-8", "replace"))
        if pair[0]:
            return pair
    return _NO_KEY


_CONTENT_SCAN = KeyScan(k.encode() for k in DEFAULT_DROP)


def may_hold_content(raw: bytes) -> bool:
    """Whether serialized OTLP bytes may carry a content attribute (prompt/completion text).

    One scan of the whole export call spares the per-span check when (as usual) none does.
    """
    return _CONTENT_SCAN(raw)


def _fields(buf: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited field of the message in
    buf[start:end]; fields of other wire types are skipped. Raises ValueError on bad framing."""
    out = []
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos)
        wire = tag & 7
        if wire == 2:
            n, pos = _varint(buf, pos)
            out.append((tag >> 3, pos, pos + n))
            pos += n
        elif wire == 0:
            _, pos = _varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise ValueError("unsupported wire type")
    if pos != end:
        raise ValueError("field runs past its message")
    return out


def _span_encodings(buf: bytes, start: int, end: int) -> list[bytes]:
    """The Span encodings (field 2) of the ScopeSpans message in buf[start:end].

    `_fields` specialised for the hot path: one-byte tags and lengths of up to two bytes are
    read inline (a span's length is one or two bytes); anything else takes `_fields`. Raises
    ValueError on bad framing, as `_fields` does.
    """
    out: list[Any] = []
    append = out.append
    pos = start
    while pos < end:
        tag = buf[pos]
        n = buf[pos + 1]
        if tag & 0x87 != 0x02 or (n & 0x80 and buf[pos + 2] & 0x80):
            return [buf[a:b] for f, a, b in _fields(buf, start, end) if f == 2]
        if n & 0x80:
            n = (n & 0x7F) | buf[pos + 2] << 7
            pos += 3
        else:
            pos += 2
        if tag == 0x12:
            append(buf[pos : pos + n])
        pos += n
    if pos != end:
        raise ValueError("field runs past its message")
    return out


def span_slices(raw: bytes) -> list[tuple[list[bytes], int, int]] | None:
    """Each span's own encoding, cut out of the export call's bytes, per scope in order, with
    where that scope's bytes start and end; None when the framing is not the plain one (the
    caller then re-encodes the parsed spans).

    Why: re-encoding every parsed span costs more than parsing the whole call; the bytes are
    already there. ExportTraceServiceRequest field 1 = ResourceSpans, its field 2 =
    ScopeSpans, its field 2 = Span.
    """
    try:
        out: list[tuple[list[bytes], int, int]] = []
        for f, a, b in _fields(raw, 0, len(raw)):
            if f != 1:
                continue
            for f2, a2, b2 in _fields(raw, a, b):
                if f2 == 2:
                    out.append((_span_encodings(raw, a2, b2), a2, b2))
    except (ValueError, IndexError):
        return None
    return out


def stamp_sender(resource: dict[str, Any], sender: str | None, claims: str | None = None) -> dict[str, Any]:
    """Record who sent a resource (`railtrace.otlp.peer`) and who vouches for its `k8s.pod.name`
    and `k8s.pod.ip` (`railtrace.otlp.claims`: a trusted collector, or the sender itself): the
    service's own observations, so a sender's values for the keys are replaced, never trusted.
    Identity resolution matches the address against the topology's pod IPs, and assembly
    believes a claim only where the sender agrees or a trusted collector vouches
    (docs/normalisation.md, "Identity"). The receivers always say `claims`; without it (spans
    loaded by other means) claims are read as before the key existed."""
    if sender:
        resource[RES_OTLP_PEER] = sender
    else:
        resource.pop(RES_OTLP_PEER, None)
    if claims:
        resource[RES_OTLP_CLAIMS] = claims
    else:
        resource.pop(RES_OTLP_CLAIMS, None)
    return resource


def _scopes(
    request: ExportTraceServiceRequest, batch: RowBatch, sender: str | None = None, claims: str | None = None
) -> list[tuple[int, Any]]:
    """(resource id, ScopeSpans) of each scope of the call, in order; the resources go into
    the batch. Resource attributes are decoded once per call, not per span."""
    result = DecodeResult()
    out: list[tuple[int, Any]] = []
    for rs in request.resource_spans:
        resource = stamp_sender(attributes(rs.resource.attributes, DEFAULT_DROP, result), sender, claims)
        for ss in rs.scope_spans:
            rid, blob = resource_key(resource, ss.scope.name[:MAX_SCOPE_NAME])
            batch.resources[rid] = blob
            out.append((rid, ss))
    batch.dropped_content_attributes += result.dropped_content_attributes
    return out


def rows_from_request(
    request: ExportTraceServiceRequest,
    raw: bytes | None = None,
    content_free: bool = False,
    sender: str | None = None,
    claims: str | None = None,
) -> RowBatch:
    """Rows for every valid span of a parsed export request; invalid spans are counted with a
    reason. The Python path: `rows_from_bytes` gives the same rows without parsing the call
    when the C accelerator is built and the call is in the plain shape.

    A trace's spans from one call become one chunk row: a span's own encoding is a record of
    the chunk's body, next to its resource id. `raw` is the request's own encoding when the
    caller has it: span encodings are cut out of it (when it holds no content attributes) and
    it is scanned once for content attributes, unless the caller has ruled them out
    (`content_free`).
    """
    batch = RowBatch()
    check_content = not content_free and may_hold_content(
        raw if raw is not None else request.SerializeToString()
    )
    _rows_python(raw, _scopes(request, batch, sender, claims), check_content, batch)
    return batch


def rows_from_bytes(
    raw: bytes, content_free: bool = False, sender: str | None = None, claims: str | None = None
) -> RowBatch | None:
    """Rows for an export call straight from its bytes, without the protobuf library parsing
    its spans: the C accelerator checks that the library would parse each of them (field
    shapes, UTF-8, nesting) while it builds the rows, and only the few resource and scope
    messages are parsed here.

    None when the accelerator is not built, the call may carry content attributes, or anything
    about it is unusual; the caller then parses the call (and raises its `PayloadError`) and
    builds the rows from the parsed message. Why: parsing every span into protobuf objects was
    the largest cost left in ingest once the rows were built in C.
    """
    if wirescan is None or (not content_free and may_hold_content(raw)):
        return None
    listed = wirescan.scopes(raw)
    if listed is None:
        return None
    batch = RowBatch()
    result = DecodeResult()
    resources: dict[bytes, dict[str, Any]] = {}
    scopes: list[tuple[int, int]] = []
    try:
        for resource_bytes, scope_bytes, span_count in listed:
            resource = resources.get(resource_bytes)
            if resource is None:
                message = Resource.FromString(resource_bytes)
                resource = resources[resource_bytes] = stamp_sender(
                    attributes(message.attributes, DEFAULT_DROP, result), sender, claims
                )
            scope = InstrumentationScope.FromString(scope_bytes)
            rid, blob = resource_key(resource, scope.name[:MAX_SCOPE_NAME])
            batch.resources[rid] = blob
            scopes.append((rid, span_count))
    except DecodeError:
        return None
    out = wirescan.chunk_spans(raw, scopes, _KEY_FINDERS, MIN_TIME_NS, MAX_TIME_NS)
    if out is None:
        return None
    batch.dropped_content_attributes += result.dropped_content_attributes
    chunks, candidates, slow, rejected, valid = out
    for encoding in rejected:
        batch.rejected += 1
        if len(batch.errors) < 50:
            s = PbSpan.FromString(encoding)
            batch.errors.append(_invalid(s) or f"span {s.span_id.hex()}: invalid")
    cache: dict[bytes, KeyPair] = {}
    keys: set[tuple[str, bytes]] = set()
    for tid, raws in candidates:
        for value in raws:
            pair = cache.get(value)
            if pair is None:
                pair = cache[value] = key_pair(value.decode("utf-8", "replace"))
            key, short = pair
            if key:
                keys.add((key, tid))
                if short:
                    keys.add((short, tid))
                break
    for tid, body in slow:
        key, short = _request_key(body, cache, _KEY_FINDERS)
        if key:
            keys.add((key, tid))
            if short:
                keys.add((short, tid))
    batch.chunks = [[tid.hex(), chunk_id(body), 0, n, body, root] for tid, body, n, root in chunks]
    batch.keys = {(key, tid.hex()) for key, tid in keys}
    batch.span_count = valid
    return batch


def _rows_python(
    raw: bytes | None, scopes: list[tuple[int, Any]], check_content: bool, batch: RowBatch
) -> None:
    """The per-span work in Python (the fallback of the C accelerator): each span field is read
    once, and validity is one expression for the usual case."""
    slices = span_slices(raw) if raw is not None and not check_content else None
    seen: set[bytes] = set()
    key_cache: dict[bytes, KeyPair] = {}
    parts: dict[bytes, list[bytes]] = {}  # trace id -> its records' pieces, in order
    roots: set[bytes] = set()
    keys: set[tuple[str, bytes]] = set()  # (request key, trace id bytes)
    add_key = keys.add
    pack = RECORD_HEADER.pack
    for scope_index, (rid, ss) in enumerate(scopes):
        spans = ss.spans
        bodies = None
        needles: tuple[bytes, ...] | None = None
        if slices is not None and scope_index < len(slices):
            bodies, a, b = slices[scope_index]
            if len(bodies) != len(spans):
                bodies = None
            else:
                # The key needles this scope holds at all: a process's spans carry the
                # same attribute names, so most needles are ruled out for all its spans
                # by one search each, instead of one per span.
                needles = tuple(n for n in _KEY_FINDERS if raw.find(n, a, b) >= 0)  # type: ignore[union-attr]
        last_tid = b""
        pieces: list[bytes] = []
        for i, s in enumerate(spans):
            problem = _invalid(s)
            if problem is not None:
                batch.rejected += 1
                if len(batch.errors) < 50:
                    batch.errors.append(problem)
                continue
            tid = s.trace_id
            sid = s.span_id
            ident = tid + sid
            if ident in seen:  # the same span twice in one call
                continue
            seen.add(ident)
            if bodies is not None:
                body = bodies[i]
            else:
                body = s.SerializeToString()
                if check_content and any(n in body for n in CONTENT_NEEDLES):
                    batch.dropped_content_attributes += _strip_content(s)
                    body = s.SerializeToString()
            if tid != last_tid:
                last_tid = tid
                pieces = parts.setdefault(tid, [])
            if not s.parent_span_id:
                roots.add(tid)
            if needles is None or needles:
                request_key, short = _request_key(body, key_cache, needles)
                if request_key:
                    add_key((request_key, tid))
                    if short:
                        add_key((short, tid))
            pieces.append(pack(rid, len(body)))
            pieces.append(body)
    chunks = batch.chunks
    for tid, pieces in parts.items():
        body = b"".join(pieces)
        chunks.append([tid.hex(), chunk_id(body), 0, len(pieces) // 2, body, tid in roots])
    batch.keys = {(key, tid.hex()) for key, tid in keys}
    batch.span_count = len(seen)


def span_from_pb(trace_id: str, pb: PbSpan, resource: dict[str, Any], normalize: bool = True) -> Span:
    """A stored span back as a `Span`, by the same bounds as ingest applied."""
    result = DecodeResult()
    attrs = resource.get("resource", {})
    name = pb.name
    span = Span(
        trace_id=trace_id,
        span_id=pb.span_id.hex(),
        parent_span_id=pb.parent_span_id.hex() or None,
        name=name if len(name) <= MAX_NAME else name[:MAX_NAME],
        kind=int(pb.kind),
        start_ns=pb.start_time_unix_nano,
        end_ns=pb.end_time_unix_nano,
        status_code=int(pb.status.code),
        status_message=pb.status.message[:MAX_STATUS_MESSAGE],
        service_name=service_name_of(attrs),
        scope_name=resource.get("scope", ""),
        attributes=attributes(pb.attributes, DEFAULT_DROP, result),
        resource=attrs,
        events=[
            {
                "name": e.name[:MAX_EVENT_NAME],
                "time_ns": e.time_unix_nano,
                "attributes": attributes(e.attributes, DEFAULT_DROP, result),
            }
            for e in pb.events[:MAX_EVENTS]
        ],
    )
    return normalize_span(span) if normalize else span
