"""The OTLP codec: an export call's bytes to validated rows (`export`, `rows`), stored span
encodings back to spans (`spans`), the content filter (`content`), every bound (`bounds`), the
one validity rule (`validity`) and the reference decoder the tests compare against (`reference`)."""

from railtrace.otlp.decode import DecodeResult, PayloadError, parse_json
from railtrace.otlp.reference import decode, spans_from_request

__all__ = ["DecodeResult", "PayloadError", "decode", "parse_json", "spans_from_request"]
