"""OTLP/HTTP receiver: `POST /v1/traces`.

Follows the OTLP specification: protobuf or JSON in, the response in the request's format,
`partial_success` for rejected spans, 400 with a `google.rpc.Status` body for malformed
payloads, 413 for bodies over the limit (also while inflating: a gzip bomb is stopped at
the limit, never inflated in full), 415 for other media types or encodings, 429/503 with
`Retry-After` when the writer is behind. 200 is sent only after the spans are committed.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response
from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from railtrace.ingest import Accepted, Outcome
from railtrace.otlp import PayloadError
from railtrace.otlp.decode import TooLarge, inflate_bounded
from railtrace.otlp.export import JSON, PROTOBUF
from railtrace.server.deps import RuntimeDep
from railtrace.server.senders import FORWARDED_HEADER, sender_of

ENCODINGS = ("", "identity", "gzip", "x-gzip", "deflate")

router = APIRouter(tags=["otlp"])


def _encode(message: Message, json: bool) -> tuple[bytes, str]:
    if json:
        return json_format.MessageToJson(message, indent=None).encode(), JSON
    return message.SerializeToString(), PROTOBUF


def _status(
    http: int, code: int, message: str, json: bool, headers: dict[str, str] | None = None
) -> Response:
    body, media = _encode(status_pb2.Status(code=code, message=message), json)
    return Response(body, status_code=http, media_type=media, headers=headers)


def _too_large_and_close(limit: int, as_json: bool) -> Response:
    """413 for a body too big even to read and discard: the connection is closed after it."""
    message = f"body exceeds {limit} bytes"
    return _status(413, code_pb2.RESOURCE_EXHAUSTED, message, as_json, {"connection": "close"})


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
    # An oversized body is read and thrown away (up to `max_drain_bytes`) before the 413 is
    # sent: answered and closed while the client is still sending, the client's next write
    # meets a reset and it reports that instead of the 413 (requests, httpx, the exporters).
    # A client that sent `Expect: 100-continue` sends nothing until it is told to: answered
    # before the body is read (uvicorn sends `100 Continue` on the first read), it never sends
    # the body. Before, it was told to continue and the drain waited `body_timeout_s` for a body
    # such a client may never send; closed after, as the client may send it anyway.
    over = declared.isdigit() and int(declared) > limit
    expects = request.headers.get("expect", "").strip().lower() == "100-continue"
    if over and (expects or int(declared) > rt.settings.max_drain_bytes):
        metrics.export_done("http", "too_large")
        return _too_large_and_close(limit, as_json)
    retry = {"Retry-After": str(rt.settings.retry_after_s)}
    if not over and (shed := rt.exports.behind("http")):  # shed load before reading or decoding
        return _answer(shed, as_json, retry)
    body = bytearray()
    received = 0
    try:
        async with asyncio.timeout(rt.settings.body_timeout_s):  # a trickling client is cut off
            async for chunk in request.stream():
                received += len(chunk)
                if over:
                    if received > rt.settings.max_drain_bytes:
                        break
                    continue
                body += chunk
                if len(body) > limit:
                    over = True
                    body = bytearray()
    except TimeoutError:
        if over:
            metrics.export_done("http", "too_large")
            return _too_large_and_close(limit, as_json)
        metrics.export_done("http", "timeout")
        message = f"body not received within {rt.settings.body_timeout_s}s"
        return _status(408, code_pb2.DEADLINE_EXCEEDED, message, as_json, {"connection": "close"})
    except ClientDisconnect:
        metrics.export_done("http", "disconnected")
        return _status(400, code_pb2.CANCELLED, "client went away before sending its body", as_json)
    if over:
        metrics.export_done("http", "too_large")
        return _too_large_and_close(limit, as_json) if received > rt.settings.max_drain_bytes else too_large
    sender = sender_of(
        request.client.host if request.client else None,
        request.headers.getlist(FORWARDED_HEADER),
        rt.trusted_proxies,
        rt.trusted_collectors,
    )
    # Only the rows stay while the export waits for its commit: the body, read and inflated,
    # would otherwise be held twice per queued export (found by the memory figures of
    # benchmarks/verdicts). A compressed body is inflated from the buffer it was read into, not
    # from a copy of it.
    if encoding not in ("", "identity"):
        try:
            raw = await run_in_threadpool(inflate_bounded, body, encoding, limit)
        except TooLarge:
            metrics.export_done("http", "too_large")
            return too_large
        except PayloadError as exc:  # not the compression its header names
            metrics.export_done("http", "invalid")
            return _status(400, code_pb2.INVALID_ARGUMENT, str(exc), as_json)
    else:
        raw = bytes(body)
    del body
    batch = await rt.exports.rows_of("http", raw, media, sender.address, sender.claims)
    del raw
    if isinstance(batch, Accepted):
        return _answer(batch, as_json, retry)
    return _answer(await rt.exports.commit("http", batch), as_json, retry)


def _answer(accepted: Accepted, as_json: bool, retry: dict[str, str]) -> Response:
    """The HTTP answer to an export's outcome (the OTLP/HTTP specification's status codes)."""
    outcome = accepted.outcome
    if outcome is Outcome.INVALID:
        return _status(400, code_pb2.INVALID_ARGUMENT, accepted.message, as_json)
    if outcome in (Outcome.BEHIND, Outcome.OVERLOADED):
        message = f"{accepted.message}; retry later"
        return _status(429, code_pb2.RESOURCE_EXHAUSTED, message, as_json, retry)
    if outcome is Outcome.UNAVAILABLE:
        return _status(503, code_pb2.UNAVAILABLE, accepted.message, as_json, retry)
    response = ExportTraceServiceResponse()
    if accepted.rejected:
        response.partial_success.rejected_spans = accepted.rejected
        response.partial_success.error_message = accepted.message
    body_out, out_media = _encode(response, as_json)
    return Response(body_out, status_code=200, media_type=out_media)
