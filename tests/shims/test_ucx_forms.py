"""Every UCX table form the reader meets in real logs: bordered or not, title and operation on one
row or two, with or without the `Range | Description | Config` header, any context name (a NIXL
agent, `ucp_context_0`, `ucx_perftest`, `mpi`), and active-message tables beside RMA ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from railtrace_tracing.ucx.parser import parse_text

# ruff: noqa: E501 - UCX log lines are kept whole

# Shapes follow the public UCX logs of tests/fixtures and docs (see the reference's §7.2); the
# border lines are dropped here as log shippers that filter "decoration" lines do.
BORDERLESS = """\
[1700000000.000001] [hostA:100:0]     ucp_worker.c:1997 UCX  INFO    ucx_perftest inter-node cfg#3 rma_bw(rc_mlx5/mlx5_0:1 rc_mlx5/mlx5_1:1) am(rc_mlx5/mlx5_0:1)
[1700000000.000002] [hostA:100:0]   | ucx_perftest inter-node cfg#3                                       |
[1700000000.000003] [hostA:100:0]   | active message by ucp_am_send* from host memory                     |
[1700000000.000004] [hostA:100:0]   | 0..8K     | eager short      | rc_mlx5/mlx5_0:1 |
[1700000000.000005] [hostA:100:0]   | 8K..inf   | multi-frag zero-copy | rc_mlx5/mlx5_0:1 |
[1700000000.000006] [hostA:100:0]   | ucx_perftest inter-node cfg#3                                       |
[1700000000.000007] [hostA:100:0]   | remote memory write by ucp_put*(multi) from host memory to host     |
[1700000000.000008] [hostA:100:0]   | Range  | Description | Config |
[1700000000.000009] [hostA:100:0]   | 0..inf | zero-copy   | 50% on rc_mlx5/mlx5_0:1 and 50% on rc_mlx5/mlx5_1:1 |
[1700000000.000010] [hostA:100:0]     ucp_worker.c:1997 UCX  INFO    ucp_context_0 intra-node cfg#4 rma_am(tcp/lo) am(tcp/lo)
[1700000000.000011] [hostA:100:0]     proto_debug.c:406  UCX  INFO  | ucp_context_0 intra-node cfg#4 | remote memory read by ucp_get*(multi) into host memory from host |
[1700000000.000012] [hostA:100:0]     proto_debug.c:406  UCX  INFO  | 0..inf | software emulation | tcp/lo |
[1700000000.000013] [hostA:100:0]     ucp_worker.c:1997 UCX  INFO    decode-0 intra-node cfg#5 rma_am(tcp/lo)
"""

BORDERED = """\
[1700000001.000001] [hostB:7:0]   +------------------------------+----------------------------------------------+
[1700000001.000002] [hostB:7:0]   | decode-0 inter-node cfg#1    | remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda |
[1700000001.000003] [hostB:7:0]   +------------------------------+---------------------+------------------------+
[1700000001.000004] [hostB:7:0]   |                       0..inf | zero-copy           | rc_mlx5/mlx5_3:1       |
[1700000001.000005] [hostB:7:0]   +------------------------------+---------------------+------------------------+
[1700000001.000006] [hostB:7:0]   +------------------------------+----------------------------------------------+
[1700000001.000007] [hostB:7:0]   | decode-0 inter-node cfg#1    | active message by ucp_am_send* from host memory |
[1700000001.000008] [hostB:7:0]   +------------------------------+---------------------+------------------------+
[1700000001.000009] [hostB:7:0]   |                       0..inf | eager zero-copy     | tcp/eth0               |
[1700000001.000010] [hostB:7:0]   +------------------------------+---------------------+------------------------+
"""


def _evidence(text: str) -> dict[tuple[str, int, str], tuple[str, list[str], str]]:
    log = parse_text(text)
    return {
        (e.context, e.cfg, e.operation): (e.transport.value, e.devices, e.protocol) for e in log.evidence()
    }


def test_borderless_tables_any_context_and_active_messages() -> None:
    ev = _evidence(BORDERLESS)
    assert ev[("ucx_perftest", 3, "am")] == ("rdma", ["rc_mlx5/mlx5_0:1"], "multi-frag zero-copy")
    assert ev[("ucx_perftest", 3, "write")][:2] == ("rdma", ["rc_mlx5/mlx5_0:1", "rc_mlx5/mlx5_1:1"])
    assert ev[("ucp_context_0", 4, "read")] == ("tcp", ["tcp/lo"], "software emulation")
    assert ("decode-0", 5, "rma") in ev  # a lane line alone, no table yet


def test_bordered_tables_keep_rma_and_am_apart() -> None:
    ev = _evidence(BORDERED)
    assert ev[("decode-0", 1, "read")] == ("rdma", ["rc_mlx5/mlx5_3:1"], "zero-copy")
    assert ev[("decode-0", 1, "am")] == ("tcp", ["tcp/eth0"], "eager zero-copy")
    # A transfer (read) takes the RMA row, never the active-message one.
    chosen = parse_text(BORDERED).select("decode-0", "read")
    assert chosen is not None and chosen.transport.value == "rdma"


def test_cli_json_lists_every_operation(tmp_path: Path) -> None:
    path = tmp_path / "ucx.log"
    path.write_text(BORDERLESS + BORDERED)
    out = subprocess.run(
        [sys.executable, "-m", "railtrace.cli", "ucx-evidence", "--json", str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    data = json.loads(out)
    files = data if isinstance(data, list) else data.get("files", [data])
    ops = {(ep["context"], e["operation"]) for f in files for ep in f["endpoints"] for e in ep["evidence"]}
    assert {
        ("ucx_perftest", "am"),
        ("ucx_perftest", "write"),
        ("decode-0", "am"),
        ("decode-0", "read"),
    } <= ops
