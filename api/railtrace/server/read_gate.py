"""Admission control for the query API, so that readers cannot starve ingest.

Every read of `/api/...` (the web UI's data, Grafana's Tempo data source, scripts) runs its
query in a worker thread and renders its answer on the event loop; exports are parsed on the
same event loop and committed by the writer thread, all in one process under one GIL and on
the same cores as the readers' own clients. Unbounded, 200 concurrent UI readers kept up to 40
worker threads querying (AnyIO's default pool, which also inflates gzip exports) and took the
CPU that ingest needed, however briefly each read ran.

`ReadGate` gives reads turns (`ReadAdmission`): `read_concurrency` at once while ingest is idle.
While ingest has work (an export in progress, or spans waiting for their commit) one turn at a
time, `read_concurrency_ingesting`, and after each read that turn rests until reads have had no
more than `read_share_ingesting` of the time: a read that took 10 ms rests 30 ms at 0.25. Reads
beyond the turns wait in arrival order on the event loop, holding no thread or connection; one
that finds `read_queue` readers waiting already, or waits longer than `read_wait_s`, is
answered 503 with `Retry-After`. Ingest, probes (`/healthz`, `/readyz`), `/metrics` and the
UI's page shells never pass through the gate. Readers get slower under ingest; ingest does not.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

import orjson

from railtrace.server.security import API_PREFIXES, INGEST_PATHS, ASGIApp, Receive, Scope, Send

READ_METHODS = ("GET", "HEAD")
# Longest rest of a turn after one read: a read that ran for seconds does not hold every other
# reader out for three times as long.
MAX_REST_S = 1.0


class ReadAdmission:
    """Turns for reads, from one event loop (no locks).

    At most `concurrency` turns out at once, `busy_concurrency` while ingest is busy (`busy()`,
    or an export in progress through `ingest_started`/`ingest_ended`); while busy, a turn that
    ends rests so that reads hold it no more than `busy_share` of the time. Up to `queue`
    readers wait, first come first served, each for at most `wait_s`."""

    def __init__(
        self,
        concurrency: int,
        queue: int,
        wait_s: float,
        *,
        busy: Callable[[], bool] | None = None,
        busy_concurrency: int = 1,
        busy_share: float = 1.0,
    ) -> None:
        self.concurrency = max(1, concurrency)
        self.busy_concurrency = max(1, min(busy_concurrency, self.concurrency))
        self.busy_share = min(1.0, max(0.01, busy_share))
        self._busy = busy
        self.queue = max(0, queue)
        self.wait_s = wait_s
        self.active = 0  # turns out: held by a read, or resting
        self.admitted = 0
        self.refused = 0  # queue full
        self.timed_out = 0  # waited `wait_s` without a turn
        self.exports = 0  # exports in progress
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def ingesting(self) -> bool:
        return self.exports > 0 or (self._busy is not None and self._busy())

    @property
    def bound(self) -> int:
        """Turns that may be out now."""
        return self.busy_concurrency if self.ingesting else self.concurrency

    def ingest_started(self) -> None:
        self.exports += 1

    def ingest_ended(self) -> None:
        self.exports -= 1

    async def acquire(self) -> bool:
        """Take a turn (True), or False when the queue is full or the wait ran out."""
        if not self._waiters and self.active < self.bound:
            self.active += 1
            self.admitted += 1
            return True
        if len(self._waiters) >= self.queue:
            self.refused += 1
            return False
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(turn)
        try:
            async with asyncio.timeout(self.wait_s):
                await turn
        except BaseException as exc:  # timed out, or the request was cancelled while waiting
            if turn.done() and not turn.cancelled():
                self._hand_on()  # the turn came just as the wait ended: pass it on
            else:
                self._waiters.remove(turn)
            if isinstance(exc, TimeoutError):
                self.timed_out += 1
                return False
            raise
        self.admitted += 1
        return True

    def release(self, held_s: float = 0.0) -> None:
        """End a turn held for `held_s`: while ingest is busy it rests first, so that reads
        hold it at most `busy_share` of the time."""
        rest = min(MAX_REST_S, held_s * (1 - self.busy_share) / self.busy_share)
        if rest > 0 and self.ingesting:
            asyncio.get_running_loop().call_later(rest, self._hand_on)
        else:
            self._hand_on()

    def _hand_on(self) -> None:
        """A turn comes back: give turns to the longest waiters, as many as the bound allows
        now (at least one while any wait: a reader only waits behind a turn that is out)."""
        self.active -= 1
        bound = self.bound
        while self._waiters and self.active < bound:
            turn = self._waiters.popleft()
            if not turn.done():
                turn.set_result(None)
                self.active += 1


class ReadGate:
    """ASGI middleware: `GET`/`HEAD` under `/api/` and `/jaeger/api/` take a turn of
    `ReadAdmission` for their whole answer (query, rendering and sending); exports are counted
    while in progress; anything else passes straight through."""

    def __init__(self, app: ASGIApp, admission: ReadAdmission, retry_after_s: int) -> None:
        self.app = app
        self.admission = admission
        self.retry_after = str(max(1, retry_after_s)).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        if scope.get("method") in READ_METHODS and path.startswith(API_PREFIXES):
            await self._read(scope, receive, send)
        elif path in INGEST_PATHS:
            self.admission.ingest_started()
            try:
                await self.app(scope, receive, send)
            finally:
                self.admission.ingest_ended()
        else:
            await self.app(scope, receive, send)

    async def _read(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not await self.admission.acquire():
            await self._busy(send)
            return
        started = time.monotonic()
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.release(time.monotonic() - started)

    async def _busy(self, send: Send) -> None:
        a = self.admission
        body = orjson.dumps(
            {
                "detail": f"too many API reads at once ({a.active} running, {a.waiting} waiting);"
                f" retry after {self.retry_after.decode()} s"
            }
        )
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", self.retry_after),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
