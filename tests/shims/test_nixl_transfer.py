"""Real NIXL transfers between two processes over loopback, traced by the KV shim."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from railtrace_tracing import semconv as sc

try:
    import nixl_cu12._api  # noqa: F401

    HAVE_NIXL = True
except Exception:
    HAVE_NIXL = False

pytestmark = [pytest.mark.nixl, pytest.mark.skipif(not HAVE_NIXL, reason="nixl_cu12 not importable")]
ROOT = Path(__file__).resolve().parents[2]


def run_loopback(
    tmp_path: Path, op: str, extra_env: dict[str, str] | None = None, *args: str
) -> dict[str, Any]:
    """Run tests.shims.nixl_loopback in fresh processes (UCX reads its log settings once per process)."""
    out = tmp_path / f"{op}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "RAILTRACE_", "NIXL_"))}
    env.update({"UCX_NET_DEVICES": "lo", "RAILTRACE_UCX_LOG": str(tmp_path / "ucx.%p.log")})
    env.update(extra_env or {})
    subprocess.run(
        [sys.executable, "-m", "tests.shims.nixl_loopback", "--op", op, "--out", str(out), *args],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
    )
    return json.loads(out.read_text())


def kv_spans(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in result["spans"] if s["name"] == sc.SPAN_KV_TRANSFER]


def run_nixl_module(module: str, tmp_path: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    """Run a NIXL test module in its own process, over loopback, with none of this process's
    UCX, NIXL or railtrace settings, and its UCX log under `tmp_path`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "RAILTRACE_", "NIXL_"))}
    env.update({"UCX_NET_DEVICES": "lo", "RAILTRACE_UCX_LOG": str(tmp_path / "ucx.%p.log"), **extra_env})
    return subprocess.run(
        [sys.executable, "-m", module],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    )


# The shim's C hot path (the default where it is built) and its Python patches, on real NIXL.
HOT_PATHS = pytest.mark.parametrize(
    ("hot_path", "patch_type"), [("auto", "HotPatch"), ("python", "function")]
)


@HOT_PATHS
def test_default_transports_give_shm_cma(tmp_path: Path, hot_path: str, patch_type: str) -> None:
    result = run_loopback(tmp_path, "READ", {sc.ENV_KV_HOT_PATH: hot_path})
    assert result["patch_type"] == patch_type
    assert result["transfers"][0]["state"] == "DONE" and result["verified"] is True
    # NIXL 1.5.1's slotted handle class, subclassed by the shim: the record rides on the handle.
    assert result["transfers"][0]["handle_class"] == "nixl_xfer_handle"
    assert result["transfers"][0]["record_on_handle"] is True
    [span] = kv_spans(result)
    a = span["attributes"]
    assert a[sc.KV_TRANSPORT] == "shm" and a[sc.KV_DEVICES] == ["cma/memory"]
    assert a[sc.KV_OPERATION] == "read" and a[sc.KV_BYTES] == 1 << 20 and a[sc.KV_DESCRIPTORS] == 1
    assert a[sc.KV_REQUEST_ID] == "req-0" and a[sc.KV_CONNECTOR] == "nixl" and a[sc.KV_BACKEND] == "UCX"
    assert a[sc.KV_REMOTE_HOST] == "10.0.0.7" and a[sc.KV_REMOTE_ENGINE_ID] == "prefill-engine-7"
    assert "ucp_get*" in a[sc.KV_EVIDENCE]
    # Child of the request's own trace context, carried in kv_transfer_params.
    assert span["parent_span_id"] == result["transfers"][0]["request_span_id"]
    assert span["end"] > span["start"] and span["status"] != "ERROR"


def test_forced_tcp_gives_tcp(tmp_path: Path) -> None:
    result = run_loopback(tmp_path, "WRITE", {"UCX_TLS": "tcp"})
    [span] = kv_spans(result)
    a = span["attributes"]
    assert result["transfers"][0]["state"] == "DONE"
    assert a[sc.KV_TRANSPORT] == "tcp" and a[sc.KV_DEVICES] == ["tcp/lo"]
    assert a[sc.KV_OPERATION] == "write" and a[sc.KV_PROTOCOL] == "zero-copy"


def test_forced_tcp_read_is_software_emulation(tmp_path: Path) -> None:
    result = run_loopback(tmp_path, "READ", {"UCX_TLS": "tcp"})
    [span] = kv_spans(result)
    assert span["attributes"][sc.KV_TRANSPORT] == "tcp"
    assert span["attributes"][sc.KV_PROTOCOL] == "software emulation"


def test_no_ucx_evidence_means_unknown(tmp_path: Path) -> None:
    result = run_loopback(tmp_path, "WRITE", {"RAILTRACE_UCX_CAPTURE": "0"})
    [span] = kv_spans(result)
    assert span["attributes"][sc.KV_TRANSPORT] == "unknown"
    assert sc.KV_DEVICES not in span["attributes"]


@pytest.mark.parametrize("layout", ["flat", "nested"])
def test_vllm_connector_boundary_puts_kv_span_in_request_trace(tmp_path: Path, layout: str) -> None:
    proc = run_nixl_module("tests.shims.vllm_boundary", tmp_path, RT_VLLM_LAYOUT=layout)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RTRESULT "))
    result = json.loads(line.split(" ", 1)[1])
    assert result["verified"] is True
    [span] = result["spans"]
    a = span["attributes"]
    assert span["parent_span_id"] == result["request_span_id"]  # from the request's trace headers
    assert a[sc.KV_REQUEST_ID] == "cmpl-abc-0" and a[sc.KV_OPERATION] == "read"
    assert a[sc.KV_REMOTE_ENGINE_ID] == "prefill-engine-7" and a[sc.KV_REMOTE_HOST] == "10.0.0.7"
    assert a[sc.KV_BYTES] == 4 * 64 * 1024 and a[sc.KV_DESCRIPTORS] == 4  # from the prepped lists
    assert a[sc.KV_TRANSPORT] == "shm" and a[sc.KV_DEVICES] == ["cma/memory"]


def test_two_peers_of_different_transports_each_span_names_its_own(tmp_path: Path) -> None:
    """One agent pulls from a peer offering every transport (UCX picks `cma`) and from a peer
    limited to `UCX_TLS=tcp`: each span carries the endpoint to its own peer."""
    out = tmp_path / "peers.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "RAILTRACE_", "NIXL_"))}
    env.update({"UCX_NET_DEVICES": "lo", "RAILTRACE_UCX_LOG": str(tmp_path / "ucx.%p.log")})
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.shims.nixl_loopback",
            "--op",
            "READ",
            "--peers",
            "default,tcp",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
    )
    result = json.loads(out.read_text())
    assert [t["state"] for t in result["transfers"]] == ["DONE", "DONE"]
    by_peer = {s["attributes"][sc.KV_REMOTE_AGENT]: s["attributes"] for s in kv_spans(result)}
    assert set(by_peer) == {"peer-0-default", "peer-1-tcp"}
    shm, tcp = by_peer["peer-0-default"], by_peer["peer-1-tcp"]
    assert shm[sc.KV_TRANSPORT] == "shm" and shm[sc.KV_DEVICES] == ["cma/memory"]
    assert tcp[sc.KV_TRANSPORT] == "tcp" and tcp[sc.KV_DEVICES] == ["tcp/lo"]
    for peer, a in by_peer.items():
        assert a[sc.KV_EVIDENCE_SCOPE] == "peer" and f"peer {peer}" in a[sc.KV_EVIDENCE]
    assert shm[sc.KV_EVIDENCE].split(" cfg#")[1][0] != tcp[sc.KV_EVIDENCE].split(" cfg#")[1][0]


@HOT_PATHS
def test_a_post_that_raises_ends_its_span_with_the_error(
    tmp_path: Path, hot_path: str, patch_type: str
) -> None:
    """Real NIXL: posting a handle whose peer was removed raises from `transfer()`; the
    exception reaches the caller unchanged and the span ends with its class as the error."""
    proc = run_nixl_module("tests.shims.nixl_failure", tmp_path, **{sc.ENV_KV_HOT_PATH: hot_path})
    out = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RTFAIL "))[7:])
    assert out["patch_type"] == patch_type
    assert out["raised"] == "nixlNotFoundError"
    [span] = kv_spans(out)
    a = span["attributes"]
    assert span["status"] == "ERROR" and a[sc.ERROR_TYPE] == "nixlNotFoundError"
    assert a[sc.KV_REQUEST_ID] == "cmpl-fail-0" and a[sc.KV_REMOTE_ENGINE_ID] == "prefill-gone"
    assert a[sc.KV_OPERATION] == "read"
