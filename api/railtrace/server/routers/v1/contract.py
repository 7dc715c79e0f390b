"""`GET /api/v1/contract`: the topology-contract audit over the live topology and recent traffic."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query

from railtrace.server.deps import RuntimeDep
from railtrace.server.runtime import TopologyUnavailable
from railtrace.topology.k8s_keys import ROLE_LABEL

router = APIRouter(tags=["contract"])


@router.get("/contract", summary="Discovered / preserved / verified / consumed, per pod, node, pool, fleet")
def get_contract(
    rt: RuntimeDep,
    pod: str | None = Query(None, max_length=253, description="pod name or namespace/name"),
    node: str | None = Query(None, max_length=253),
    pool: str | None = Query(None, max_length=253, description=f"prefill, decode, or an {ROLE_LABEL}"),
    obligation: str | None = Query(None, max_length=32),
    status: str | None = Query(None, max_length=16),
) -> dict[str, Any]:
    from railtrace.contract.report import filter_report

    try:
        report = rt.contract_report()
    except TopologyUnavailable as exc:
        raise HTTPException(503, str(exc)) from None
    try:
        return filter_report(report, pod=pod, node=node, pool=pool, obligation=obligation, status=status)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
