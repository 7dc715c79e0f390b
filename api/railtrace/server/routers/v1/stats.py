"""`GET /api/v1/stats?group_by=path_class|flag|pair|coverage`: request counts and means per group.

`coverage` groups by tracing recipe (which hops the deployment traces) and by how both legs
resolved to node, GPU and NIC: what turning on more tracing, or the collector's k8sattributes
processor, would add. It also answers `sampling`, the latest estimate of the share of traffic
that is traced (`railtrace.server.sampling`): a share below 1 means every count here is of the
traced requests only."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from railtrace.server.deps import RuntimeDep
from railtrace.server.routers.v1.params import TimeParam, check_range, to_ns
from railtrace.store.quantiles import ttft_quantiles

router = APIRouter(tags=["stats"])


class GroupBy(StrEnum):
    PATH_CLASS = "path_class"
    FLAG = "flag"
    PAIR = "pair"
    COVERAGE = "coverage"


@router.get("/stats", summary="Requests per path class, flag, prefill/decode node pair or tracing coverage")
async def stats(
    rt: RuntimeDep,
    group_by: GroupBy = GroupBy.PATH_CLASS,
    since: Annotated[TimeParam, Query(description="RFC 3339 or unix seconds; inclusive")] = None,
    until: Annotated[TimeParam, Query(description="RFC 3339 or unix seconds; exclusive")] = None,
) -> dict[str, Any]:
    since_ns, until_ns = to_ns(since), to_ns(until)
    check_range(since_ns, until_ns)
    groups = await run_in_threadpool(rt.store.stats, group_by.value, since_ns, until_ns)
    out: dict[str, Any] = {"group_by": group_by.value, "since": since, "until": until, "groups": groups}
    if group_by is GroupBy.COVERAGE:
        out["sampling"] = rt.sampling.snapshot()
    return out


@router.get(
    "/stats/ttft",
    summary="TTFT p50/p90/p99 per path class and pairing level over the window (within 1 %)",
)
async def ttft_stats(
    rt: RuntimeDep,
    since: Annotated[TimeParam, Query(description="RFC 3339 or unix seconds; inclusive")] = None,
    until: Annotated[TimeParam, Query(description="RFC 3339 or unix seconds; exclusive")] = None,
) -> dict[str, Any]:
    since_ns, until_ns = to_ns(since), to_ns(until)
    check_range(since_ns, until_ns)
    return await run_in_threadpool(ttft_quantiles, rt.store, since_ns, until_ns)
