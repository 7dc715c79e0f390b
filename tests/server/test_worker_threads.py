"""Handlers that must not wait for a worker thread, on SQLite and PostgreSQL.

FastAPI runs a plain `def` dependency in the worker-thread pool (AnyIO's limiter, 40 threads),
the same pool that parses export bodies and runs the store's queries. Resolving the runtime
that way cost every call a thread hop, and with every thread busy an export waited for one
before it could be told 429: load shedding queued behind the load it exists to shed.
"""

from __future__ import annotations

import anyio
import anyio.to_thread
import httpx

from railtrace.server import create_app
from railtrace.server.otlp_http import PROTOBUF
from tests.service_helpers import settings_for


async def _export_with_every_worker_thread_taken(app: object) -> httpx.Response:
    limiter = anyio.to_thread.current_default_thread_limiter()
    holders = [object() for _ in range(int(limiter.total_tokens))]
    for holder in holders:
        await limiter.acquire_on_behalf_of(holder)
    try:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://railtrace") as client:
            with anyio.fail_after(10):
                return await client.post("/v1/traces", content=b"", headers={"content-type": PROTOBUF})
    finally:
        for holder in holders:
            limiter.release_on_behalf_of(holder)


def test_an_export_over_the_bound_is_refused_without_a_worker_thread(db_url: str) -> None:
    # Bound 0: the writer is always "full", so the answer is 429 before the body is read.
    app = create_app(settings_for(db_url, max_pending_spans=0))
    try:
        response = anyio.run(_export_with_every_worker_thread_taken, app)
    finally:
        app.state.runtime.engine.dispose()
    assert response.status_code == 429
    assert response.headers["retry-after"]
