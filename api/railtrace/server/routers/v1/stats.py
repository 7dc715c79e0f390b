"""`GET /api/v1/stats?group_by=path_class|flag|pair|coverage`: request counts and means per group.

`coverage` groups by tracing recipe (which hops the deployment traces) and by how both legs
resolved to node, GPU and NIC: what turning on more tracing, or the collector's k8sattributes
processor, would add. It also answers `sampling`, the latest estimate of the share of traffic
that is traced (`railtrace.server.sampling`): a share below 1 means every count here is of the
traced requests only."""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from railtrace.server.deps import RuntimeDep
from railtrace.server.routers.v1.params import TimeParam, bad_request, check_range, to_ns
from railtrace.store import timeseries as ts
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


class Bucket(BaseModel):
    """One time bucket: [start_ns, end_ns), the first and last clipped to the window."""

    start_ns: int
    end_ns: int
    requests: int = Field(description="requests that started in the bucket")
    path_class: dict[str, int] = Field(description="requests per KV path class")
    flags: dict[str, int] = Field(description="requests per flag (a request may have several)")
    ttft_s_p50: float | None
    ttft_s_p90: float | None
    ttft_s_p99: float | None


class Timeseries(BaseModel):
    since_ns: int
    until_ns: int
    step_s: float = Field(description="bucket width, chosen by the service from `buckets`")
    relative_error: float = Field(description="TTFT quantiles are within this of the exact ones")
    requests: int = Field(description="requests in the whole window")
    buckets: list[Bucket]


class Transfer(BaseModel):
    prefill_node: str | None
    decode_node: str | None
    path_class: str
    pairing_level: str | None
    requests: int
    kv_bytes: int | None
    kv_duration_s_mean: float | None


class Transfers(BaseModel):
    since_ns: int
    until_ns: int
    groups: list[Transfer]
    truncated: bool = Field(description=f"more than {ts.MAX_TRANSFER_GROUPS} groups: the largest kept")


def _window(since: Any, until: Any) -> tuple[int, int]:
    since_ns, until_ns = to_ns(since), to_ns(until)
    if since_ns is None:
        raise bad_request("since is required")
    if until_ns is None:
        until_ns = time.time_ns()
    check_range(since_ns, until_ns)
    return since_ns, until_ns


@router.get(
    "/stats/timeseries",
    summary="Requests per path class, per flag and TTFT p50/p90/p99 per time bucket of the window",
    response_model=Timeseries,
)
async def timeseries(
    rt: RuntimeDep,
    since: Annotated[TimeParam, Query(description="RFC 3339 or unix seconds; inclusive; required")] = None,
    until: Annotated[TimeParam, Query(description="RFC 3339 or unix seconds; exclusive; default now")] = None,
    buckets: Annotated[
        int, Query(ge=1, le=ts.MAX_BUCKETS, description="at most this many buckets (the step is chosen)")
    ] = 60,
) -> dict[str, Any]:
    since_ns, until_ns = _window(since, until)
    try:
        step = ts.step_for(since_ns, until_ns, buckets)
    except ts.WindowError as exc:
        raise bad_request(str(exc)) from None
    return await run_in_threadpool(ts.timeseries, rt.store, since_ns, until_ns, step)


@router.get(
    "/stats/transfers",
    summary="Requests with a KV transfer per prefill node, decode node, path class and pairing level",
    response_model=Transfers,
)
async def transfers(
    rt: RuntimeDep,
    since: Annotated[TimeParam, Query(description="RFC 3339 or unix seconds; inclusive; required")] = None,
    until: Annotated[TimeParam, Query(description="RFC 3339 or unix seconds; exclusive; default now")] = None,
) -> dict[str, Any]:
    since_ns, until_ns = _window(since, until)
    try:
        return await run_in_threadpool(ts.transfers, rt.store, since_ns, until_ns)
    except ts.WindowError as exc:
        raise bad_request(str(exc)) from None
