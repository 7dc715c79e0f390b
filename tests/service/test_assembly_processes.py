"""`assembly_processes`: requests assembled in child processes, counted in this process's
`/metrics`, with a child that dies started again and nothing left running after stop."""

from __future__ import annotations

import os
import signal

import httpx
from service_helpers import export_request, settings_for, trace_id, wait_for
from test_service_assembly import get_request, metric_sum, post

from railtrace.server.runner import Service


def test_children_assemble_count_in_metrics_and_are_restarted(db_url: str) -> None:
    with Service(settings_for(db_url, assembly_processes=2)) as svc:
        rt = svc.runtime
        assert rt.assembler is None and rt.assembly_workers is not None
        post(svc, export_request([1, 2, 3]))
        post(svc, export_request([4], split=True))  # hops in two traces: one stitched request
        for n in (1, 2, 3, 4):
            summary = wait_for(lambda n=n: get_request(svc, trace_id(n)), what=f"request {n}")
            assert summary["ttft_s"] is not None
        assert wait_for(lambda: get_request(svc, trace_id(504)))["trace_id"] == trace_id(4)
        wait_for(lambda: metric_sum(svc, "llm_d_tracing_requests_total") == 4, what="requests counted")
        wait_for(lambda: metric_sum(svc, "llm_d_tracing_stitched_requests_total") == 1, what="stitched")
        assert metric_sum(svc, "llm_d_tracing_assembly_lag_seconds_count") == 4
        ready = httpx.get(svc.http_url + "/readyz").json()
        assert ready["assembly"] == "running in 2 of 2 processes"

        workers = rt.assembly_workers
        victim = workers._children[0]
        os.kill(victim.pid, signal.SIGKILL)
        wait_for(lambda: workers.restarts == 1 and workers.alive == 2, what="child restarted")
        post(svc, export_request([5]))
        wait_for(lambda: get_request(svc, trace_id(5)), what="request after restart")
        wait_for(lambda: metric_sum(svc, "llm_d_tracing_requests_total") == 5, what="fifth counted")
        children = list(workers._children)
    assert not any(p.is_alive() for p in children)


def test_recorded_updates_replay_to_the_same_exposition() -> None:
    """What a child records and the serve process replays equals counting in place."""
    from railtrace.ingest.workers import RecordedMetrics
    from railtrace.metrics import Metrics

    new = {
        "trace_id": "a" * 32,
        "model": "m",
        "ttft_s": 0.4,
        "breakdown_s": {"prefill": 0.1, "kv_transfer": 0.02},
        "prefill": {"node": "n1"},
        "decode": {"node": "n2", "nic": "mlx5_0"},
        "pairing_level": "block",
        "kv_transfer": {"transport": "tcp", "path_class": "tcp_fallback", "duration_s": 0.02, "bytes": 4096},
        "flags": [{"name": "tcp_fallback"}, {"name": "cross_block"}],
    }
    later = dict(new, flags=[*new["flags"], {"name": "slow_kv_transfer"}])
    direct, recorded, replayed = Metrics(), RecordedMetrics(), Metrics()
    for target in (direct, recorded):
        target.request_assembled(new, None)
        target.request_assembled(later, new)
        target["llm_d_tracing_pending_requests"].set(7)
        target["llm_d_tracing_assembly_lag_seconds"].observe(2.1, exemplar={"trace_id": "a" * 32})
    replayed.merge(recorded.take())
    assert recorded.take() == {}

    def samples(m: Metrics) -> list[str]:  # exposition without creation times
        body = m.render(None)[0].decode()
        return [line for line in body.splitlines() if "_created" not in line]

    assert samples(replayed) == samples(direct)
    assert any(line.startswith("llm_d_tracing_flags_total") for line in samples(direct))
    exemplars = replayed.render("application/openmetrics-text")[0].decode()
    flag_series = 'llm_d_tracing_flags_total{flag="tcp_fallback",path_class="tcp_fallback"}'
    assert f"{flag_series} 1.0 # {{trace_id=" in exemplars
