"""REST API v1: requests, traces, topology, stats, contract, incidents."""

from fastapi import APIRouter

from railtrace.server.routers.v1 import contract, incidents, requests, stats, topology, traces

router = APIRouter(prefix="/api/v1")
for _module in (requests, traces, topology, stats, contract, incidents):
    router.include_router(_module.router)

__all__ = ["router"]
