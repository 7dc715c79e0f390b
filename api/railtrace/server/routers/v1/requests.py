"""`GET /api/v1/requests` (filtered, keyset-paged) and `GET /api/v1/requests/{id}`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Response
from starlette.concurrency import run_in_threadpool

from railtrace.query.budget import QueryUnavailable
from railtrace.server.deps import RuntimeDep
from railtrace.server.routers.v1.params import TimeParam, bad_request, to_ns, unavailable
from railtrace.store import Cursor, RequestQuery, StoreError
from railtrace.store.queries import DEFAULT_LIMIT, MAX_LIMIT, RequestOrder
from railtrace_tracing.semconv import FlagName, PathClass

router = APIRouter(tags=["requests"])

Text = Annotated[str | None, Query(max_length=256)]


@router.get(
    "/requests",
    summary="Request summaries, newest first or slowest first, with filters and cursor paging",
)
async def list_requests(
    rt: RuntimeDep,
    flag: FlagName | None = None,
    path_class: PathClass | None = None,
    since: Annotated[TimeParam, Query(description="RFC 3339 or unix seconds; inclusive")] = None,
    until: Annotated[TimeParam, Query(description="RFC 3339 or unix seconds; exclusive")] = None,
    node: Text = None,
    pod: Text = None,
    model: Text = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
    cursor: Annotated[
        str | None, Query(max_length=512, description="`next_cursor` of the previous page")
    ] = None,
    order: Annotated[
        RequestOrder,
        Query(
            description="`start`: newest first. `ttft`, `kv_time`: slowest first, over the requests "
            "that have a TTFT / a KV transfer. A cursor pages on only in the order that issued it."
        ),
    ] = RequestOrder.START,
) -> dict[str, Any]:
    try:
        query = RequestQuery(
            flag=flag.value if flag else None,
            path_class=path_class.value if path_class else None,
            since_ns=to_ns(since),
            until_ns=to_ns(until),
            node=node,
            pod=pod,
            model=model,
            limit=limit,
            cursor=Cursor.decode(cursor) if cursor else None,
            order=order,
        )
    except StoreError as exc:
        raise bad_request(str(exc)) from None
    # One indexed query of at most `limit` rows: its budget is the time one, enforced by the gate.
    try:
        page = await rt.queries.run(lambda _b: rt.store.list_requests(query), rt.queries.budget(limit))
    except QueryUnavailable as exc:
        raise unavailable(exc) from None
    return {"items": page.items, "next_cursor": page.next_cursor}


@router.get(
    # `{ident:path}`: request ids (EPP x-request-ids, vLLM ids) may hold `/`, sent as `%2F`,
    # which the server decodes before routing.
    "/requests/{ident:path}",
    summary="One request summary by trace id (any of its traces) or request id (percent-encoded)",
    response_model=dict[str, Any],
)
async def get_request(rt: RuntimeDep, ident: str) -> Response:
    if len(ident) > 256:
        raise bad_request("id too long")
    key = ident.lower() if len(ident) == 32 else ident
    summary = await run_in_threadpool(rt.store.get_request_json, key)
    if summary is None:
        raise HTTPException(404, f"no request {ident!r} (yet: requests are assembled after a quiet period)")
    # The summary is stored as the JSON this endpoint answers with: sent as stored, not parsed
    # and encoded again (most of the cost of an answer).
    return Response(summary, media_type="application/json")
