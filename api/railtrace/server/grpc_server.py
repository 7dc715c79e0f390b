"""OTLP/gRPC receiver: `TraceService/Export`, same semantics as `POST /v1/traces`.

Answers only after commit. When the writer is behind it answers RESOURCE_EXHAUSTED, and
UNAVAILABLE when writes fail, both with a `RetryInfo` detail so OTLP exporters retry (the
specification treats RESOURCE_EXHAUSTED as retryable only with `RetryInfo`).
"""

from __future__ import annotations

from concurrent import futures
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from railtrace.ingest import Outcome
from railtrace.otlp.export import PROTOBUF
from railtrace.server.runtime import Runtime
from railtrace.server.security import TokenInterceptor, grpc_credentials
from railtrace.server.senders import FORWARDED_HEADER, grpc_peer_host, sender_of

SERVICE_NAME = "opentelemetry.proto.collector.trace.v1.TraceService"


class TraceService:
    """`Export` receives the request's raw bytes (no generic deserialisation) and hands them to
    the same `ExportAcceptor` as `POST /v1/traces`; it only maps the outcome to gRPC codes."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    def _abort_retry(self, context: Any, code: grpc.StatusCode, rpc_code: int, message: str) -> None:
        detail = error_details_pb2.RetryInfo(retry_delay=Duration(seconds=self.rt.settings.retry_after_s))
        status = status_pb2.Status(code=rpc_code, message=message)
        status.details.add().Pack(detail)
        # OTLP exporters read the delay from `google.rpc.retryinfo-bin` (the Python exporter
        # reads nothing else); `grpc-status-details-bin` carries the same for rich-status clients.
        context.set_trailing_metadata(
            (
                ("grpc-status-details-bin", status.SerializeToString()),
                ("google.rpc.retryinfo-bin", detail.SerializeToString()),
            )
        )
        context.abort(code, message)

    def Export(self, request: bytes, context: Any) -> ExportTraceServiceResponse:
        exports = self.rt.exports
        accepted = exports.behind("grpc")
        if accepted is None:
            forwarded = [v for k, v in context.invocation_metadata() or () if k == FORWARDED_HEADER]
            peer = grpc_peer_host(context.peer())
            sender = sender_of(peer, forwarded, self.rt.trusted_proxies, self.rt.trusted_collectors)
            accepted = exports.accept_blocking("grpc", request, PROTOBUF, sender.address, sender.claims)
        outcome = accepted.outcome
        if outcome is Outcome.INVALID:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, accepted.message)
        if outcome in (Outcome.BEHIND, Outcome.OVERLOADED):
            self._abort_retry(
                context, grpc.StatusCode.RESOURCE_EXHAUSTED, code_pb2.RESOURCE_EXHAUSTED, accepted.message
            )
        if outcome is Outcome.UNAVAILABLE:
            self._abort_retry(context, grpc.StatusCode.UNAVAILABLE, code_pb2.UNAVAILABLE, accepted.message)
        response = ExportTraceServiceResponse()
        if accepted.rejected:
            response.partial_success.rejected_spans = accepted.rejected
            response.partial_success.error_message = accepted.message
        return response


def make_grpc_server(runtime: Runtime, host: str, port: int, workers: int = 16) -> tuple[grpc.Server, int]:
    """A started-ready (not started) gRPC server bound to host:port; returns it and the bound port."""
    limit = runtime.settings.max_body_bytes
    settings = runtime.settings
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="railtrace-grpc"),
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.so_reuseport", 0),
            # Bounds before authentication (the token is checked once the call's metadata is in).
            ("grpc.max_metadata_size", settings.max_head_bytes),
            ("grpc.server_handshake_timeout_ms", int(settings.head_timeout_s * 1000)),
            ("grpc.max_connection_idle_ms", int(settings.idle_timeout_s * 1000)),
            ("grpc.max_concurrent_streams", 100),
        ],
        interceptors=[TokenInterceptor(settings.ingest_token)] if settings.ingest_token else None,
    )
    service = TraceService(runtime)
    export = grpc.unary_unary_rpc_method_handler(
        service.Export,
        request_deserializer=None,
        response_serializer=ExportTraceServiceResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, {"Export": export}),))
    if settings.tls_cert and settings.tls_key:
        credentials = grpc_credentials(settings.tls_cert, settings.tls_key)
        bound = server.add_secure_port(f"{host}:{port}", credentials)
    else:
        bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen for OTLP/gRPC on {host}:{port}")
    return server, bound
