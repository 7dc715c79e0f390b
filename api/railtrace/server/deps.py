"""FastAPI dependencies: the runtime of this app instance."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from railtrace.server.runtime import Runtime


async def get_runtime(request: Request) -> Runtime:
    """`async` on purpose: FastAPI runs a plain `def` dependency in the worker-thread pool,
    which cost every call a thread hop and made an export wait for a free thread before it
    could even be refused (tests/server/test_worker_threads.py)."""
    return request.app.state.runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
