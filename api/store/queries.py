"""Typed query objects for the REST API: filters, bounds and an opaque keyset cursor."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

import orjson

MAX_LIMIT = 1000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
DEFAULT_LIMIT = 100


class StoreError(ValueError):
    """A query the store cannot serve as asked (bad cursor, bad bounds); maps to HTTP 400."""


@dataclass(slots=True, frozen=True)
class Cursor:
    """Position after the last item of a page: newest-first order on (start_ns, trace_id)."""

    start_ns: int
    trace_id: str

    def encode(self) -> str:
        raw = orjson.dumps([self.start_ns, self.trace_id])
        return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")

    @classmethod
    def decode(cls, token: str) -> Cursor:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            start_ns, trace_id = orjson.loads(raw)
        except (binascii.Error, ValueError, TypeError, orjson.JSONDecodeError):
            raise StoreError("cursor is not one this service issued") from None
        if (
            not isinstance(start_ns, int)
            or isinstance(start_ns, bool)  # JSON true/false decode as int subclasses
            or not INT64_MIN <= start_ns <= INT64_MAX  # the column is a signed 64-bit integer
            or not isinstance(trace_id, str)
            or len(trace_id) > 64
            or "\x00" in trace_id
        ):
            raise StoreError("cursor is not one this service issued")
        return cls(start_ns, trace_id)


@dataclass(slots=True)
class RequestQuery:
    """Filters of `GET /api/v1/requests`; all optional, combined with AND."""

    flag: str | None = None
    path_class: str | None = None
    since_ns: int | None = None
    until_ns: int | None = None  # exclusive
    node: str | None = None  # prefill or decode node
    pod: str | None = None  # prefill or decode pod
    model: str | None = None
    limit: int = DEFAULT_LIMIT
    cursor: Cursor | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_LIMIT:
            raise StoreError(f"limit must be between 1 and {MAX_LIMIT}")
        if self.since_ns is not None and self.until_ns is not None and self.until_ns < self.since_ns:
            raise StoreError("until is before since")


@dataclass(slots=True)
class Page:
    items: list[dict[str, Any]] = field(default_factory=list)
    next_cursor: str | None = None
