"""`GET /api/v1/traces/{trace_id}`: the normalised spans of a request and its summary, a page
at a time (`limit`, `cursor`), so a big trace is never loaded whole. A page is read within the
query budget (railtrace.query.budget): one the budget cuts short ends early, with `limited`
saying why and `next_cursor` to the rest."""

from __future__ import annotations

import base64
import binascii
from dataclasses import asdict
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, HTTPException, Query

from railtrace.query.budget import Budget, QueryUnavailable
from railtrace.query.reads import read_page
from railtrace.server.deps import RuntimeDep
from railtrace.server.routers.v1.params import TRACE_ID, bad_request, unavailable
from railtrace.server.runtime import Runtime

router = APIRouter(tags=["traces"])
MAX_SPANS = 10_000
INT64_MAX = 2**63 - 1

Position = tuple[str, int, int]


def encode_cursor(pos: Position) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(list(pos))).decode("ascii").rstrip("=")


def decode_cursor(token: str, trace_ids: list[str]) -> Position:
    """A position this service issued for these traces, or a 400."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        tid, chunk, skip = orjson.loads(raw)
    except (binascii.Error, ValueError, TypeError, orjson.JSONDecodeError):
        raise bad_request("cursor is not one this service issued") from None
    ok = (
        isinstance(tid, str)
        and tid in trace_ids
        and all(isinstance(v, int) and not isinstance(v, bool) for v in (chunk, skip))
        and 0 <= chunk <= INT64_MAX
        and 0 <= skip <= INT64_MAX
    )
    if not ok:
        raise bad_request("cursor is not one this service issued")
    return tid, chunk, skip


def _load(
    rt: Runtime, trace_id: str, cursor: str | None, limit: int, budget: Budget
) -> dict[str, Any] | None:
    summary = rt.store.get_request(trace_id)
    trace_ids = set(summary.get("trace_ids") or []) if summary else set()
    trace_ids.add(trace_id)
    ordered = sorted(trace_ids)
    after = decode_cursor(cursor, ordered) if cursor else None
    spans, pos, cut = read_page(rt.store, ordered, after, limit, budget)
    if cut and not spans:
        raise QueryUnavailable(f"no span of trace {trace_id} read: {budget.spent}")
    if not spans and summary is None and after is None:
        return None
    return {
        "trace_id": trace_id,
        "trace_ids": ordered,
        "summary": summary,
        "spans": [asdict(s) for s in spans],
        "truncated": pos is not None,
        "next_cursor": encode_cursor(pos) if pos is not None else None,
        "limited": f"page cut short: {budget.spent}" if cut else None,
    }


@router.get("/traces/{trace_id}", summary="Normalised spans of a trace (and its stitched siblings) + summary")
async def get_trace(
    rt: RuntimeDep,
    trace_id: str,
    limit: Annotated[int, Query(ge=1, le=MAX_SPANS, description="Spans per page")] = MAX_SPANS,
    cursor: Annotated[
        str | None, Query(max_length=512, description="`next_cursor` of the previous page")
    ] = None,
) -> dict[str, Any]:
    if not TRACE_ID.match(trace_id):
        raise bad_request("trace_id must be 32 hex digits")
    # A page is at most `trace_max_spans` long, whatever `limit` asks.
    budget = rt.queries.budget(min(limit, rt.settings.trace_max_spans))
    try:
        found = await rt.queries.run(lambda b: _load(rt, trace_id.lower(), cursor, b.max_rows, b), budget)
    except QueryUnavailable as exc:
        raise unavailable(exc) from None
    if found is None:
        raise HTTPException(404, f"no trace {trace_id}")
    return found
