"""`GET /api/v1/stats?group_by=path_class|flag|pair`: request counts and means per group."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from railtrace.server.deps import RuntimeDep
from railtrace.server.routers.v1.params import TimeParam, bad_request, check_range, to_ns
from railtrace.store import StoreError
from railtrace.store.quantiles import MAX_ROWS, ttft_quantiles

router = APIRouter(tags=["stats"])


class GroupBy(StrEnum):
    PATH_CLASS = "path_class"
    FLAG = "flag"
    PAIR = "pair"


@router.get("/stats", summary="Requests per path class, flag or prefill/decode node pair")
async def stats(
    rt: RuntimeDep,
    group_by: GroupBy = GroupBy.PATH_CLASS,
    since: Annotated[TimeParam, Query(description="RFC 3339 or unix seconds; inclusive")] = None,
    until: Annotated[TimeParam, Query(description="RFC 3339 or unix seconds; exclusive")] = None,
) -> dict[str, Any]:
    since_ns, until_ns = to_ns(since), to_ns(until)
    check_range(since_ns, until_ns)
    groups = await run_in_threadpool(rt.store.stats, group_by.value, since_ns, until_ns)
    return {"group_by": group_by.value, "since": since, "until": until, "groups": groups}


class QuantileGroup(StrEnum):
    PATH_CLASS = "path_class"
    PAIRING_LEVEL = "pairing_level"


@router.get(
    "/stats/ttft",
    summary=f"TTFT p50/p90/p99 per path class or pairing level (newest {MAX_ROWS:,} requests of the window)",
)
async def ttft_stats(
    rt: RuntimeDep,
    group_by: QuantileGroup = QuantileGroup.PATH_CLASS,
    since: Annotated[TimeParam, Query(description="RFC 3339 or unix seconds; inclusive")] = None,
    until: Annotated[TimeParam, Query(description="RFC 3339 or unix seconds; exclusive")] = None,
) -> dict[str, Any]:
    since_ns, until_ns = to_ns(since), to_ns(until)
    check_range(since_ns, until_ns)
    try:
        return await run_in_threadpool(ttft_quantiles, rt.store, group_by.value, since_ns, until_ns)
    except StoreError as exc:
        raise bad_request(str(exc)) from None
