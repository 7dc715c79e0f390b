"""Stored span encodings back to `Span`s: through the C reader when it is built, else upb.

Why: every span the assembler and the API read comes back from its stored OTLP encoding, and
parsing it with upb and then walking the message attribute by attribute in Python was about a
third of assembly's CPU time. The C reader (`railtrace.otlp._spandecode`) reads the bytes
once into the same plain values. It gives exactly what upb + `span_from_pb` give, or None
for anything it does not mirror (merged message fields, odd framing, bad UTF-8, ...); that
record then takes the upb path, which also raises `DecodeError` for undecodable bytes as
before. Without a C compiler at install time the extension is missing and every record takes
the upb path.

`RAILTRACE_PURE_PYTHON=1`, the switch of all the service's C accelerators
(`railtrace.otlp.accelerators`), forces the upb path, to compare the two or to rule the C
reader out; it is read whenever a reader is made, so it also applies to a running test.

`records_reader` reads a chunk's records at once against resources prepared once each
(`StoredResource`: attributes, scope and service name), where `span_reader`'s reader works
these out again for every span from the stored resource.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from railtrace.model import Span
from railtrace.otlp.accelerators import built, pure_python
from railtrace.otlp.bounds import SPAN_READER_BOUNDS
from railtrace.otlp.decode import DEFAULT_DROP
from railtrace.otlp.rows import service_name_of, span_from_pb

# None when installed without a C compiler: the upb path only. The switch is read per reader.
_spandecode = built("_spandecode")

# The bounds the C reader applies; it is used only while they equal the Python ones.
BOUNDS = SPAN_READER_BOUNDS

SpanReader = Callable[[str, bytes, dict[str, Any]], Span]


@dataclass(frozen=True, slots=True)
class StoredResource:
    """A `resources` row as span readers use it, worked out once per resource."""

    stored: dict[str, Any] = field(default_factory=dict)  # {"resource": {...}, "scope": name}
    attributes: dict[str, Any] = field(default_factory=dict)
    scope: str = ""
    service_name: str = "unknown_service"

    @classmethod
    def of(cls, stored: dict[str, Any]) -> StoredResource:
        attrs = stored.get("resource", {})
        return cls(stored, attrs, stored.get("scope", ""), service_name_of(attrs))


NO_RESOURCE = StoredResource()  # a resource id with no row: what an empty stored resource gives

# read(trace_id, records of a chunk, resources by id) -> their spans, in record order.
RecordsReader = Callable[[str, Sequence[tuple[int, bytes]], Mapping[int, StoredResource]], list[Span]]


def c_reader_available() -> bool:
    """Whether the C reader is built and bounds spans as the Python code does."""
    return _spandecode is not None and _spandecode.BOUNDS == BOUNDS


def read_upb(trace_id: str, encoding: bytes, resource: dict[str, Any]) -> Span:
    """A stored span through upb and `span_from_pb`: the reference the C reader must equal."""
    return span_from_pb(trace_id, PbSpan.FromString(encoding), resource, normalize=False)


def _span(trace_id: str, fields: tuple[Any, ...], res: StoredResource) -> Span:
    """A `Span` from the C reader's fields and its prepared resource."""
    sid, parent, name, kind, start, end, code, message, attrs, events = fields
    # Positional: a third of the cost of keywords, per span read. Order of `Span`'s fields.
    return Span(
        trace_id,
        sid,
        parent,
        name,
        kind,
        start,
        end,
        code,
        message,
        res.service_name,
        res.scope,
        attrs,
        res.attributes,
        events,
    )


def _read_c(trace_id: str, encoding: bytes, resource: dict[str, Any]) -> Span:
    fields = _spandecode.decode(encoding, DEFAULT_DROP)  # type: ignore[union-attr]
    if fields is None:  # something the C reader does not mirror: upb decides
        return read_upb(trace_id, encoding, resource)
    return _span(trace_id, fields, StoredResource.of(resource))


def _records_upb(
    trace_id: str, records: Sequence[tuple[int, bytes]], resources: Mapping[int, StoredResource]
) -> list[Span]:
    return [read_upb(trace_id, enc, resources.get(rid, NO_RESOURCE).stored) for rid, enc in records]


def _records_c(
    trace_id: str, records: Sequence[tuple[int, bytes]], resources: Mapping[int, StoredResource]
) -> list[Span]:
    """`_read_c` over a chunk's records, without a call and a resource lookup per span."""
    decode = _spandecode.decode  # type: ignore[union-attr]
    out = []
    last, res = None, NO_RESOURCE
    for rid, encoding in records:
        if rid != last:  # a chunk's records mostly share one resource (one exporting process)
            last, res = rid, resources.get(rid, NO_RESOURCE)
        fields = decode(encoding, DEFAULT_DROP)
        if fields is None:  # something the C reader does not mirror: upb decides
            out.append(read_upb(trace_id, encoding, res.stored))
            continue
        out.append(_span(trace_id, fields, res))
    return out


def _accelerated(accelerated: bool | None) -> bool:
    if accelerated is None:
        return c_reader_available() and not pure_python()
    if accelerated and not c_reader_available():
        raise RuntimeError("the C span reader railtrace.otlp._spandecode is not built")
    return accelerated


def records_reader(accelerated: bool | None = None) -> RecordsReader:
    """`read(trace_id, records, resources) -> spans`: `span_reader`'s reader over every record
    (resource id, encoding) of a chunk, the resources prepared by `StoredResource.of`; a
    resource id missing from `resources` reads as an empty resource."""
    return _records_c if _accelerated(accelerated) else _records_upb


def span_reader(accelerated: bool | None = None) -> SpanReader:
    """`read(trace_id, encoding, resource) -> Span`, not normalised, as `span_from_pb` on the
    parsed encoding gives it (the caller normalises the spans it keeps). `accelerated`: None
    for the C reader when available (unless `RAILTRACE_PURE_PYTHON` is set), False for the upb
    path, True for the C reader (error if not built)."""
    return _read_c if _accelerated(accelerated) else read_upb
