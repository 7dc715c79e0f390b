"""FastAPI dependencies: the runtime of this app instance."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from railtrace.server.runtime import Runtime


def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
