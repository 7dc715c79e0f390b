"""`GET /api/v1/traces/{trace_id}`: the normalised spans of a request and its summary."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, HTTPException
from starlette.concurrency import run_in_threadpool

from railtrace.server.deps import RuntimeDep
from railtrace.server.routers.v1.params import TRACE_ID, bad_request
from railtrace.server.runtime import Runtime

router = APIRouter(tags=["traces"])
MAX_SPANS = 10_000


def _load(rt: Runtime, trace_id: str) -> dict[str, Any] | None:
    summary = rt.store.get_request(trace_id)
    trace_ids = set(summary.get("trace_ids") or []) if summary else set()
    trace_ids.add(trace_id)
    spans = rt.store.load_spans(sorted(trace_ids))
    if not spans and summary is None:
        return None
    return {
        "trace_id": trace_id,
        "trace_ids": sorted(trace_ids),
        "summary": summary,
        "spans": [asdict(s) for s in spans[:MAX_SPANS]],
        "truncated": len(spans) > MAX_SPANS,
    }


@router.get("/traces/{trace_id}", summary="Normalised spans of a trace (and its stitched siblings) + summary")
async def get_trace(rt: RuntimeDep, trace_id: str) -> dict[str, Any]:
    if not TRACE_ID.match(trace_id):
        raise bad_request("trace_id must be 32 hex digits")
    found = await run_in_threadpool(_load, rt, trace_id.lower())
    if found is None:
        raise HTTPException(404, f"no trace {trace_id}")
    return found
