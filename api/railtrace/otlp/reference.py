"""The reference decoder: an export call straight to `Span`s, the plain way. The tests' oracle.

Nothing on the ingest path uses it: the receivers store spans as they came (`railtrace.otlp.rows`)
and decode them on reading (`railtrace.otlp.spans`). Tests, fixtures and benchmarks decode with
this module and compare: every fast path must give what it gives, by the same bounds
(`railtrace.otlp.bounds`) and the same validity rule (`railtrace.otlp.validity`).
"""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from railtrace.model import Span
from railtrace.otlp.bounds import MAX_EVENT_NAME, MAX_EVENTS, MAX_NAME, MAX_STATUS_MESSAGE
from railtrace.otlp.decode import (
    DEFAULT_DROP,
    DecodeResult,
    PayloadError,
    attributes,
    parse_json,
    parse_protobuf,
)
from railtrace.otlp.validity import span_problem
from railtrace_tracing import semconv


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
                        "name": e.name[:MAX_EVENT_NAME],
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
                        name=s.name[:MAX_NAME],
                        kind=int(s.kind),
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        status_code=int(s.status.code),
                        status_message=s.status.message[:MAX_STATUS_MESSAGE],
                        service_name=service_name,
                        scope_name=scope_name,
                        attributes=attributes(s.attributes, drop, result),
                        resource=resource,
                        events=events,
                    )
                )
    return result


def _invalid(s: Any) -> str | None:
    return span_problem(s.trace_id, s.span_id, s.parent_span_id, s.start_time_unix_nano, s.end_time_unix_nano)


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
