"""Readers cannot starve ingest: API reads take turns (`railtrace.server.read_gate`).

With every read turn taken and the queue full, an OTLP export (HTTP and gRPC), the probes,
`/metrics` and the UI's page shell are still answered at once, and one more reader gets a 503
with `Retry-After` and a reason; a reader that waits too long gets the same. Not timed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from railtrace.server.read_gate import ReadAdmission
from railtrace.server.runner import Service
from tests.service_helpers import export_request, settings_for, wait_for

# -- the admission itself ------------------------------------------------------------------


def test_turns_are_bounded_and_handed_on_in_arrival_order() -> None:
    async def scenario() -> list[str]:
        gate = ReadAdmission(concurrency=2, queue=10, wait_s=10)
        order: list[str] = []

        async def reader(name: str, hold: asyncio.Event) -> None:
            assert await gate.acquire()
            order.append(name)
            await hold.wait()
            gate.release()

        holds = {n: asyncio.Event() for n in "abcd"}
        tasks = []
        for n in "abcd":
            tasks.append(asyncio.create_task(reader(n, holds[n])))
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        assert (gate.active, gate.waiting, order) == (2, 2, ["a", "b"])
        holds["b"].set()
        await asyncio.sleep(0.01)
        assert order == ["a", "b", "c"] and gate.active == 2 and gate.waiting == 1
        for hold in holds.values():
            hold.set()
        await asyncio.gather(*tasks)
        assert (gate.active, gate.waiting, gate.admitted) == (0, 0, 4)
        return order

    assert asyncio.run(scenario()) == ["a", "b", "c", "d"]


def test_a_full_queue_refuses_and_a_long_wait_times_out() -> None:
    async def scenario() -> None:
        gate = ReadAdmission(concurrency=1, queue=1, wait_s=0.2)
        assert await gate.acquire()  # the one turn, kept
        waiter = asyncio.create_task(gate.acquire())
        await asyncio.sleep(0.01)
        assert not await gate.acquire()  # the queue (1) is full
        assert gate.refused == 1
        assert await waiter is False  # waited 0.2 s without a turn
        assert (gate.timed_out, gate.waiting, gate.active) == (1, 0, 1)
        gate.release()
        assert gate.active == 0

    asyncio.run(scenario())


def test_while_ingest_is_busy_fewer_turns_are_handed_out() -> None:
    async def scenario() -> None:
        busy = [False]
        gate = ReadAdmission(concurrency=3, queue=10, wait_s=10, busy=lambda: busy[0], busy_concurrency=1)
        assert [await gate.acquire() for _ in range(3)] == [True] * 3
        busy[0] = True
        waiters = [asyncio.create_task(gate.acquire()) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert gate.waiting == 3
        gate.release()
        gate.release()  # 1 turn out: at the busy bound, nobody is let in
        await asyncio.sleep(0.01)
        assert (gate.active, gate.waiting) == (1, 3)
        gate.release()  # the last turn out: one waiter takes it
        await asyncio.sleep(0.01)
        assert (gate.active, gate.waiting) == (1, 2)
        busy[0] = False
        gate.release()  # ingest idle again: the full bound
        assert await asyncio.gather(*waiters) == [True] * 3
        assert (gate.active, gate.waiting) == (2, 0)

    asyncio.run(scenario())


def test_while_an_export_is_in_progress_a_turn_rests_after_each_read() -> None:
    async def scenario() -> None:
        gate = ReadAdmission(concurrency=2, queue=10, wait_s=10, busy_share=0.5)
        assert await gate.acquire()
        gate.ingest_started()
        assert gate.ingesting and gate.bound == 1
        waiter = asyncio.create_task(gate.acquire())
        await asyncio.sleep(0.01)
        gate.release(held_s=0.2)  # held 0.2 s at a share of 0.5: rests 0.2 s
        await asyncio.sleep(0.05)
        assert not waiter.done() and gate.active == 1
        assert await asyncio.wait_for(waiter, 2)
        gate.ingest_ended()
        assert not gate.ingesting and gate.bound == 2
        gate.release(held_s=0.2)  # ingest idle: no rest
        assert gate.active == 0

    asyncio.run(scenario())


def test_a_reader_that_goes_away_while_waiting_leaves_the_queue() -> None:
    async def scenario() -> None:
        gate = ReadAdmission(concurrency=1, queue=5, wait_s=10)
        assert await gate.acquire()
        waiter = asyncio.create_task(gate.acquire())
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert gate.waiting == 0
        gate.release()
        assert gate.active == 0
        assert await gate.acquire()  # the turn is free again

    asyncio.run(scenario())


HELD = "/api/v1/requests/no-such-request"

# -- a running service with its read turns all taken -----------------------------------------


class HeldReads:
    """Makes the request lookup (`GET /api/v1/requests/{id}`, which nothing but that route calls)
    block until released, so that the test decides how long a read's turn lasts."""

    def __init__(self, svc: Service) -> None:
        assert svc.runtime is not None
        self.store = svc.runtime.store
        self.original = self.store.get_request_json
        self.release = threading.Event()
        self.entered = 0

        def held(ident: str) -> Any:
            self.entered += 1
            self.release.wait(30)
            return self.original(ident)

        self.store.get_request_json = held  # type: ignore[method-assign]

    def restore(self) -> None:
        self.release.set()
        self.store.get_request_json = self.original  # type: ignore[method-assign]


@pytest.fixture
def gated(tmp_path: Any) -> Iterator[Service]:
    """One read turn, one waiting place, a short wait; SQLite (the gate is the same on any store)."""
    settings = settings_for(
        f"sqlite:///{tmp_path / 'railtrace.db'}", read_concurrency=1, read_queue=1, read_wait_s=30
    )
    with Service(settings) as svc:
        yield svc


def test_with_the_read_turns_taken_ingest_and_probes_answer_and_a_reader_gets_503(gated: Service) -> None:
    svc = gated
    held = HeldReads(svc)
    base = svc.http_url
    pool = ThreadPoolExecutor(2)
    try:
        running: Future[httpx.Response] = pool.submit(httpx.get, base + HELD, timeout=60)
        wait_for(lambda: held.entered == 1, what="the first read to take the turn")
        waiting: Future[httpx.Response] = pool.submit(httpx.get, base + HELD, timeout=60)
        wait_for(lambda: svc_reads(svc).waiting == 1, what="the second read to wait")

        refused = httpx.get(base + "/api/v1/stats", timeout=10)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == str(svc.settings.retry_after_s)
        assert "too many API reads" in refused.json()["detail"]

        # Ingest over both receivers, the probes, /metrics and the page shell do not queue.
        req = export_request([1, 2])
        r = httpx.post(
            base + "/v1/traces",
            content=req.SerializeToString(),
            headers={"content-type": "application/x-protobuf"},
            timeout=10,
        )
        assert r.status_code == 200, r.text
        with grpc.insecure_channel(svc.grpc_endpoint) as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            stub.Export(export_request([3]), timeout=10)
        for path in ("/healthz", "/readyz", "/metrics", "/requests"):
            assert httpx.get(base + path, timeout=10).status_code == 200, path
        assert svc.runtime is not None and svc.runtime.store.count_spans() == 24
        assert not running.done() and not waiting.done()

        held.release.set()
        assert running.result(30).status_code == 404  # answered: no such request
        assert waiting.result(30).status_code == 404
        assert (svc_reads(svc).active, svc_reads(svc).waiting) == (0, 0)
    finally:
        held.restore()
        pool.shutdown(wait=True)


def test_a_reader_that_waits_too_long_gets_503(tmp_path: Any) -> None:
    settings = settings_for(f"sqlite:///{tmp_path / 'railtrace.db'}", read_concurrency=1, read_wait_s=0.3)
    with Service(settings) as svc:
        held = HeldReads(svc)
        pool = ThreadPoolExecutor(1)
        try:
            running = pool.submit(httpx.get, svc.http_url + HELD, timeout=60)
            wait_for(lambda: held.entered == 1, what="the first read to take the turn")
            late = httpx.get(svc.http_url + "/api/v1/requests/abc", timeout=10)
            assert late.status_code == 503
            assert late.headers["retry-after"]
            held.release.set()
            assert running.result(30).status_code == 404
            # The turn is free again: the next read is answered.
            assert httpx.get(svc.http_url + "/api/v1/requests", timeout=10).status_code == 200
        finally:
            held.restore()
            pool.shutdown(wait=True)


def svc_reads(svc: Service) -> ReadAdmission:
    """The read admission of the service's app."""
    assert svc.app is not None
    admission: ReadAdmission = svc.app.state.reads
    return admission
