"""`GET /api/v1/topology` and `POST /api/v1/topology/reload`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException
from starlette.concurrency import run_in_threadpool

from railtrace.server.deps import RuntimeDep
from railtrace.server.runtime import TopologyUnavailable

router = APIRouter(tags=["topology"])


@router.get("/topology", summary="The topology model verdicts are judged against")
def get_topology(rt: RuntimeDep) -> dict[str, Any]:
    try:
        return rt.topology().to_dict()
    except TopologyUnavailable as exc:
        raise HTTPException(503, str(exc)) from None


@router.post("/topology/reload", summary="Re-read the topology inputs without a restart")
async def reload_topology(rt: RuntimeDep) -> dict[str, Any]:
    if rt.topology_holder is None:
        raise HTTPException(503, rt.topology_error or "no topology")
    try:
        await run_in_threadpool(rt.topology_holder.reload)
    except Exception as exc:  # TopologyError: unreadable input; the old model stays in force
        raise HTTPException(400, f"reload failed, previous topology kept: {exc}") from None
    return rt.topology().to_dict()
