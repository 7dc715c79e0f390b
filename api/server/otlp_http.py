"""OTLP/HTTP receiver: `POST /v1/traces`.

Follows the OTLP specification: protobuf or JSON in, the response in the request's format,
`partial_success` for rejected spans, 400 with a `google.rpc.Status` body for malformed
payloads, 413 for bodies over the limit (also while inflating: a gzip bomb is stopped at
the limit, never inflated in full), 415 for other media types or encodings, 429/503 with
`Retry-After` when the writer is behind. 200 is sent only after the spans are committed.
"""

from __future__ import annotations

import asyncio
import zlib

from fastapi import APIRouter, Request, Response
from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from railtrace.ingest import Overloaded, WriterUnavailable, prepare
from railtrace.otlp import PayloadError
from railtrace.server.deps import RuntimeDep
from railtrace.server.security import ContentFilter
from railtrace.server.senders import FORWARDED_HEADER, sender_address
from railtrace.store import RowBatch

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
ENCODINGS = ("", "identity", "gzip", "x-gzip", "deflate")

router = APIRouter(tags=["otlp"])


class TooLarge(Exception):
    pass


def inflate_bounded(data: bytes, encoding: str, limit: int) -> bytes:
    """Decompress gzip/deflate, stopping as soon as the output would exceed `limit`."""
    # HTTP "deflate" is zlib-wrapped, but some clients send raw deflate.
    wbits = [16 + zlib.MAX_WBITS] if encoding in ("gzip", "x-gzip") else [zlib.MAX_WBITS, -zlib.MAX_WBITS]
    last_error: zlib.error | None = None
    for wb in wbits:
        try:
            return _inflate(data, wb, limit)
        except zlib.error as exc:
            last_error = exc
    raise PayloadError(f"body is not valid {encoding} data: {last_error}")


def _inflate(data: bytes, wbits: int, limit: int) -> bytes:
    out = bytearray()
    pending = data
    while True:
        d = zlib.decompressobj(wbits)
        buf = pending
        while True:
            out += d.decompress(buf, limit + 1 - len(out))
            if len(out) > limit:
                raise TooLarge
            buf = d.unconsumed_tail
            if d.eof or not buf:
                break
        while not d.eof:  # input consumed; drain output still held by zlib, bounded
            chunk = d.decompress(b"", limit + 1 - len(out))
            if not chunk:
                break
            out += chunk
            if len(out) > limit:
                raise TooLarge
        if not d.eof:
            raise zlib.error("compressed data is truncated")
        pending = d.unused_data
        if not pending or wbits < 0 or wbits == zlib.MAX_WBITS:
            return bytes(out)  # gzip may hold several members; zlib/raw streams end here


def _prepare(content: ContentFilter, raw: bytes, media: str, sender: str | None = None) -> RowBatch:
    """Drop configured content attributes, then parse and build rows."""
    return prepare(content.apply(raw, media), media, content_free=content.covers_content, sender=sender)


def _encode(message: Message, json: bool) -> tuple[bytes, str]:
    if json:
        return json_format.MessageToJson(message, indent=None).encode(), JSON
    return message.SerializeToString(), PROTOBUF


def _status(
    http: int, code: int, message: str, json: bool, headers: dict[str, str] | None = None
) -> Response:
    body, media = _encode(status_pb2.Status(code=code, message=message), json)
    return Response(body, status_code=http, media_type=media, headers=headers)


@router.post(
    "/v1/traces",
    summary="OTLP/HTTP trace export (protobuf or JSON, optional gzip)",
    response_class=Response,
)
async def export_traces(request: Request, rt: RuntimeDep) -> Response:
    metrics = rt.metrics
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media not in (PROTOBUF, JSON):
        metrics.export_done("http", "unsupported_media_type")
        return _status(
            415, code_pb2.INVALID_ARGUMENT, f"content type must be {PROTOBUF} or {JSON}, not {media!r}", True
        )
    as_json = media == JSON
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding not in ENCODINGS:
        metrics.export_done("http", "unsupported_encoding")
        return _status(415, code_pb2.INVALID_ARGUMENT, f"unsupported content encoding {encoding!r}", as_json)
    limit = rt.settings.max_body_bytes
    too_large = _status(413, code_pb2.RESOURCE_EXHAUSTED, f"body exceeds {limit} bytes", as_json)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        metrics.export_done("http", "too_large")
        return too_large
    retry = {"Retry-After": str(rt.settings.retry_after_s)}
    if rt.writer.pending >= rt.settings.max_pending_spans:  # shed load before decoding
        metrics.throttled("http")
        return _status(429, code_pb2.RESOURCE_EXHAUSTED, "ingest is behind; retry later", as_json, retry)
    body = bytearray()
    try:
        async with asyncio.timeout(rt.settings.body_timeout_s):  # a trickling client is cut off
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    metrics.export_done("http", "too_large")
                    return too_large
    except TimeoutError:
        metrics.export_done("http", "timeout")
        message = f"body not received within {rt.settings.body_timeout_s}s"
        return _status(408, code_pb2.DEADLINE_EXCEEDED, message, as_json, {"connection": "close"})
    except ClientDisconnect:
        metrics.export_done("http", "disconnected")
        return _status(400, code_pb2.CANCELLED, "client went away before sending its body", as_json)
    sender = sender_address(
        request.client.host if request.client else None,
        request.headers.getlist(FORWARDED_HEADER),
        rt.trusted_proxies,
    )
    try:
        raw = bytes(body)
        # Only the rows stay while the export waits for its commit: the body, read and
        # inflated, would otherwise be held twice per queued export (found by the memory
        # figures of benchmarks/verdicts).
        del body
        if encoding not in ("", "identity"):
            raw = await run_in_threadpool(inflate_bounded, raw, encoding, limit)
        if media == PROTOBUF and len(raw) <= rt.settings.parse_inline_max_bytes:
            # A typical exporter batch (512 spans, ~400 KB) takes a few milliseconds to parse.
            # Handing it to a worker thread costs more CPU than that (thread wake-ups, GIL
            # hand-offs), and the GIL gives the thread no parallelism anyway.
            batch = _prepare(rt.content_filter, raw, media, sender)
        else:
            batch = await run_in_threadpool(_prepare, rt.content_filter, raw, media, sender)
        del raw
    except TooLarge:
        metrics.export_done("http", "too_large")
        return too_large
    except PayloadError as exc:
        metrics.export_done("http", "invalid")
        return _status(400, code_pb2.INVALID_ARGUMENT, str(exc), as_json)
    try:
        result = await rt.writer.write(batch) if len(batch) else None
    except Overloaded as exc:
        metrics.throttled("http")
        return _status(
            429, code_pb2.RESOURCE_EXHAUSTED, f"ingest is behind ({exc}); retry later", as_json, retry
        )
    except WriterUnavailable as exc:
        metrics.throttled("http")
        return _status(503, code_pb2.UNAVAILABLE, str(exc), as_json, retry)
    response = ExportTraceServiceResponse()
    if batch.rejected:
        response.partial_success.rejected_spans = batch.rejected
        response.partial_success.error_message = batch.error_message
    committed = result.inserted if result else 0
    metrics.export_done("http", "partial" if batch.rejected else "ok", committed, batch.rejected)
    body_out, out_media = _encode(response, as_json)
    return Response(body_out, status_code=200, media_type=out_media)
