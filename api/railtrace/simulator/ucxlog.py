"""UCX 1.23 info-log text for one NIXL endpoint, in the format real engines write.

The simulator hands this text to the KV-transfer shim as evidence, so the real UCX parser
decides the transport and devices exactly as it would on a production log
(reference: topology-and-transport.md §7; shapes copied from NIXL 1.5.1 / UCX 1.23 runs).
"""

from __future__ import annotations

UCX_VERSION_LINE = (
    "Version 1.23.0 (loaded from /opt/vllm/lib/python3.12/site-packages/nixl_cu12/../nixl_cu12.libs/"
    "libucp-b39b3ed9.so.0.0.0, git branch <unknown>, revision 65e342a)"
)
UCX_TLS = "rc_mlx5,rc,cuda_copy,cuda_ipc,sm,shm,self"  # llm-d's GKE A4X/A4X Max setting


def _prefix(ts: float, host: str, pid: int) -> str:
    return f"[{ts:.6f}] [{host}:{pid}:0]"


def _table(title: str, operation: str, rows: list[tuple[str, str, str]]) -> list[str]:
    """A PROTO_INFO table with UCX's borders: title and operation rows span the whole width."""
    head = ("Range", "Description", "Config")
    w0 = max(len(head[0]), *(len(r[0]) for r in rows)) + 2
    w1 = max(len(head[1]), *(len(r[1]) for r in rows)) + 2
    w2 = max(len(head[2]), *(len(r[2]) for r in rows)) + 2
    inner = max(len(title), len(operation)) + 2
    if w0 + w1 + w2 + 2 < inner:
        w2 = inner - w0 - w1 - 2
    total = w0 + w1 + w2 + 2
    border = f"+{'-' * w0}+{'-' * w1}+{'-' * w2}+"
    lines = [
        border,
        f"| {title.ljust(total - 2)} |",
        f"| {operation.ljust(total - 2)} |",
        border,
        f"|{head[0].center(w0)}|{head[1].center(w1)}|{head[2].center(w2)}|",
        border,
    ]
    for rng_, desc, cfg in rows:
        lines.append(f"| {rng_.rjust(w0 - 2)} | {desc.ljust(w1 - 2)} | {cfg.ljust(w2 - 2)} |")
    lines.append(border)
    return lines


def config_cell(devices: list[str], split: list[float]) -> str:
    if len(devices) == 1:
        return devices[0]
    return " and ".join(f"{round(s * 100)}% on {d}" for d, s in zip(devices, split, strict=True))


def endpoint_log(
    *,
    agent: str,
    host: str,
    pid: int,
    ts: float,
    devices: list[str],
    split: list[float],
    transport: str,
    operation: str = "read",
    gpu_ordinal: int = 0,
    net_devices: str = "",
) -> str:
    """The lines one engine process prints when its NIXL agent connects to a peer.

    `devices` are `tl/dev` lanes as UCX names them (`rc_mlx5/mlx5_3:1`, `tcp/eth0`,
    `cuda_ipc/cuda`); `transport` is the simulator's ground truth, used only to pick the
    protocol wording UCX prints for it (READ over TCP is software emulation).
    """
    p = _prefix(ts, host, pid)
    env = f"UCX_TLS={UCX_TLS} UCX_PROTO_INFO=y UCX_LOG_LEVEL=info"
    if net_devices:
        env = f"UCX_NET_DEVICES={net_devices} " + env
    scope = "inter-node"
    lines = [
        f"{p}     ucp_context.c:2753 UCX  INFO  {UCX_VERSION_LINE}",
        f"{p}          parser.c:2587 UCX  INFO  UCX_* env variables: {env}",
    ]
    lanes = " ".join(devices)
    if transport == "tcp":
        ka = devices[0]
        lane_line = f"{agent} {scope} cfg#1 rma_am({lanes})  amo_am({lanes})  am({lanes})  ka({ka})"
        desc = "software emulation" if operation == "read" else "zero-copy"
        am_cfg = devices[0]
    elif transport == "nvlink":
        ka = "tcp/eth0"
        lane_line = f"{agent} {scope} cfg#1 rma_bw({lanes})  amo_am(tcp/eth0)  am(tcp/eth0)  ka({ka})"
        desc = "zero-copy"
        am_cfg = "tcp/eth0"
    else:
        first_dev = devices[0].split("/", 1)[1]
        ka = f"ud_mlx5/{first_dev}"
        lane_line = f"{agent} {scope} cfg#1 rma_bw({lanes})  amo({devices[0]})  am({devices[0]})  ka({ka})"
        desc = "zero-copy"
        am_cfg = devices[0]
    lines.append(f"{p}      ucp_worker.c:1997 UCX  INFO    {lane_line}")
    title = f"{agent} {scope} cfg#1"
    mem = f"cuda/GPU{gpu_ordinal}"
    if operation == "read":
        op_text = f"remote memory read by ucp_get*(multi) into {mem} memory from cuda"
    else:
        op_text = f"remote memory write by ucp_put*(multi) from {mem} memory to cuda"
    table_lines = _table(title, op_text, [("0..inf", desc, config_cell(devices, split))])
    table_lines += _table(
        title,
        "active message by ucp_am_send* from host memory",
        [
            ("0", "short", am_cfg),
            ("1..8192", "zero-copy", am_cfg),
            ("8193..inf", "multi-frag copy-in", am_cfg),
        ],
    )
    lines += [f"{p}   {t}" for t in table_lines]
    return "\n".join(lines) + "\n"
