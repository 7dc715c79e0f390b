"""A request whose assembly raises is left out, counted in
`llm_d_tracing_assembly_failures_total` and logged once per kind (not once per request), and
the requests beside it are still assembled."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from railtrace import assembly
from railtrace.metrics import Metrics
from railtrace.model import Span
from railtrace.otlp.reference import spans_from_request
from railtrace.scheduling.failures import AssemblyFailures
from railtrace.server.runner import Service
from railtrace_tracing import semconv
from tests.service_helpers import (
    export_request,
    get_request,
    metric_sum,
    post,
    settings_for,
    trace_id,
    wait_for,
)

POISONED = {trace_id(2), trace_id(4)}
FAILURES = "llm_d_tracing_assembly_failures_total"


class PoisonedRequest(Exception):
    """What the facts of a poisoned request raise."""


@pytest.fixture
def poisoned_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the facts of requests 2 and 4 raises; every other request is built as usual."""
    real = assembly.build

    def build(members: list[Span], notes: Any) -> Any:
        if any(s.trace_id in POISONED for s in members):
            raise PoisonedRequest("no facts for this one")
        return real(members, notes)

    monkeypatch.setattr(assembly, "build", build)


def failure_logs(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name == "railtrace.assembly" and "PoisonedRequest" in r.getMessage()
    ]


@pytest.mark.usefixtures("poisoned_build")
def test_a_failing_request_is_counted_logged_once_and_the_others_assembled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="railtrace.assembly")
    settings = settings_for(f"sqlite:///{tmp_path / 'railtrace.db'}", assembly_processes=0)
    with Service(settings) as svc:
        post(svc, export_request([1, 2, 3]))
        for n in (1, 3):
            wait_for(lambda n=n: get_request(svc, trace_id(n)), what=f"request {n}")
        wait_for(lambda: metric_sum(svc, FAILURES) == 1, what="the failure counted")
        post(svc, export_request([4, 5]))  # the same failure again: counted, not logged again
        wait_for(lambda: get_request(svc, trace_id(5)), what="request 5")
        wait_for(lambda: metric_sum(svc, FAILURES) == 2, what="the second failure counted")
        metrics = svc.runtime.metrics.render(None)[0].decode()
        assert get_request(svc, trace_id(2)) is None and get_request(svc, trace_id(4)) is None
        assert metric_sum(svc, "llm_d_tracing_requests_total") == 3
    assert f'{FAILURES}{{error="PoisonedRequest",stage="build"}} 2.0' in metrics
    logs = failure_logs(caplog)
    assert len(logs) == 1 and logs[0].levelno == logging.ERROR and logs[0].exc_info
    assert "build" in logs[0].getMessage()


@pytest.mark.usefixtures("poisoned_build")
def test_assemble_tells_each_failure_and_keeps_the_rest() -> None:
    told: list[tuple[str, BaseException]] = []
    spans = _spans([1, 2, 3])
    facts = assembly.assemble(spans, on_failure=lambda stage, exc: told.append((stage, exc)))
    assert {f.trace_id for f in facts} == {trace_id(1), trace_id(3)}
    assert [(stage, type(exc)) for stage, exc in told] == [(semconv.AssemblyStage.BUILD, PoisonedRequest)]
    assert assembly.assemble(_spans([2])) == []  # without a sink: still never raises


def test_failures_are_summed_up_at_most_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="railtrace.assembly")
    clock = [0.0]
    metrics = Metrics()
    failures = AssemblyFailures(metrics, interval_s=60, clock=lambda: clock[0])

    def fail(stage: str, exc: Exception) -> None:
        try:
            raise exc
        except Exception as raised:
            failures(stage, raised)

    for _ in range(500):
        fail(semconv.AssemblyStage.JUDGE, KeyError("x"))
        clock[0] += 0.1  # 500 failures over 50 s: one line, the first
    assert len(caplog.records) == 1
    clock[0] += 15
    fail(semconv.AssemblyStage.JUDGE, KeyError("x"))  # a minute on: one line sums them up
    assert len(caplog.records) == 2 and "500 more times" in caplog.records[1].getMessage()
    fail(semconv.AssemblyStage.BUILD, ValueError("y"))  # another kind: its own first line
    assert len(caplog.records) == 3
    text = metrics.render(None)[0].decode()
    assert f'{FAILURES}{{error="KeyError",stage="judge"}} 501.0' in text
    assert f'{FAILURES}{{error="ValueError",stage="build"}} 1.0' in text


def _spans(traces: list[int]) -> list[Span]:
    """The service's own spans for these P/D requests, as its OTLP reader makes them."""
    return spans_from_request(export_request(traces)).spans
