"""Hostile and heavy queries: a backtracking TraceQL regex, searches and trace reads over their
budgets, and many searches at once against a real `railtrace serve`, on SQLite and PostgreSQL.

What must hold: a pattern is answered at once (RE2 runs it in linear time, or it is refused with
a 400); a query over its budget answers with what it found, marked partial, or a clear 503;
liveness and OTLP exports are answered while searches run; SIGTERM ends the process within the
deployment's grace period (30 s, deploy/base/railtrace-deployment.yaml) whatever a query is doing.
Bounds are for "answered at all", never speed.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from railtrace.query.budget import QueryGate, QueryUnavailable
from railtrace.query.traceql import MAX_PATTERN_CHARS, TraceQLError, compile_pattern
from railtrace.server.runner import Service
from tests.reliability.crash_harness import Server, assembled, pd_batch
from tests.service_helpers import export_request, post, settings_for, trace_id, wait_for

HOSTILE = '{ name =~ "(.*.*)*Z" }'
TRACES = 40
SPANS_PER_TRACE = 8
GRACE_S = 30  # terminationGracePeriodSeconds of the shipped deployment


@contextmanager
def _service(db_url: str, **overrides: Any) -> Iterator[Service]:
    with Service(settings_for(db_url, **overrides)) as svc:
        yield svc


@pytest.fixture
def filled(db_url: str) -> str:
    """`db_url` holding TRACES assembled P/D requests of SPANS_PER_TRACE spans each."""
    with _service(db_url) as svc:
        post(svc, export_request(list(range(TRACES))))
        wait_for(
            lambda: (
                len(httpx.get(svc.http_url + "/api/v1/requests", params={"limit": 1000}).json()["items"])
                == TRACES
            ),
            what="every request assembled",
        )
    return db_url


def _search(svc: Service, q: str, **params: Any) -> httpx.Response:
    return httpx.get(svc.http_url + "/api/search", params={"q": q, **params}, timeout=60)


# -- Patterns ---------------------------------------------------------------------------------


def test_a_backtracking_pattern_runs_in_linear_time() -> None:
    pattern = compile_pattern("(.*.*)*Z")
    assert pattern.fullmatch("a" * 100_000) is None  # exponential in Python's re; linear in RE2
    assert pattern.fullmatch("a" * 1000 + "Z") is not None


@pytest.mark.parametrize(
    "pattern",
    [r"(a)\1", "(?=a)a", "(?<=a)b", "(?!x).*", "[", "a{1001}", "a" * (MAX_PATTERN_CHARS + 1)],
)
def test_patterns_re2_cannot_run_are_refused(pattern: str) -> None:
    with pytest.raises(TraceQLError):
        compile_pattern(pattern)


def test_the_hostile_search_is_answered_and_unrunnable_patterns_are_400(filled: str) -> None:
    with _service(filled) as svc:
        r = _search(svc, HOSTILE)
        assert r.status_code == 200, r.text
        assert r.json()["traces"] == [] and "partial" not in r.json()
        assert r.json()["metrics"]["inspectedTraces"] == TRACES
        # Regexes still match what they should, whole, as in Tempo.
        found = _search(svc, '{ name =~ "forward_.*" }', limit=100).json()["traces"]
        assert len(found) == TRACES
        assert _search(svc, '{ name =~ "forward" }').json()["traces"] == []
        assert len(_search(svc, '{ name !~ "nothing.*" }', limit=100).json()["traces"]) == TRACES
        for q in (r'{ name =~ "(a)\\1" }', '{ name !~ "(?=a)a" }', '{ name =~ "' + "a" * 1001 + '" }'):
            r = _search(svc, q)
            assert r.status_code == 400, (q, r.text)
            assert "invalid TraceQL query" in r.json()["detail"]
        r = _search(svc, r'{ name =~ "(x)\\1" }')
        assert "RE2" in r.json()["detail"] and "backreferences" in r.json()["detail"]


# -- Budgets ----------------------------------------------------------------------------------


def test_a_search_over_its_budgets_answers_partial(filled: str) -> None:
    with _service(filled, search_max_spans=3 * SPANS_PER_TRACE) as svc:
        r = _search(svc, '{ name = "nothing" }')
        body = r.json()
        assert r.status_code == 200 and body["partial"] is True, r.text
        assert "row budget" in body["partialReason"] and r.headers["x-railtrace-partial"]
        assert 0 < body["metrics"]["inspectedTraces"] < TRACES
        # A search that finds its `limit` within the budget is complete.
        full = _search(svc, '{ name = "forward_request" }', limit=2).json()
        assert len(full["traces"]) == 2 and "partial" not in full
    with _service(filled, search_max_requests=5) as svc:
        body = _search(svc, '{ name = "nothing" }').json()
        assert body["partial"] is True and "request budget" in body["partialReason"]
        assert body["metrics"]["inspectedTraces"] == 5
    with _service(filled, query_timeout_s=1e-6) as svc:
        r = _search(svc, '{ name = "nothing" }')
        assert r.status_code == 200 and "time budget" in r.json()["partialReason"], r.text


def _fields(body: bytes) -> dict[int, Any]:
    """Top-level fields of a protobuf message: varints as ints, the rest as bytes."""
    out: dict[int, Any] = {}
    i = 0

    def varint() -> int:
        nonlocal i
        n = shift = 0
        while True:
            b = body[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n

    while i < len(body):
        key = varint()
        if key & 7 == 0:
            out[key >> 3] = varint()
        else:
            size = varint()
            out[key >> 3] = body[i : i + size]
            i += size
    return out


def test_a_trace_read_over_its_span_budget_is_marked_partial(filled: str) -> None:
    tid = trace_id(1)
    with _service(filled, trace_max_spans=3) as svc:
        proto = {"accept": "application/protobuf"}
        v2 = httpx.get(f"{svc.http_url}/api/v2/traces/{tid}", headers=proto)
        fields = _fields(v2.content)
        assert v2.status_code == 200 and fields[3] == 1  # tempopb PartialStatus.PARTIAL
        assert b"3 spans shown" in fields[4] and v2.headers["x-railtrace-partial"]
        doc = httpx.get(f"{svc.http_url}/api/v2/traces/{tid}").json()
        assert doc["status"] == "PARTIAL" and "span" in doc["message"]
        spans = [s for rs in doc["trace"]["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
        assert len(spans) == 3
        v1 = httpx.get(f"{svc.http_url}/api/traces/{tid}")
        assert v1.status_code == 200 and "row budget" in v1.headers["x-railtrace-partial"]
        # /api/v1/traces: pages of at most trace_max_spans, the cursor leads to the rest.
        seen: list[str] = []
        cursor = None
        for _ in range(SPANS_PER_TRACE):
            page = httpx.get(
                f"{svc.http_url}/api/v1/traces/{tid}", params={"cursor": cursor} if cursor else {}
            ).json()
            assert len(page["spans"]) <= 3
            seen += [s["span_id"] for s in page["spans"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert len(seen) == len(set(seen)) == SPANS_PER_TRACE
    with _service(filled) as svc:  # within the default budget: complete, no marker
        v2 = httpx.get(f"{svc.http_url}/api/v2/traces/{tid}", headers={"accept": "application/protobuf"})
        assert 3 not in _fields(v2.content) and "x-railtrace-partial" not in v2.headers
        page = httpx.get(f"{svc.http_url}/api/v1/traces/{tid}").json()
        assert len(page["spans"]) == SPANS_PER_TRACE and page["limited"] is None


def test_a_read_that_cannot_start_in_time_is_a_503(filled: str) -> None:
    with _service(filled, query_timeout_s=1e-6) as svc:
        r = httpx.get(f"{svc.http_url}/api/v2/traces/{trace_id(1)}")
        assert r.status_code == 503 and "time budget" in r.json()["detail"], r.text
        assert r.headers["retry-after"]
        r = httpx.get(f"{svc.http_url}/api/v1/traces/{trace_id(1)}")
        assert r.status_code == 503 and "time budget" in r.json()["detail"], r.text


# -- The gate ---------------------------------------------------------------------------------


def test_the_gate_bounds_concurrency_and_gives_up_on_stop() -> None:
    gate = QueryGate(slots=1, timeout_s=0.3)
    release = threading.Event()

    async def scenario() -> None:
        first = asyncio.ensure_future(gate.run(lambda _b: release.wait(60), gate.budget(1)))
        await asyncio.sleep(0.1)
        assert gate.running == 1
        # No slot within the time budget: a clear 503, not a wait without end.
        with pytest.raises(QueryUnavailable, match="query_concurrency"):
            await gate.run(lambda _b: None, gate.budget(1))
        # The first outlives its deadline: given up on, its slot held until its thread ends.
        with pytest.raises(QueryUnavailable, match="time budget"):
            await first
        assert gate.running == 1
        release.set()
        await asyncio.sleep(0.2)
        assert gate.running == 0
        assert await gate.run(lambda b: b.max_rows, gate.budget(7)) == 7
        # Stopping: a running query is given up on at once, a new one refused.
        release.clear()
        long_budget = QueryGate(1, 60).budget(1)  # a deadline far off: only the stop ends the wait
        running = asyncio.ensure_future(gate.run(lambda _b: release.wait(60), long_budget))
        await asyncio.sleep(0.1)
        gate.close()
        with pytest.raises(QueryUnavailable, match="stopping"):
            await running
        with pytest.raises(QueryUnavailable, match="stopping"):
            await gate.run(lambda _b: None, gate.budget(1))
        release.set()

    asyncio.run(scenario())


def test_a_scan_ends_at_its_next_budget_check_when_the_service_stops() -> None:
    gate = QueryGate(slots=1, timeout_s=60)
    budget = gate.budget(10**9)
    gate.close()
    assert not budget.left() and budget.spent == "the service is stopping"


# -- A real process under heavy searches --------------------------------------------------------


def test_liveness_ingest_and_sigterm_while_heavy_searches_run(db_url: str, tmp_path: Path) -> None:
    """Four clients search without pause (the hostile pattern among them) against
    `railtrace serve`; /healthz and the official OTLP/HTTP exporter must be answered meanwhile,
    and SIGTERM must end the process within the grace period while searches are in flight."""
    server = Server(db_url, tmp_path, env={"RAILTRACE_QUERY_CONCURRENCY": "4"})
    searches: dict[str, int] = {}
    stop = threading.Event()
    try:
        server.wait_ready()
        exporter = OTLPSpanExporter(endpoint=server.url + "/v1/traces", timeout=10)
        spans = pd_batch(200)
        assert exporter.export(spans) == SpanExportResult.SUCCESS

        def all_assembled() -> bool:
            time.sleep(0.5)  # each look opens a connection of its own
            return len(assembled(db_url)) >= 200

        wait_for(all_assembled, timeout=120, what="200 requests assembled")

        in_flight: list[int] = []
        lock = threading.Lock()

        def searcher(q: str) -> None:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                while not stop.is_set():
                    with lock:
                        in_flight.append(1)
                    try:
                        answer = str(client.get("/api/search", params={"q": q, "limit": 500}).status_code)
                    except httpx.HTTPError as exc:
                        answer = type(exc).__name__
                    with lock:
                        in_flight.pop()
                        searches[answer] = searches.get(answer, 0) + 1

        queries = [HOSTILE, '{ name = "nothing" }', '{ .llm_d.pd_proxy.connector =~ "x.*" }', HOSTILE]
        threads = [threading.Thread(target=searcher, args=(q,), daemon=True) for q in queries]
        for t in threads:
            t.start()
        wait_for(lambda: searches.get("200", 0) >= 4, timeout=60, what="searches answered")
        for _ in range(5):
            r = httpx.get(server.url + "/healthz", timeout=5)  # liveness answered at all, within 5 s
            assert r.status_code == 200, r.text
            assert exporter.export(pd_batch(1)) == SpanExportResult.SUCCESS
            time.sleep(0.2)
        exporter.shutdown()
        assert set(searches) <= {"200", "503"}, searches  # 503: over the concurrency, retry
        # SIGTERM with searches in flight.
        wait_for(lambda: len(in_flight) >= 2, what="searches in flight")
        sent = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        try:
            code = server.proc.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"railtrace serve still running {GRACE_S} s after SIGTERM; searches: {searches}")
        assert code == 0, (code, time.monotonic() - sent)
    finally:
        stop.set()
        server.wait(30)
