"""Shared query-parameter handling for the v1 routers."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated

from fastapi import HTTPException
from pydantic import WithJsonSchema

from railtrace.query.budget import QueryUnavailable

TRACE_ID = re.compile(r"^[0-9a-fA-F]{32}$")


# Query times are bounded to what the store can hold (nanoseconds in a signed 64-bit column).
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)

# RFC 3339 or unix seconds, as the OpenAPI description says (pydantic accepts both).
TimeParam = Annotated[
    datetime | None,
    WithJsonSchema(
        {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "number"}, {"type": "null"}]}
    ),
]


def to_ns(value: datetime | None) -> int | None:
    """RFC 3339 (or unix seconds, which pydantic also accepts) to nanoseconds; naive means UTC."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    if not EARLIEST <= value < LATEST:
        raise bad_request(f"time {value.isoformat()} is outside {EARLIEST.year}..{LATEST.year}")
    return round(value.timestamp() * 1e6) * 1000


def check_range(since: int | None, until: int | None) -> None:
    if since is not None and until is not None and until < since:
        raise HTTPException(400, "until is before since")


def bad_request(message: str) -> HTTPException:
    return HTTPException(status_code=400, detail=message)


def unavailable(exc: QueryUnavailable) -> HTTPException:
    """A query the service did not answer (stopping, busy, over its time budget): 503, retry."""
    return HTTPException(status_code=503, detail=str(exc), headers={"Retry-After": str(exc.retry_after_s)})
