"""The store's own content check, defence in depth behind the receivers' filter
(`railtrace.otlp.content.ContentFilter`): rows built without going through a receiver
must not hold content attributes either, including those in span links."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from railtrace.otlp.rows import rows_from_request

SECRET = b"PROMPT-IN-A-LINK"


def test_rows_never_hold_content_in_links() -> None:
    req = ExportTraceServiceRequest()
    s = req.resource_spans.add().scope_spans.add().spans.add()
    s.trace_id, s.span_id = b"\x01" * 16, b"\x02" * 8
    s.start_time_unix_nano = s.end_time_unix_nano = 1_790_000_000 * 10**9
    link = s.links.add(trace_id=b"\x03" * 16, span_id=b"\x04" * 8)
    link.attributes.add(key="gen_ai.input.messages").value.string_value = SECRET.decode()
    batch = rows_from_request(req, raw=req.SerializeToString())
    assert len(batch) == 1
    assert SECRET not in batch.chunks[0][4]  # the stored blob
