"""`GET /api/v1/topology` and `POST /api/v1/topology/reload`."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, HTTPException, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from railtrace.server.deps import RuntimeDep
from railtrace.server.runtime import TopologyUnavailable

router = APIRouter(tags=["topology"])


def _encoded(request: Request, model: Any) -> bytes:
    """The model as JSON, encoded once per model: it only changes on reload, and encoding a
    fleet's model (labels, devices, sources) costs far more than sending it."""
    cached = getattr(request.app.state, "topology_json", None)
    if cached is not None and cached[0] is model:
        return cached[1]
    body = orjson.dumps(model.to_dict())
    request.app.state.topology_json = (model, body)
    return body


def _summary(model: Any) -> dict[str, Any]:
    """Counts for a fleet page, and what needs attention; without encoding the whole model."""
    return {
        "nodes": len(model.nodes),
        "pods": len(model.pods),
        "blocks": len({n.block for n in model.nodes.values() if n.block}),
        "subblocks": len({(n.block, n.subblock) for n in model.nodes.values() if n.subblock}),
        "rails": len({n.rail for n in model.nics if n.rail}),
        "warnings": list(model.warnings),
        "discovery_gaps": [
            {"object": g.object, "missing": list(g.missing), "note": g.note} for g in model.gaps
        ],
    }


@router.get(
    "/topology",
    summary="The topology model verdicts are judged against (`summary=true`: counts, warnings, gaps)",
    response_model=dict[str, Any],
)
async def get_topology(
    rt: RuntimeDep, request: Request, summary: Annotated[bool, Query()] = False
) -> Response:
    try:
        model = rt.topology()
    except TopologyUnavailable as exc:
        raise HTTPException(503, str(exc)) from None
    if summary:
        return Response(orjson.dumps(_summary(model)), media_type="application/json")
    return Response(await run_in_threadpool(_encoded, request, model), media_type="application/json")


@router.post("/topology/reload", summary="Re-read the topology inputs without a restart")
async def reload_topology(rt: RuntimeDep) -> dict[str, Any]:
    if rt.topology_holder is None:
        raise HTTPException(503, rt.topology_error or "no topology")
    try:
        await run_in_threadpool(rt.topology_holder.reload)
    except Exception as exc:  # TopologyError: unreadable input; the old model stays in force
        raise HTTPException(400, f"reload failed, previous topology kept: {exc}") from None
    return rt.topology().to_dict()
