"""Span <-> row conversion. Runs in the receiver threads, so the writer only inserts."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from railtrace.model import Span

SpanRow = tuple[Any, ...]  # column order of INSERT_COLUMNS in store.py


@dataclass(slots=True)
class RowBatch:
    """Rows of one export call, ready for the writer: spans, new resources, per-trace counts."""

    spans: list[SpanRow] = field(default_factory=list)
    resources: dict[int, bytes] = field(default_factory=dict)
    traces: dict[str, list[int]] = field(default_factory=dict)  # trace_id -> [span count, has_root]

    def __len__(self) -> int:
        return len(self.spans)


def resource_key(resource: dict[str, Any]) -> tuple[int, bytes]:
    """A stable 63-bit id for a resource attribute set, and its JSON."""
    blob = orjson.dumps(resource, option=orjson.OPT_SORT_KEYS)
    digest = hashlib.blake2b(blob, digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1, blob


def span_body(span: Span) -> bytes:
    return orjson.dumps(
        {
            "kind": span.kind,
            "status_message": span.status_message,
            "scope": span.scope_name,
            "canonical_name": span.canonical_name,
            "generation": span.generation,
            "attributes": span.attributes,
            "events": span.events,
        }
    )


def build_rows(spans: list[Span], received_ns: int = 0) -> RowBatch:
    """Rows for normalised spans. `received_ns` is replaced by the writer at commit."""
    batch = RowBatch()
    by_identity: dict[int, int] = {}  # id(resource dict) -> resource id: the decoder shares one dict
    seen: set[tuple[str, str]] = set()
    for s in spans:
        key = (s.trace_id, s.span_id)
        if key in seen:  # the same span twice in one call
            continue
        seen.add(key)
        rid = by_identity.get(id(s.resource))
        if rid is None:
            rid, blob = resource_key(s.resource)
            by_identity[id(s.resource)] = rid
            batch.resources[rid] = blob
        batch.spans.append(
            (
                s.trace_id,
                s.span_id,
                s.parent_span_id,
                s.name[:512],
                s.role[:32],
                s.service_name[:256],
                s.start_ns,
                s.end_ns,
                s.status_code,
                s.request_key[:256] if s.request_key else None,
                rid,
                received_ns,
                span_body(s),
            )
        )
        counts = batch.traces.get(s.trace_id)
        if counts is None:
            batch.traces[s.trace_id] = [1, int(s.parent_span_id is None)]
        else:
            counts[0] += 1
            if s.parent_span_id is None:
                counts[1] = 1
    return batch


def span_from_row(row: Any, resource: dict[str, Any]) -> Span:
    """A stored span back as a `Span` (normalised fields included)."""
    body = orjson.loads(row.body)
    return Span(
        trace_id=row.trace_id,
        span_id=row.span_id,
        parent_span_id=row.parent_span_id,
        name=row.name,
        kind=body.get("kind", 0),
        start_ns=row.start_ns,
        end_ns=row.end_ns,
        status_code=row.status_code,
        status_message=body.get("status_message", ""),
        service_name=row.service_name,
        scope_name=body.get("scope", ""),
        attributes=body.get("attributes", {}),
        resource=resource,
        events=body.get("events", []),
        role=row.role,
        canonical_name=body.get("canonical_name", ""),
        generation=body.get("generation", ""),
        request_key=row.request_key,
    )
