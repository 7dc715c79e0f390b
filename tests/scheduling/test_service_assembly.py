"""Assembly inside the running service, with the real normalisation, assembly and verdicts.

The quiet period is set to an hour and the test drives `run_once` with a clock past it, so
nothing depends on timing: what is asserted is which requests exist and what they say.
"""

from __future__ import annotations

import time

import httpx
import pytest
from sqlalchemy import func, select

from railtrace.server.runner import Service
from railtrace.store.schema import requests as requests_table
from railtrace.store.schema import span_chunks
from railtrace.store.schema import traces as traces_table
from tests.service_helpers import export_request, get_request, metric_sum, post, settings_for, trace_id

HOUR_NS = 3600 * 10**9
SUMMARY_KEYS = {
    "trace_id",
    "request_id",
    "model",
    "start",
    "ttft_s",
    "e2e_s",
    "breakdown_s",
    "prefill",
    "decode",
    "kv_transfer",
    "flags",
}


def later() -> int:
    return time.time_ns() + 2 * HOUR_NS


@pytest.fixture
def service(db_url: str):
    with Service(settings_for(db_url, quiet_period_s=3600)) as svc:
        assert svc.runtime.assembler is not None, svc.runtime.assembly_error
        yield svc


def test_quiet_period_then_summary_with_legs_and_timing(service: Service) -> None:
    post(service, export_request([1, 2]))
    assert service.runtime.assembler.run_once(now_ns=time.time_ns()) == 0  # still within quiet period
    assert get_request(service, trace_id(1)) is None
    service.runtime.assembler.run_once(now_ns=later())
    summary = get_request(service, trace_id(1))
    assert summary is not None and summary.keys() >= SUMMARY_KEYS
    assert summary["trace_id"] == trace_id(1)
    assert summary["model"] == "llama-3-70b"
    assert summary["prefill"]["pod"] == "prefill-0" and summary["prefill"]["node"] == "node-a"
    assert summary["decode"]["pod"] == "decode-0" and summary["decode"]["node"] == "node-b"
    assert summary["e2e_s"] == pytest.approx(3.146)
    assert summary["ttft_s"] is not None and summary["ttft_s"] > 0
    assert all(v >= 0 for v in summary["breakdown_s"].values())
    assert summary["kv_transfer"] is None  # no KV span was sent: nothing invented
    assert summary["span_count"] == 8
    # by request id too
    assert get_request(service, summary["request_id"])["trace_id"] == trace_id(1)
    trace = httpx.get(f"{service.http_url}/api/v1/traces/{trace_id(1)}").json()
    assert trace["summary"] == summary and len(trace["spans"]) == 8
    assert metric_sum(service, "llm_d_tracing_requests_total") == 2


def test_late_span_reopens_without_double_counting(service: Service) -> None:
    post(service, export_request([1], skip={(1, 7)}))  # decode engine span not yet sent
    service.runtime.assembler.run_once(now_ns=later())
    first = get_request(service, trace_id(1))
    assert first["span_count"] == 7
    post(service, export_request([1], only={7}))
    post(service, export_request([1], only={7}))  # and its exporter retry
    with service.runtime.engine.connect() as conn:
        t = traces_table.c
        dirty, late = conn.execute(select(t.dirty, t.late_spans).where(t.trace_id == trace_id(1))).one()
    assert dirty and late == 1
    service.runtime.assembler.run_once(now_ns=later())
    second = get_request(service, trace_id(1))
    assert second["span_count"] == 8
    assert metric_sum(service, "llm_d_tracing_requests_total") == 1
    assert metric_sum(service, "llm_d_tracing_late_spans_total") == 1
    assert metric_sum(service, "llm_d_tracing_duplicate_spans_total") == 1
    assert metric_sum(service, "llm_d_tracing_ttft_seconds_count") <= 1


def test_hops_in_separate_traces_are_stitched_not_flagged(service: Service) -> None:
    """Hops in two traces joined by the request id they carry: one request, with the join in its
    coverage. A release's propagation gap closed by ids is no broken trace."""
    post(service, export_request([1], split=True))
    service.runtime.assembler.run_once(now_ns=later())
    a = get_request(service, trace_id(1))
    b = get_request(service, trace_id(501))
    assert a is not None and a == b
    assert sorted(a["trace_ids"]) == sorted([trace_id(1), trace_id(501)])
    assert "broken_trace" not in {f["name"] for f in a["flags"]}
    assert a["coverage"]["traces"] == 2 and "joined by" in a["coverage"]["joined"]
    with service.runtime.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(requests_table)).scalar_one() == 1
    listed = httpx.get(f"{service.http_url}/api/v1/requests", params={"flag": "broken_trace"}).json()
    assert listed["items"] == []
    assert metric_sum(service, "llm_d_tracing_stitched_requests_total") == 1


def test_second_hop_arriving_later_replaces_the_lone_request(service: Service) -> None:
    post(service, export_request([1], split=True, only={0, 1, 2}))  # gateway trace alone
    service.runtime.assembler.run_once(now_ns=later())
    assert get_request(service, trace_id(1)) is not None
    post(service, export_request([1], split=True, only={3, 4, 5, 6, 7}))  # sidecar trace
    service.runtime.assembler.run_once(now_ns=later())
    with service.runtime.engine.connect() as conn:
        rows = conn.execute(select(requests_table.c.trace_id)).scalars().all()
    assert len(rows) == 1
    summary = get_request(service, trace_id(501))
    assert sorted(summary["trace_ids"]) == sorted([trace_id(1), trace_id(501)])
    assert metric_sum(service, "llm_d_tracing_requests_total") == 1


def test_restart_completes_traces_that_were_waiting(db_url: str) -> None:
    settings = settings_for(db_url, quiet_period_s=3600)
    with Service(settings) as svc:
        post(svc, export_request([1, 2, 3]))
    # Crash-equivalent for assembly: nothing was assembled before the stop.
    with Service(settings) as svc:
        assert get_request(svc, trace_id(2)) is None
        assert svc.runtime.store.count_dirty() == 3
        svc.runtime.assembler.run_once(now_ns=later())
        assert all(get_request(svc, trace_id(n)) for n in (1, 2, 3))
        assert svc.runtime.store.count_dirty() == 0


def test_retention_deletes_old_traces_in_batches(db_url: str) -> None:
    with Service(settings_for(db_url, quiet_period_s=3600, retention_hours=1.0)) as svc:
        post(svc, export_request(list(range(1, 8))))
        svc.runtime.assembler.run_once(now_ns=later())
        assert svc.runtime.assembler.apply_retention(now_ns=time.time_ns()) == 0
        assert svc.runtime.assembler.apply_retention(now_ns=later()) == 7
        with svc.runtime.engine.connect() as conn:
            for table in (span_chunks, traces_table, requests_table):
                assert conn.execute(select(func.count()).select_from(table)).scalar_one() == 0


def test_retention_in_slices_leaves_the_rest_for_later_rounds(db_url: str) -> None:
    """A large expired history is deleted over several rounds, so assembly is never held up
    for long: each pass stops once its time budget is used and says more is left."""
    with Service(settings_for(db_url, quiet_period_s=3600, retention_hours=1.0)) as svc:
        assembler = svc.runtime.assembler
        post(svc, export_request(list(range(1, 8))))
        assembler.retention_batch = 2
        passes = []
        while True:
            passes.append(assembler.apply_retention(now_ns=later(), budget_s=0.0))
            if not assembler._retention_behind:
                break
        assert passes == [2, 2, 2, 1, 0]
        assert svc.runtime.store.count_dirty() == 0


def test_housekeeping_runs_while_a_backlog_keeps_the_loop_busy(db_url: str) -> None:
    """The pending gauge and retention are refreshed between full pages, not only once the
    backlog is gone."""
    from railtrace.scheduling.assembler import Assembler

    with Service(settings_for(db_url, quiet_period_s=3600)) as svc:
        rt = svc.runtime
        rt.assembler.stop()
        pages = iter([500, 500, 500, 0])
        calls: list[str] = []

        class Probe(Assembler):
            def run_once(self, now_ns=None, limit=500):  # a backlog of three full pages
                calls.append("page")
                return next(pages, 0)

            def _housekeeping(self) -> None:
                calls.append("housekeeping")
                if len(calls) >= 8:
                    self._stop.set()

        probe = Probe(rt.store, rt.settings, rt.metrics, rt.assembler.pipeline)
        probe._run()
        assert calls[:6] == ["page", "housekeeping"] * 3
