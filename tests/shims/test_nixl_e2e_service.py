"""End to end: real NIXL loopback transfers → KV shim → OTLP/HTTP → a running railtrace service."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from railtrace_tracing import semconv as sc

try:
    import nixl_cu12._api  # noqa: F401

    HAVE_NIXL = True
except Exception:
    HAVE_NIXL = False

pytestmark = [pytest.mark.nixl, pytest.mark.skipif(not HAVE_NIXL, reason="nixl_cu12 not importable")]
ROOT = Path(__file__).resolve().parents[2]

TOPOLOGY = """\
apiVersion: railtrace.io/v1alpha1
kind: Topology
nodes:
- name: node-p
  zone: z1
  block: b1
  subblock: s1
  machineType: a3-ultragpu-8g
  gpus: [{name: gpu-0, index: 0, pcieRoot: "pci0000:10", numa: 0}]
  nics: [{name: mlx5_0, pcieRoot: "pci0000:10", numa: 0, rail: rail-0}]
- name: node-d
  zone: z1
  block: b1
  subblock: s1
  machineType: a3-ultragpu-8g
  gpus: [{name: gpu-0, index: 0, pcieRoot: "pci0000:10", numa: 0}]
  nics: [{name: mlx5_0, pcieRoot: "pci0000:10", numa: 0, rail: rail-0}]
pods:
- {name: prefill-0, node: node-p, ip: 10.0.0.7, port: 8000, role: prefill, gpus: [gpu-0], nics: [mlx5_0],
   engineId: prefill-engine-7}
- {name: decode-0, node: node-d, ip: 10.0.1.5, port: 8000, role: decode, gpus: [gpu-0], nics: [mlx5_0]}
"""


def _service(tmp_path: Path, db: str | None = None) -> Any:
    from railtrace.server.runner import Service
    from railtrace.settings import Settings

    topo = tmp_path / "topology.yaml"
    topo.write_text(TOPOLOGY)
    settings = Settings(
        db=db or f"sqlite:///{tmp_path / 'rt.db'}",
        topology=[str(topo)],
        port=0,
        grpc_port=0,
        quiet_period_s=0.3,
    )
    return Service(settings)


def _loopback(tmp_path: Path, url: str, op: str, tls: str | None) -> dict[str, Any]:
    out = tmp_path / f"{op}-{tls}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "RAILTRACE_", "NIXL_", "OTEL_"))}
    env.update({"UCX_NET_DEVICES": "lo", "RAILTRACE_UCX_LOG": str(tmp_path / "ucx.%p.log")})
    if tls:
        env["UCX_TLS"] = tls
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.shims.nixl_loopback",
            "--op",
            op,
            "--out",
            str(out),
            "--otlp-url",
            url,
            "--node",
            "node-d",
            "--pod",
            "decode-0",
            "--request-prefix",
            f"{op}-{tls}-",
        ],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
    )
    return json.loads(out.read_text())


def _summary(client: httpx.Client, trace_id: str, want: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        r = client.get(f"/api/v1/requests/{trace_id}")
        if r.status_code == 200:
            last = r.json()
            if (last.get("kv_transfer") or {}).get("transport") == want:
                return last
        time.sleep(0.2)
    raise AssertionError(f"no summary with transport {want} for {trace_id}: {last}")


def test_tcp_run_is_flagged_and_cma_run_is_not(tmp_path: Path) -> None:
    with _service(tmp_path) as svc, httpx.Client(base_url=svc.http_url, timeout=10) as client:
        tcp = _loopback(tmp_path, svc.http_url, "WRITE", "tcp")
        shm = _loopback(tmp_path, svc.http_url, "READ", None)
        [tcp_span] = [s for s in tcp["spans"] if s["name"] == sc.SPAN_KV_TRANSFER]
        [shm_span] = [s for s in shm["spans"] if s["name"] == sc.SPAN_KV_TRANSFER]

        stored = client.get(f"/api/v1/traces/{tcp_span['trace_id']}").json()
        assert any(sp.get("name") == sc.SPAN_KV_TRANSFER for sp in stored["spans"])

        s_tcp = _summary(client, tcp_span["trace_id"], "tcp")
        assert s_tcp["kv_transfer"]["bytes"] == 1 << 20, s_tcp
        flags = {f["name"] for f in s_tcp["flags"]}
        assert "tcp_fallback" in flags, s_tcp

        s_shm = _summary(client, shm_span["trace_id"], "shm")
        assert "tcp_fallback" not in {f["name"] for f in s_shm["flags"]}


def _kinds(tmp_path: Path, url: str, *extra: str) -> dict[str, Any]:
    """Run tests/shims/nixl_kinds.py (real NIXL) exporting to `url`; its RTRESULT."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "RAILTRACE_", "NIXL_", "OTEL_"))}
    env.update({"UCX_NET_DEVICES": "lo", "RAILTRACE_UCX_LOG": str(tmp_path / "ucx.%p.log")})
    proc = subprocess.run(
        [sys.executable, "-m", "tests.shims.nixl_kinds", "--otlp-url", url, *extra],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    )
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RTRESULT "))
    return json.loads(line.split(" ", 1)[1])  # type: ignore[no-any-return]


def test_nixl_rocm_transfer_makes_its_kv_request(tmp_path: Path, db_url: str) -> None:
    """NIXL loaded as `nixl_rocm` (resolved as NIXL's meta package does): the KV connector's
    transfer reaches a running service as a KV request."""
    from tests.service_helpers import wait_for
    from tests.shims.test_nixl_agent_kinds import rocm_package

    with _service(tmp_path, db_url) as svc, httpx.Client(base_url=svc.http_url, timeout=10) as client:
        result = _kinds(tmp_path, svc.http_url, "--rocm", str(rocm_package(tmp_path / "rocm")))
        assert result["patched"] == ["nixl_rocm._api.nixl_agent"]
        [kv] = result["spans"]
        summary = wait_for(
            lambda: (r := client.get(f"/api/v1/requests/{kv['trace_id']}")).status_code == 200 and r.json(),
            what="the request of the nixl_rocm transfer",
        )
        assert summary["request_id"] == "kv-kinds-0" and summary["kv_transfer"]["bytes"] == 5 * 4096
        assert summary["kv_transfer"]["transport"] == "shm"


def test_eplb_offload_and_ec_transfers_in_a_kv_connector_process_make_no_request(
    tmp_path: Path, db_url: str
) -> None:
    """vLLM's EPLB, KV-offload and encoder-cache NIXL agents beside its KV connector's, real
    transfers, spans through the official OTLP exporter into a running service: one request (the
    KV connector's), no `broken_trace`; the EC span is stored with its trace, its own kind."""
    from tests.service_helpers import metric_sum, wait_for

    with _service(tmp_path, db_url) as svc, httpx.Client(base_url=svc.http_url, timeout=10) as client:
        result = _kinds(tmp_path, svc.http_url)
        assert {u: t["state"] for u, t in result["transfers"].items()} == dict.fromkeys(
            ("eplb", "offload", "kv", "ec"), "DONE"
        )
        [kv] = [s for s in result["spans"] if s["name"] == sc.SPAN_KV_TRANSFER]
        [ec] = [s for s in result["spans"] if s["name"] == sc.SPAN_EC_TRANSFER]

        summary = wait_for(
            lambda: (r := client.get(f"/api/v1/requests/{kv['trace_id']}")).status_code == 200 and r.json(),
            what="the KV connector's request",
        )
        assert summary["request_id"] == "kv-kinds-0"
        assert summary["kv_transfer"]["bytes"] == 5 * 4096  # N×5 prepped lists
        assert "broken_trace" not in {f["name"] for f in summary["flags"]}
        stored = wait_for(
            lambda: (r := client.get(f"/api/v1/traces/{ec['trace_id']}")).status_code == 200 and r.json(),
            what="the EC span stored",
        )
        assert [(s["name"], s["role"]) for s in stored["spans"]] == [
            (sc.SPAN_EC_TRANSFER, sc.ROLE.EC_TRANSFER)
        ]
        wait_for(lambda: metric_sum(svc, "llm_d_tracing_pending_requests") == 0, what="assembly done")
        listed = client.get("/api/v1/requests").json()
        assert [r["trace_id"] for r in listed["items"]] == [kv["trace_id"]]
        assert client.get(f"/api/v1/requests/{ec['trace_id']}").status_code == 404
        flags = client.get("/api/v1/stats", params={"group_by": "flag"}).json()
        assert "broken_trace" not in json.dumps(flags)
