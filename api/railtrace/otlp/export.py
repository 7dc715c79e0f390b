"""An export call's bytes to validated rows: the one way in for both receivers.

The content filter runs first (on the bytes: the usual export holds no content and is not
parsed for it), then the row builder (`railtrace.otlp.rows`): the C scanner straight from the
bytes where it can, else the parsed message in Python. Raises `PayloadError` for a payload that
is not an export request at all; invalid spans are counted in the batch, not raised.
"""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from railtrace.otlp.content import ContentFilter
from railtrace.otlp.decode import parse_json, parse_protobuf
from railtrace.otlp.rows import RowBatch, rows_from_bytes, rows_from_request

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


def prepare(
    body: bytes | ExportTraceServiceRequest,
    media: str = PROTOBUF,
    content_free: bool = False,
    sender: str | None = None,
    claims: str | None = None,
) -> RowBatch:
    """Rows of an export call whose content, if any, has already been dealt with.

    `content_free`: the caller's content filter has already ruled out content attributes.
    `sender`: the address the call came from (`railtrace.server.senders`), kept on each resource;
    `claims`: who vouches for its `k8s.*` claims (`rows.stamp_sender`).
    """
    if isinstance(body, ExportTraceServiceRequest):
        return rows_from_request(body, content_free=content_free, sender=sender, claims=claims)
    if media == JSON:
        return rows_from_request(parse_json(body), content_free=content_free, sender=sender, claims=claims)
    batch = rows_from_bytes(body, content_free, sender, claims)  # the usual call: no protobuf objects at all
    if batch is not None:
        return batch
    return rows_from_request(
        parse_protobuf(body), raw=body, content_free=content_free, sender=sender, claims=claims
    )


def export_rows(
    content: ContentFilter, raw: bytes, media: str, sender: str | None = None, claims: str | None = None
) -> RowBatch:
    """Drop the configured content attributes, then build the rows."""
    return prepare(
        content.apply(raw, media), media, content_free=content.covers_content, sender=sender, claims=claims
    )
