"""Liveness, readiness and the Prometheus endpoint."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from railtrace.server.deps import RuntimeDep
from railtrace.server.runtime import Runtime

router = APIRouter(tags=["health"])


@router.get(
    "/healthz",
    summary="Liveness: the process answers and its writer is not stuck",
    responses={503: {"description": "Restart me: the body lists why"}},
)
def healthz(rt: RuntimeDep) -> Response:
    """503 only for what a restart may fix: the writer thread is gone, or database writes have
    failed for longer than `write_failure_restart_s`. A shorter outage only makes /readyz 503
    while the writer retries the database by itself."""
    problems = rt.liveness_problems()
    if problems:
        return JSONResponse({"status": "failing", "problems": problems}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get(
    "/readyz",
    summary="Readiness: database reachable, writer healthy and keeping up",
    responses={503: {"description": "Not ready: the body lists the problems"}},
)
def readyz(rt: RuntimeDep) -> Response:
    problems: list[str] = []
    database = rt.ping_database()
    if database:
        problems.append(database)
    if not rt.writer.healthy:
        problems.append("writer: not running or failing")
    elif rt.writer.pending >= rt.settings.max_pending_spans:
        problems.append("writer: behind")
    body = {
        "status": "ok" if not problems else "unavailable",
        "problems": problems,
        "pending_spans": rt.writer.pending,
        "assembly": _assembly_state(rt),
        "topology": "loaded" if rt.topology_holder is not None else (rt.topology_error or "none"),
    }
    return JSONResponse(body, status_code=200 if not problems else 503)


@router.get(
    "/metrics",
    summary="Prometheus metrics (OpenMetrics with trace-id exemplars when asked)",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}, "application/openmetrics-text": {}}}},
)
def metrics(request: Request, rt: RuntimeDep) -> Response:
    rt.refresh_contract_gauge()
    rt.sampling.refresh_gauges()
    body, media = rt.metrics.render(request.headers.get("accept"))
    return Response(body, media_type=media)


def _assembly_state(rt: Runtime) -> str:
    if rt.assembler:
        return "running"
    if rt.assembly_workers:
        return f"running in {rt.assembly_workers.alive} of {rt.assembly_workers.processes} processes"
    return rt.assembly_error or "off"
