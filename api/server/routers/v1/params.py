"""Shared query-parameter handling for the v1 routers."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from fastapi import HTTPException

TRACE_ID = re.compile(r"^[0-9a-fA-F]{32}$")


def to_ns(value: datetime | None) -> int | None:
    """RFC 3339 (or unix seconds, which pydantic also accepts) to nanoseconds; naive means UTC."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return round(value.timestamp() * 1e6) * 1000


def check_range(since: int | None, until: int | None) -> None:
    if since is not None and until is not None and until < since:
        raise HTTPException(400, "until is before since")


def bad_request(message: str) -> HTTPException:
    return HTTPException(status_code=400, detail=message)
