"""`/metrics`, the API and the UI count the same verdicts after re-assembly (issue 48, point 5).

The simulator's fleet (every scenario, through the real shims and the real OTLP exporter) goes
into a running service on each store, with requests whose spans arrive late: a gateway trace
alone (judged a broken trace) whose other hops arrive afterwards and are stitched in, and a
request whose decode engine span comes after its first verdict (judged a broken trace until
it arrives). Once assembly is done, each
verdict counter less its `_retracted_total` must equal the API's stats for the same (whole)
window, and something must have been retracted, or the test would not exercise re-assembly.
The seconds lost by cause less their `_retracted_total` equal the stored summaries' `cost`.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from railtrace.metrics import lost_cause
from railtrace.server.runner import Service
from railtrace.simulator import scenarios as scen
from railtrace.simulator.emit import Emitter, Processes, otlp_http_exporter
from railtrace.simulator.engine import simulate
from railtrace.simulator.fleet import build_fleet
from railtrace.store.schema import traces as traces_table
from railtrace_tracing import semconv
from tests.service_helpers import export_request, get_request, post, settings_for, trace_id, wait_for

REQUESTS = 30
SEED = 11


def _series(text: str, name: str, label: str) -> Counter[str]:
    """`name`'s samples summed by one label (counters without the `_total` suffix as parsed)."""
    out: Counter[str] = Counter()
    base = name.removesuffix("_total")
    for family in text_string_to_metric_families(text):
        if family.name != base:
            continue
        for sample in family.samples:
            if sample.name == name:
                out[sample.labels[label]] += sample.value
    return out


def _net(text: str, name: str, label: str) -> dict[str, float]:
    counted = _series(text, name, label)
    counted.subtract(_series(text, semconv.RETRACTED[name], label))
    return {k: v for k, v in counted.items() if v}


def _settled(svc: Service, expected: int) -> bool:
    with svc.runtime.engine.connect() as conn:
        dirty = conn.execute(select(func.count()).where(traces_table.c.dirty)).scalar_one()
    total = httpx.get(f"{svc.http_url}/api/v1/stats", params={"group_by": "path_class"}).json()
    return dirty == 0 and sum(g["requests"] for g in total["groups"]) >= expected


def test_metrics_agree_with_the_api_after_reassembly(db_url: str, tmp_path: Path) -> None:
    fleet = build_fleet("a3-ultra", scen.resolve([]), SEED)
    fleet.write(tmp_path / "topology")
    sim = simulate(fleet, scen.resolve([]), REQUESTS, SEED)
    settings = settings_for(
        db_url,
        topology=[str(tmp_path / "topology")],
        trusted_collectors=["127.0.0.1/32"],
        assembly_processes=0,
    )
    with Service(settings) as svc:
        # Late spans first, so their first verdicts are stored before the rest arrives.
        post(svc, export_request([1], split=True, only={0, 1, 2}))  # the gateway trace alone
        post(svc, export_request([2], skip={(2, 7)}))  # without its decode engine span
        wait_for(
            lambda: get_request(svc, trace_id(1)) and get_request(svc, trace_id(2)), what="first verdicts"
        )
        firsts = [get_request(svc, trace_id(n)) for n in (1, 2)]
        post(svc, export_request([1], split=True, only={3, 4, 5, 6, 7}))
        post(svc, export_request([2], only={7}))

        span_end = max(r.end for r in sim) + 1.0
        procs = Processes(otlp_http_exporter(svc.http_url), SEED)
        emitter = Emitter(
            fleet, procs, "current", time.time_ns() - int(span_end * 1e9), resources="collector"
        )
        for r in sim:
            emitter.emit(r)
        procs.flush()
        procs.shutdown()

        wait_for(lambda: _settled(svc, REQUESTS + 2), timeout=120, what="every request assembled")
        finals = [get_request(svc, trace_id(n)) for n in (1, 2)]
        # The request whose decode span came late was first judged a broken trace.
        assert "broken_trace" in _verdict(firsts[1])[1] and "broken_trace" not in _verdict(finals[1])[1]

        text = httpx.get(svc.http_url + "/metrics").text
        by_flag = {
            g["flag"]: g["requests"]
            for g in httpx.get(f"{svc.http_url}/api/v1/stats", params={"group_by": "flag"}).json()["groups"]
        }
        by_class = {
            g["path_class"]: g["requests"]
            for g in httpx.get(f"{svc.http_url}/api/v1/stats", params={"group_by": "path_class"}).json()[
                "groups"
            ]
        }
        assert _net(text, semconv.M_FLAGS, "flag") == {k: v for k, v in by_flag.items() if v}
        assert _net(text, semconv.M_REQUESTS, "path_class") == {k: v for k, v in by_class.items() if v}
        retracted = _series(text, semconv.M_FLAGS_RETRACTED, "flag")
        assert retracted["broken_trace"] >= 1  # the stitched request's first verdict, withdrawn
        # The API's list agrees too (what the UI's list and overview show).
        listed = httpx.get(
            f"{svc.http_url}/api/v1/requests", params={"flag": "broken_trace", "limit": 500}
        ).json()
        assert len(listed["items"]) == by_flag.get("broken_trace", 0)
        # Seconds lost by cause: what the stored summaries lost, each under its primary cause.
        everything = httpx.get(f"{svc.http_url}/api/v1/requests", params={"limit": 500}).json()["items"]
        stored: Counter[str] = Counter()
        for item in everything:
            s = get_request(svc, item["trace_id"])
            assert s is not None
            lost = (s.get("cost") or {}).get("ttft_s_lost") or 0.0
            if lost > 0:
                stored[lost_cause(f["name"] for f in s["flags"])] += lost
        assert sum(stored.values()) > 0
        net = _net(text, semconv.M_SECONDS_LOST, "cause")
        assert net.keys() == stored.keys()
        assert all(abs(net[c] - stored[c]) < 1e-6 for c in stored), (net, stored)


def _verdict(s: dict[str, Any] | None) -> tuple[str | None, list[str]]:
    assert s is not None
    return (s.get("kv_transfer") or {}).get("path_class"), sorted(f["name"] for f in s["flags"])
