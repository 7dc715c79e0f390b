"""The KV shim's UCX log reader: incremental, partial lines, env handling."""

from __future__ import annotations

from pathlib import Path

import pytest

from railtrace_tracing import semconv as sc
from railtrace_tracing.kv_transfer.ucx_capture import UcxLogCapture

LOG = Path(__file__).resolve().parents[1] / "fixtures" / "transport" / "probe" / "two_read_tls_tcp.log"


def test_incremental_reading_across_partial_writes(tmp_path: Path) -> None:
    text = LOG.read_text()
    cut = text.index("remote memory read by ucp_get*(multi)") + 10  # mid-line, inside the table
    path = tmp_path / "ucx.log"
    path.write_text(text[:cut])
    cap = UcxLogCapture(str(path))
    assert cap.evidence("probe-initiator", "read") is None  # table not complete yet
    with path.open("a") as fh:
        fh.write(text[cut:])
    ev = cap.evidence("probe-initiator", "read")
    assert ev is not None and ev.transport.value == "tcp" and ev.protocol == "software emulation"
    assert cap.evidence("probe-initiator", "read") is ev  # cached while nothing new is written


def test_configure_sets_ucx_env_and_respects_operator_choices(tmp_path: Path) -> None:
    env: dict[str, str] = {sc.ENV_UCX_LOG: str(tmp_path / "u.%p.log")}
    cap = UcxLogCapture()
    assert cap.configure(env)
    assert env["UCX_LOG_LEVEL"] == "info" and env["UCX_PROTO_INFO"] == "y"
    assert env["UCX_LOG_FILE"].endswith("u.%p.log") and "%p" not in cap.path
    mine = {"UCX_LOG_LEVEL": "debug", "UCX_LOG_FILE": str(tmp_path / "ops.log")}
    cap2 = UcxLogCapture()
    cap2.configure(mine)
    assert mine["UCX_LOG_LEVEL"] == "debug" and cap2.path == str(tmp_path / "ops.log")
    off = {sc.ENV_UCX_CAPTURE: "0"}
    assert not UcxLogCapture().configure(off) and "UCX_LOG_FILE" not in off


def test_operator_settings_below_info_are_kept_and_turn_evidence_off() -> None:
    for env in ({"UCX_LOG_LEVEL": "warn"}, {"UCX_PROTO_INFO": "n"}):
        before = dict(env)
        assert not UcxLogCapture().configure(env)
        assert env == before  # never overridden


def test_ucx_warnings_still_reach_stderr_when_the_shim_owns_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env: dict[str, str] = {sc.ENV_UCX_LOG: str(tmp_path / "u.log")}
    cap = UcxLogCapture()
    assert cap.configure(env) and cap.forward_warnings
    warn = "[1.0] [h:1:0]   ucp_context.c:1 UCX  WARN  transports 'cuda_ipc' are not available"
    info = "[1.1] [h:1:0]   ucp_worker.c:2 UCX  INFO    a intra-node cfg#1 rma_am(tcp/lo)"
    Path(cap.path).write_text(f"{warn}\n{info}\n")
    assert cap.poll()
    assert capsys.readouterr().err == warn + "\n"  # warnings copied, info lines not
    theirs = {"UCX_LOG_FILE": str(tmp_path / "ops.log")}
    ops = UcxLogCapture()
    assert ops.configure(theirs) and not ops.forward_warnings  # their file: UCX wrote where they said
