"""Parsers for host-side text: `nvidia-smi topo -m` matrices and nccl-tests "Using devices" blocks.

Real captures vary (tabs or runs of spaces, ANSI escapes in the header, `mlx5_*` column names
instead of `NIC<k>`, NIC rows without affinity columns, `N/A` NUMA ids), so parsing is by
tokens, never by column offsets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_DEVICE_COL = re.compile(r"^(GPU\d+|NIC\d+|mlx5_\w+|ib\w+|rdmap\w+|bnxt_re\w*|irdma\w*|efa\w*|eth\w+)$")
_CODES = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|NV\d+|PXH|SOC)$")
_NCCL = re.compile(
    r"Rank\s+\d+\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([0-9a-fA-F:.]+)\]\s*(.*)$"
)


@dataclass
class TopoMatrix:
    """What one `nvidia-smi topo -m` says about one host."""

    gpus: dict[int, dict[str, object]] = field(default_factory=dict)  # index -> {numa, cpu_affinity}
    nics: list[str] = field(default_factory=list)  # NIC device names (legend-resolved)
    links: dict[tuple[int, str], str] = field(default_factory=dict)  # (gpu index, nic name) -> code


def looks_like_topo_matrix(text: str) -> bool:
    head = _ANSI.sub("", text[:4000])
    return bool(re.search(r"^\s*GPU0\b.*$", head, re.MULTILINE)) and bool(
        re.search(r"^\s*GPU0\s+(X|NV\d+|SYS|NODE|PHB|PXB|PIX)\b", head, re.MULTILINE)
    )


def parse_topo_matrix(text: str) -> TopoMatrix:
    """Parse the matrix; raises ValueError when there is no GPU header row."""
    lines = [_ANSI.sub("", ln).rstrip() for ln in text.splitlines()]
    legend = {}
    for ln in lines:
        m = _LEGEND.match(ln)
        if m:
            legend[m.group(1)] = m.group(2)
    header: list[str] | None = None
    out = TopoMatrix()
    for ln in lines:
        tokens = ln.split()
        if not tokens:
            continue
        if header is None:
            if tokens[0] == "GPU0":
                cols = []
                for t in tokens:
                    if not _DEVICE_COL.match(t):
                        break
                    cols.append(t)
                header = cols
            continue
        row = tokens[0]
        if not _DEVICE_COL.match(row):
            if row.startswith("Legend") or row.endswith(":"):
                break
            continue
        cells = tokens[1 : 1 + len(header)]
        if len(cells) < len(header) or not all(_CODES.match(c) for c in cells):
            continue
        rest = tokens[1 + len(header) :]
        if row.startswith("GPU"):
            idx = int(row[3:])
            numa: int | None = None
            if len(rest) >= 2 and rest[1].isdigit():
                numa = int(rest[1])
            out.gpus[idx] = {"numa": numa, "cpu_affinity": rest[0] if rest else None}
            for col, code in zip(header, cells, strict=False):
                if not col.startswith("GPU"):
                    out.links[(idx, legend.get(col, col))] = code
    if header is None:
        raise ValueError("no `GPU0 …` header row found")
    out.nics = [legend.get(c, c) for c in header if not c.startswith("GPU")]
    return out


def looks_like_nccl_devices(text: str) -> bool:
    return "Using devices" in text[:2000] and bool(_NCCL.search(text))


def parse_nccl_devices(text: str) -> list[dict[str, object]]:
    """`# Rank 0 Group 0 Pid 1 on HOST device 0 [0000:8f:00] NVIDIA B200` → host, index, bus id, product."""
    out = []
    for ln in text.splitlines():
        m = _NCCL.search(ln)
        if m:
            out.append(
                {
                    "host": m.group(1),
                    "index": int(m.group(2)),
                    "bus": m.group(3),
                    "product": m.group(4).strip(),
                }
            )
    return out
