"""Typed query objects for the REST API: filters, bounds and an opaque keyset cursor."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

MAX_LIMIT = 1000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
DEFAULT_LIMIT = 100


class StoreError(ValueError):
    """A query the store cannot serve as asked (bad cursor, bad bounds); maps to HTTP 400."""


class RequestOrder(StrEnum):
    """The orders of the request list, each walked by keyset on (its key, trace id), descending:
    `start` newest first; `ttft` and `kv_time` slowest first, over requests that have the value
    (a request without a first token or without a KV transfer has no time to rank by)."""

    START = "start"
    TTFT = "ttft"
    KV_TIME = "kv_time"


CURSOR_REFUSED = "cursor is not one this service issued"


def _is_int64(value: object) -> bool:
    # JSON true/false decode as int subclasses; the column is a signed 64-bit integer.
    return isinstance(value, int) and not isinstance(value, bool) and INT64_MIN <= value <= INT64_MAX


@dataclass(slots=True, frozen=True)
class Cursor:
    """Position after the last item of a page: the order's key (start_ns, or seconds of TTFT or
    KV time) and trace id of that item. A `start` cursor encodes as it did before orders
    existed, so cursors issued then still page on."""

    value: int | float
    trace_id: str
    order: RequestOrder = RequestOrder.START

    def encode(self) -> str:
        key = [self.value, self.trace_id]
        raw = orjson.dumps(key if self.order is RequestOrder.START else [self.order.value, *key])
        return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")

    @classmethod
    def decode(cls, token: str) -> Cursor:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            fields = orjson.loads(raw)
            if len(fields) == 2:
                order, (value, trace_id) = RequestOrder.START, fields
            else:
                name, value, trace_id = fields
                order = RequestOrder(name)
        except (binascii.Error, ValueError, TypeError, orjson.JSONDecodeError):
            raise StoreError(CURSOR_REFUSED) from None
        if order is RequestOrder.START:
            valid_value = _is_int64(value)
        else:  # a duration in seconds; JSON holds no NaN or infinity
            valid_value = _is_int64(value) or isinstance(value, float)
        if not valid_value or not isinstance(trace_id, str) or len(trace_id) > 64 or "\x00" in trace_id:
            raise StoreError(CURSOR_REFUSED)
        return cls(value if order is RequestOrder.START else float(value), trace_id, order)


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
    order: RequestOrder = RequestOrder.START

    def __post_init__(self) -> None:
        if self.cursor is not None and self.cursor.order is not self.order:
            raise StoreError(
                f"cursor belongs to order={self.cursor.order.value}, not order={self.order.value}"
            )
        if not 1 <= self.limit <= MAX_LIMIT:
            raise StoreError(f"limit must be between 1 and {MAX_LIMIT}")
        if self.since_ns is not None and self.until_ns is not None and self.until_ns < self.since_ns:
            raise StoreError("until is before since")


@dataclass(slots=True)
class Page:
    items: list[dict[str, Any]] = field(default_factory=list)
    next_cursor: str | None = None
