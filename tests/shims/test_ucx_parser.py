"""Shapes of UCX output the CPU-only machine cannot produce: RDMA multi-rail, 1.15 lane lines."""

from __future__ import annotations

from railtrace_tracing.semconv import Transport
from railtrace_tracing.ucx import classify, parse_config_cell, parse_text

P = "[1700000000.1] [gpu-node-3:777:0]"


def test_classify_every_transport_family() -> None:
    assert classify("rc_mlx5/mlx5_3:1") is Transport.RDMA
    assert classify("dc_mlx5/mlx5_0:1") is Transport.RDMA
    assert classify("ud_verbs/mlx5_0:1") is Transport.RDMA
    assert classify("srd/rdmap135s0:1") is Transport.RDMA
    assert classify("cuda_ipc/cuda") is Transport.NVLINK
    for shm in ("cma/memory", "knem/memory", "xpmem/memory", "sysv/memory", "posix/memory", "self/memory0"):
        assert classify(shm) is Transport.SHM
    assert classify("tcp/eth1") is Transport.TCP
    assert classify("cuda_copy/cuda") is None


def test_classify_is_the_verdicts_classification() -> None:
    """The shim's evidence and the service's verdicts read lanes through one table, so they
    agree on the forms they used to disagree on: the `shm` alias, case, staging lanes."""
    from railtrace.verdicts import lane_transport

    lanes = {
        "shm/memory": Transport.SHM,
        "RC_MLX5/mlx5_0:1": Transport.RDMA,
        "Tcp/eth0": Transport.TCP,
        "rocm_ipc/rocm": Transport.NVLINK,
        "udp/eth0": Transport.UNKNOWN,  # not UCX's `ud`
        "rcache/x": Transport.UNKNOWN,
        "gdr_copy/cuda": None,
    }
    for lane, expected in lanes.items():
        assert classify(lane) == expected, lane
        assert lane_transport(lane) == (expected.value if expected else ""), lane


def test_config_cells() -> None:
    assert parse_config_cell("72% on rc_mlx5/mlx5_2:1 and 28% on dc_mlx5/mlx5_3:1") == (
        ["rc_mlx5/mlx5_2:1", "dc_mlx5/mlx5_3:1"],
        [0.72, 0.28],
    )
    assert parse_config_cell("rc_mlx5/mlx5_0:1 50% on path0 and 50% on path1") == (
        ["rc_mlx5/mlx5_0:1"],
        [1.0],
    )
    assert parse_config_cell("rc_mlx5/mlx5_0:1/path0") == (["rc_mlx5/mlx5_0:1/path0"], [1.0])


def test_ucx_1_15_pointer_lane_line() -> None:
    log = parse_text(
        f"{P}     ucp_worker.c:2012 UCX INFO 0x55d2c1a0 inter-node cfg#4 "
        "tag(rc_mlx5/mlx5_1:1 tcp/eth0) rma(rc_mlx5/mlx5_1:1)\n"
    )
    ev = log.select(None, "write")
    assert ev is not None and (ev.transport, ev.devices, ev.scope, ev.cfg) == (
        Transport.RDMA,
        ["rc_mlx5/mlx5_1:1"],
        "inter-node",
        4,
    )


def test_table_row_wins_over_lane_line_and_multirail_rdma() -> None:
    text = "\n".join(
        [
            f"{P}  ucp_worker.c:1997 UCX  INFO  decode-0 inter-node cfg#2 rma_am(tcp/eth0) am(tcp/eth0)",
            f"{P}   +--------+-------------+---------------------------------------------------+",
            f"{P}   | decode-0 inter-node cfg#2                                                   |",
            f"{P}   | remote memory read by ucp_get*(multi) into cuda/GPU3 from cuda             |",
            f"{P}   +--------+-------------+---------------------------------------------------+",
            f"{P}   | Range  | Description | Config                                            |",
            f"{P}   +--------+-------------+---------------------------------------------------+",
            f"{P}   | 0..inf | zero-copy   | 72% on rc_mlx5/mlx5_2:1 and 28% on dc_mlx5/mlx5_3:1 |",
            f"{P}   +--------+-------------+---------------------------------------------------+",
        ]
    )
    ev = parse_text(text).select("decode-0", "read")
    assert ev is not None and ev.source == "proto_info"
    assert (ev.transport, ev.devices, ev.split, ev.memory) == (
        Transport.RDMA,
        ["rc_mlx5/mlx5_2:1", "dc_mlx5/mlx5_3:1"],
        [0.72, 0.28],
        "cuda/GPU3",
    )


def test_rma_am_tcp_with_cuda_ipc_only_in_am_is_tcp() -> None:
    log = parse_text(
        f"{P} ucp_worker.c:1 UCX INFO ucp_context_0 intra-node cfg#1 rma_am(tcp/eth0) "
        "am(tcp/eth0 cuda_ipc/cuda) ka(tcp/eth0)"
    )
    ev = log.select(None, "read")
    assert ev is not None and ev.transport is Transport.TCP


def test_unrelated_text_gives_no_evidence() -> None:
    log = parse_text("hello\n| not | a | table |\n[1.0] [h:1:0] random words\n")
    assert log.select("x", "read") is None and log.endpoints == []


def test_nixl_ib_warning_is_kept() -> None:
    log = parse_text(
        "NIXL WARN 8 IB device(s) were detected, but accelerated IB support was not found! "
        "Performance may be degraded.\n"
    )
    assert any("accelerated IB support" in w for w in log.warnings[""])
