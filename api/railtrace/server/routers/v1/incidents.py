"""`GET /api/v1/incidents` (filtered, keyset-paged, biggest cost first) and `/api/v1/incidents/{id}`.

Incidents are computed on read from the stored summaries of the window (`railtrace.incidents`,
docs/incidents.md): one range read of at most `MAX_ROWS` request rows, run through the query
gate with its time budget like the other reads that scan.
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import Annotated, Any
from urllib.parse import urlencode

import orjson
from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, Field

from railtrace.incidents import DEFAULT_WINDOW_NS, MAX_ROWS, IncidentSet, compute, incident_dict
from railtrace.query.budget import QueryUnavailable
from railtrace.server.deps import RuntimeDep
from railtrace.server.routers.v1.params import TimeParam, bad_request, check_range, to_ns, unavailable
from railtrace_tracing.semconv import FlagName

router = APIRouter(tags=["incidents"])

Text = Annotated[str | None, Query(max_length=256)]
MAX_LIMIT = 500


class PerDay(BaseModel):
    seconds_lost: float
    gpu_hours_lost: float


class IncidentItem(BaseModel):
    id: str = Field(description="Stable for the same cause, part and first request")
    cause: str = Field(description="The flag the incident's requests carry")
    scope: dict[str, Any] = Field(
        description="`kind` (nic, pod, node, pool_pair, rail, request), the part's keys, and the "
        "`pods`, `nodes` and `legs` its flagged requests went through"
    )
    open: bool = Field(description="False once the part's requests were healthy again")
    first_seen: str
    last_seen: str
    ended: str | None
    requests: int
    trace_ids: list[str]
    trace_ids_truncated: bool
    requests_url: str = Field(description="Every trace id: the incident's own URL")
    seconds_lost: float = Field(description="TTFT seconds lost, of requests whose primary cause this is")
    kv_seconds_lost: float
    gpu_hours_lost: float
    per_day: PerDay
    evidence: list[str]
    next_step: str


class IncidentPage(BaseModel):
    items: list[IncidentItem]
    next_cursor: str | None
    since: str
    until: str
    requests_read: int
    partial: str | None = Field(description="Why the answer covers less than the window, if it does")


def _window(since: TimeParam, until: TimeParam) -> tuple[int, int]:
    since_ns, until_ns = to_ns(since), to_ns(until)
    check_range(since_ns, until_ns)
    until_ns = until_ns if until_ns is not None else time.time_ns() + 1
    return (since_ns if since_ns is not None else until_ns - DEFAULT_WINDOW_NS), until_ns


async def _compute(rt: Any, since_ns: int, until_ns: int) -> IncidentSet:
    topology = rt.topology_holder.get() if rt.topology_holder is not None else None
    try:
        return await rt.queries.run(
            lambda _b: compute(rt.store.engine, topology, since_ns, until_ns), rt.queries.budget(MAX_ROWS)
        )
    except QueryUnavailable as exc:
        raise unavailable(exc) from None


def _sort_key(item: dict[str, Any]) -> tuple[Any, ...]:
    return (not item["open"], -item["seconds_lost"], -item["requests"], item["id"])


def _cursor(item: dict[str, Any]) -> str:
    raw = orjson.dumps([item["open"], item["seconds_lost"], item["requests"], item["id"]])
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _after(token: str) -> tuple[Any, ...]:
    try:
        is_open, seconds, count, ident = orjson.loads(
            base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        )
        return (not bool(is_open), -float(seconds), -int(count), str(ident))
    except (binascii.Error, ValueError, TypeError, orjson.JSONDecodeError):
        raise bad_request("cursor refused: pass `next_cursor` of a previous page as given") from None


def _matches(item: dict[str, Any], node: str | None, pod: str | None) -> bool:
    scope = item["scope"]
    if node and node != scope.get("node") and node not in scope.get("nodes", []):
        return False
    return not (pod and pod != scope.get("pod") and pod not in scope.get("pods", []))


def _iso(ns: int) -> str:
    from railtrace.model import rfc3339

    return rfc3339(ns)


@router.get(
    "/incidents",
    summary="Incidents: flagged requests grouped by the part that explains them, biggest cost first",
    response_model=IncidentPage,
)
async def list_incidents(
    rt: RuntimeDep,
    since: Annotated[
        TimeParam, Query(description="RFC 3339 or unix seconds; inclusive (default: until − 1 h)")
    ] = None,
    until: Annotated[
        TimeParam, Query(description="RFC 3339 or unix seconds; exclusive (default: now)")
    ] = None,
    cause: FlagName | None = None,
    node: Text = None,
    pod: Text = None,
    open: Annotated[bool | None, Query(description="only open (true) or ended (false) incidents")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> dict[str, Any]:
    since_ns, until_ns = _window(since, until)
    after = _after(cursor) if cursor else None
    found = await _compute(rt, since_ns, until_ns)
    items = [incident_dict(i) for i in found.incidents if cause is None or i.cause == cause.value]
    items = [i for i in items if _matches(i, node, pod) and (open is None or i["open"] is open)]
    items.sort(key=_sort_key)
    if after is not None:
        items = [i for i in items if _sort_key(i) > after]
    page = items[:limit]
    window = urlencode({"since": _iso(since_ns), "until": _iso(until_ns)})
    for item in page:
        item["requests_url"] += f"?{window}"
    return {
        "items": page,
        "next_cursor": _cursor(page[-1]) if len(items) > limit else None,
        "since": _iso(since_ns),
        "until": _iso(until_ns),
        "requests_read": found.rows,
        "partial": found.partial,
    }


@router.get(
    "/incidents/{incident_id}",
    summary="One incident with every trace id",
    response_model=IncidentItem,
)
async def get_incident(
    rt: RuntimeDep,
    incident_id: str,
    since: Annotated[
        TimeParam, Query(description="the window it was listed in (default: the last hour)")
    ] = None,
    until: TimeParam = None,
) -> dict[str, Any]:
    if len(incident_id) > 32:
        raise bad_request("id too long")
    since_ns, until_ns = _window(since, until)
    found = await _compute(rt, since_ns, until_ns)
    for inc in found.incidents:
        if inc.id == incident_id:
            return incident_dict(inc, full=True)
    raise HTTPException(404, f"no incident {incident_id!r} in {_iso(since_ns)}..{_iso(until_ns)}")
