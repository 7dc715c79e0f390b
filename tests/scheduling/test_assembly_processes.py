"""`assembly_processes`: requests assembled in child processes, counted in this process's
`/metrics`, with a child that dies started again and nothing left running after stop; the
default, `auto`, and how it reads the CPUs a service may use."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from railtrace.cli import build_parser
from railtrace.scheduling.workers import AUTO_PROCESSES, assembly_process_count, usable_cpus
from railtrace.server.runner import Service
from railtrace.settings import Settings
from tests.service_helpers import (
    export_request,
    get_request,
    metric_sum,
    post,
    settings_for,
    trace_id,
    wait_for,
)


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
    from railtrace.metrics import Metrics
    from railtrace.scheduling.workers import RecordedMetrics

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


def test_the_default_assembles_in_children_where_two_cpus_are_usable(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped default, `auto`, with nothing set: children on this machine's cores."""
    monkeypatch.delenv("RAILTRACE_ASSEMBLY_PROCESSES")
    settings = settings_for(db_url)
    assert settings.assembly_processes == "auto"
    expected = assembly_process_count("auto")
    with Service(settings) as svc:
        rt = svc.runtime
        if expected:
            assert rt.assembler is None and rt.assembly_workers is not None
            assert rt.assembly_workers.processes == expected == AUTO_PROCESSES
        else:  # a machine (or container quota) with fewer than two CPUs
            assert rt.assembler is not None and rt.assembly_workers is None
        post(svc, export_request([1]))
        assert wait_for(lambda: get_request(svc, trace_id(1)), what="request 1")["ttft_s"] is not None
        wait_for(lambda: metric_sum(svc, "llm_d_tracing_requests_total") == 1, what="request counted")


@pytest.mark.parametrize(
    ("cpus", "expected"), [(1.0, 0), (1.5, 0), (2.0, AUTO_PROCESSES), (64.0, AUTO_PROCESSES)]
)
def test_auto_needs_two_usable_cpus(cpus: float, expected: int) -> None:
    assert assembly_process_count("auto", cpus=cpus) == expected
    assert assembly_process_count(3, cpus=cpus) == 3  # a number is taken as it is
    assert assembly_process_count(0, cpus=cpus) == 0


def _cgroup(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)
    return tmp_path


def test_usable_cpus_is_capped_by_a_container_cpu_quota(tmp_path: Path) -> None:
    affinity = float(len(os.sched_getaffinity(0)))
    at_root = _cgroup(tmp_path, {"self": "0::/\n"}) / "self"  # a container's own cgroup namespace

    def cpus(name: str, files: dict[str, str]) -> float:
        return usable_cpus(_cgroup(tmp_path / name, files), at_root)

    assert usable_cpus(tmp_path / "absent", tmp_path / "absent-too") == affinity
    assert cpus("unlimited", {"cpu.max": "max 100000\n"}) == affinity
    assert cpus("half", {"cpu.max": "50000 100000\n"}) == min(affinity, 0.5)
    assert cpus("unreadable", {"cpu.max": "lots\n"}) == affinity
    v1 = {"cpu/cpu.cfs_quota_us": "150000\n", "cpu/cpu.cfs_period_us": "100000\n"}
    assert cpus("v1", v1) == min(affinity, 1.5)
    v1_unlimited = {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}
    assert cpus("v1-unlimited", v1_unlimited) == affinity


def test_usable_cpus_takes_the_tightest_quota_from_its_cgroup_to_the_root(tmp_path: Path) -> None:
    """On a host, a service's cgroup is a path below the root; a parent's limit binds it too."""
    affinity = float(len(os.sched_getaffinity(0)))
    root = _cgroup(
        tmp_path / "fs",
        {
            "cpu.max": "max 100000\n",
            "system.slice/cpu.max": "150000 100000\n",
            "system.slice/railtrace.service/cpu.max": "max 100000\n",
            "other.slice/cpu.max": "10000 100000\n",  # not on the way: ignored
        },
    )
    own = _cgroup(tmp_path, {"self": "0::/system.slice/railtrace.service\n"}) / "self"
    assert usable_cpus(root, own) == min(affinity, 1.5)
    mixed = _cgroup(tmp_path, {"mixed": "12:cpu,cpuacct:/x\n0::/system.slice/railtrace.service\n"})
    assert usable_cpus(root, mixed / "mixed") == min(affinity, 1.5)
    outside = _cgroup(tmp_path, {"outside": "0::/../../other.slice\n"})  # beyond the namespace
    assert usable_cpus(root, outside / "outside") == affinity


def test_the_setting_takes_auto_or_a_number(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw, parsed in (("auto", "auto"), ("0", 0), ("2", 2)):
        monkeypatch.setenv("RAILTRACE_ASSEMBLY_PROCESSES", raw)
        assert Settings(db="sqlite://").assembly_processes == parsed
    for bad in ("-1", "33", "many"):
        monkeypatch.setenv("RAILTRACE_ASSEMBLY_PROCESSES", bad)
        with pytest.raises(ValidationError, match="assembly_processes"):
            Settings(db="sqlite://")
    parser = build_parser()
    assert parser.parse_args(["serve", "--assembly-processes", "auto"]).assembly_processes == "auto"
    assert parser.parse_args(["serve", "--assembly-processes", "3"]).assembly_processes == 3


def test_a_bad_process_count_on_the_command_line_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", "--assembly-processes", "lots"])
    assert exit_info.value.code == 2
    assert "expected auto or a number from 0 to 32, got 'lots'" in capsys.readouterr().err
