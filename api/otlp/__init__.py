"""OTLP payload decoding, shared by the HTTP and gRPC receivers, tests and the demo."""

from railtrace.otlp.decode import DecodeResult, PayloadError, decode, parse_json, spans_from_request

__all__ = ["DecodeResult", "PayloadError", "decode", "parse_json", "spans_from_request"]
