"""Plain Python values to OTLP `KeyValue`s: the inverse of `decode.any_value`, for building
payloads in tests, benchmarks and tools."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def any_value(value: Any) -> AnyValue:
    """bool, int, float, str, lists of them (each item typed) and anything else as its str()."""
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, list | tuple):
        out = AnyValue()
        out.array_value.values.extend(any_value(item) for item in value)
        return out
    return AnyValue(string_value=str(value))


def key_value(key: str, value: Any) -> KeyValue:
    return KeyValue(key=key, value=any_value(value))
