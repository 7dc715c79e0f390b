"""Every real UCX log in the transport fixtures parses to the transport it actually used."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from railtrace_tracing.semconv import Transport
from railtrace_tracing.ucx import parse_file
from railtrace_tracing.ucx.cli import ucx_evidence_command

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "transport"
PROBE = FIX / "probe"
PUB = FIX / "public-excerpts"


def _one(path: Path, context: str, op: str):
    ev = parse_file(str(path)).select(context, op)
    assert ev is not None, f"no evidence for {context} {op}"
    return ev


def test_single_write_default() -> None:
    ev = _one(PROBE / "single_write_default.log", "probe-initiator", "write")
    assert (ev.transport, ev.devices, ev.protocol) == (Transport.SHM, ["cma/memory"], "zero-copy")
    assert ev.source == "proto_info" and ev.scope == "intra-node" and ev.cfg == 1
    assert "ucp_put*(multi)" in ev.evidence  # NIXL's data-path variant, not the lane line's tcp/lo


def test_single_read_default() -> None:
    ev = _one(PROBE / "single_read_default.log", "probe-initiator", "read")
    assert (ev.transport, ev.devices) == (Transport.SHM, ["cma/memory"])
    assert "ucp_get*(multi)" in ev.evidence


def test_single_read_telemetry() -> None:
    log = parse_file(str(PROBE / "single_read_telemetry.log"))
    ev = log.select("probe-initiator", "read")
    assert ev is not None and ev.transport is Transport.SHM
    assert log.agents == ["probe-target", "probe-initiator"]


def test_single_write_timeout_still_shows_initiator_endpoint() -> None:
    log = parse_file(str(PROBE / "single_write_no_peer_progress__TIMEOUT.log"))
    ev = log.select("probe-initiator", "write")
    # The initiator's endpoint was configured (cma) even though wire-up never finished.
    assert ev is not None and ev.transport is Transport.SHM and ev.devices == ["cma/memory"]
    # The target never created a data table for a read: nothing is assumed for it.
    assert log.select("probe-target", "read") is None


def test_two_write_default() -> None:
    log = parse_file(str(PROBE / "two_write_default.log"))
    assert len(log.versions) == 2  # two processes kept apart
    ev = log.select("probe-initiator", "write")
    assert ev is not None and (ev.transport, ev.devices) == (Transport.SHM, ["cma/memory"])


def test_two_read_default() -> None:
    ev = _one(PROBE / "two_read_default.log", "probe-initiator", "read")
    assert (ev.transport, ev.devices, ev.protocol) == (Transport.SHM, ["cma/memory"], "zero-copy")


def test_two_write_tls_tcp() -> None:
    ev = _one(PROBE / "two_write_tls_tcp.log", "probe-initiator", "write")
    assert (ev.transport, ev.devices, ev.protocol) == (Transport.TCP, ["tcp/lo"], "zero-copy")


def test_two_read_tls_tcp_is_software_emulation() -> None:
    ev = _one(PROBE / "two_read_tls_tcp.log", "probe-initiator", "read")
    assert (ev.transport, ev.devices, ev.protocol) == (Transport.TCP, ["tcp/lo"], "software emulation")


def test_two_write_tcp_multirail_without_device_pin() -> None:
    ev = _one(PROBE / "two_write_tls_tcp__NO_NET_DEVICES_PIN__lo+eth0.log", "probe-initiator", "write")
    assert ev.transport is Transport.TCP
    assert ev.devices == ["tcp/lo", "tcp/eth0"] and ev.split == [0.52, 0.48]


def test_public_ep_cfg_lane_lines_ucx_1_13() -> None:
    log = parse_file(str(PUB / "ucx-log-level-info-ep_cfg-lines__openucx-ucx-faq.log"))
    assert set(log.versions.values()) == {"1.13"}
    peers = log.data_endpoints()
    assert {(e.process, e.cfg) for e in peers} == {("host1:42", 3), ("host2:43", 3)}
    # ep_cfg[2] holds the self transport: the loopback endpoint, skipped.
    assert all(e.is_self for e in log.endpoints if e.cfg == 2)
    ev = log.select(None, "tag")
    assert ev is not None and (ev.transport, ev.devices, ev.source) == (
        Transport.RDMA,
        ["rc_mlx5/mlx5_0:1"],
        "lane_line",
    )


def test_public_gcp_tcpx_tcp_only_lanes() -> None:
    log = parse_file(str(PUB / "ucx-over-gcp-tcpx-nic-only-tcp__openucx-ucx-issue-10854.log"))
    # Old NIXL names the context ucp_context_0: a single context is still matched to the agent.
    ev = log.select("some-nixl-agent", "read")
    assert ev is not None
    assert (ev.transport, ev.devices, ev.scope, ev.cfg) == (Transport.TCP, ["tcp/eth1"], "inter-node", 2)


def test_public_proto_info_tables_without_header_row() -> None:
    log = parse_file(str(PUB / "ucx-proto-info-tables__openucx-ucx-faq.log"))
    evs = {(e.process, e.cfg): e for e in log.evidence(operation="tag")}
    split = evs[("host1:42", 2)]
    assert split.devices == ["knem/memory", "rc_mlx5/mlx5_0:1"] and split.split == [0.55, 0.45]
    gpu = evs[("host2:43", 3)]
    assert gpu.transport is Transport.RDMA and gpu.memory == "cuda/GPU0"
    assert gpu.protocol.startswith("(?) rendezvous pipeline cuda_copy")


def test_public_proto_table_with_source_prefix() -> None:
    log = parse_file(str(PUB / "ucx-proto-table-rc_mlx5__openucx-ucx-pr-7950.log"))
    ev = log.select(None, "tag")
    assert ev is not None and (ev.transport, ev.devices) == (Transport.RDMA, ["rc_mlx5/mlx5_0:1"])
    assert ev.protocol == "(?) rendezvous zero-copy read from remote"


def test_public_cuda_transports_warning() -> None:
    log = parse_file(str(PUB / "ucx-warn-cuda-transports-unavailable__lmcache-issue-605.log"))
    assert log.data_endpoints() == [] and log.select("NixlRole.SENDER", "read") is None
    [warns] = log.warnings.values()
    assert "'cuda_ipc','cuda_copy' are not available" in warns[0]


def test_every_fixture_log_is_covered_by_a_test() -> None:
    names = {p.name for p in FIX.glob("*/*.log")}
    assert len(names) == 14


def test_cli_json_and_human(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(PROBE / "two_read_tls_tcp.log")
    assert ucx_evidence_command(argparse.Namespace(paths=[path], json=True)) == 0
    doc = json.loads(capsys.readouterr().out)
    eps = [e for e in doc["files"][0]["endpoints"] if not e["self"]]
    reads = [ev for e in eps for ev in e["evidence"] if ev["operation"] == "read"]
    assert reads[0]["transport"] == "tcp" and "software" in reads[0]["notes"][0]
    assert ucx_evidence_command(argparse.Namespace(paths=[path], json=False)) == 0
    human = capsys.readouterr().out
    assert "software emulation" in human and "self endpoint(s) skipped" in human
    assert ucx_evidence_command(argparse.Namespace(paths=["/nonexistent.log"], json=False)) == 2
