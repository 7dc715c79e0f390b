"""`railtrace ucx-evidence LOG… [--json]`: which transport and device each UCX endpoint used."""

from __future__ import annotations

import json
import sys
from typing import Any

from railtrace_tracing.ucx.parser import Evidence, UcxLog, UcxLogParser


def _notes(ev: Evidence) -> list[str]:
    """Operator-facing hints for the fallback signatures of the reference (§8)."""
    notes: list[str] = []
    if "software emulation" in ev.protocol:
        notes.append("RMA emulated in software (fallback signature)")
    if ev.transport.value == "tcp" and ev.operation in ("read", "write", "rma"):
        notes.append("data path on TCP")
    if len(ev.devices) > 1:
        notes.append("multi-rail split")
    if ev.source == "lane_line":
        notes.append("from the lane line only (no UCX_PROTO_INFO table)")
    return notes


def _load(path: str) -> UcxLog:
    parser = UcxLogParser()
    if path == "-":
        for line in sys.stdin:
            parser.feed(line)
    else:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parser.feed(line)
    return parser.finish()


def log_to_dict(path: str, log: UcxLog) -> dict[str, Any]:
    """The JSON shape of `--json` for one file."""
    endpoints = []
    for ep in log.endpoints:
        endpoints.append(
            {
                "process": ep.process,
                "context": ep.context,
                "scope": ep.scope,
                "cfg": ep.cfg,
                "style": ep.style,
                "self": ep.is_self,
                "lanes": ep.lanes,
                "evidence": []
                if ep.is_self
                else [{**e.to_dict(), "notes": _notes(e)} for e in ep.evidence()],
            }
        )
    return {
        "path": path,
        "versions": log.versions,
        "env": log.env,
        "agents": log.agents,
        "warnings": log.warnings,
        "endpoints": endpoints,
    }


def render_human(path: str, log: UcxLog) -> str:
    """Readable text: one block per peer endpoint, one line per operation."""
    out = [f"{path}"]
    versions = sorted(set(log.versions.values()))
    if versions:
        out[0] += f"  (UCX {', '.join(versions)})"
    peers = log.data_endpoints()
    skipped = len(log.endpoints) - len(peers)
    if not peers:
        out.append("  no peer endpoint configuration found (is UCX_LOG_LEVEL=info set?)")
    for ep in peers:
        label = (
            f"{ep.context} {ep.scope} cfg#{ep.cfg}"
            if ep.style == "cfg#"
            else f"{ep.context} ep_cfg[{ep.cfg}]"
        )
        out.append(f"  [{ep.process or '-'}] {' '.join(label.split())}")
        evs = ep.evidence()
        if not evs:
            out.append("    (no data-path lanes or tables)")
        for ev in evs:
            devs = " + ".join(
                f"{d} {round(s * 100)}%" if len(ev.devices) > 1 else d
                for d, s in zip(ev.devices, ev.split or [1.0] * len(ev.devices), strict=False)
            )
            proto = ev.protocol or "-"
            line = f"    {ev.operation:<6} {ev.transport.value:<8} {devs:<34} {proto:<22} [{ev.source}]"
            if ev.memory:
                line += f" memory={ev.memory}"
            out.append(line.rstrip())
            out.extend(f"      ! {n}" for n in _notes(ev))
    if skipped:
        out.append(f"  ({skipped} self endpoint(s) skipped)")
    for proc, warns in log.warnings.items():
        for w in warns:
            out.append(f"  warning [{proc or '-'}]: {w}")
    return "\n".join(out)


def ucx_evidence_command(args: Any) -> int:
    """Entry point of `railtrace ucx-evidence`; returns the process exit code."""
    try:
        return _run(args)
    except BrokenPipeError:  # `… | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _run(args: Any) -> int:
    docs: list[dict[str, Any]] = []
    status = 0
    for path in args.paths:
        try:
            log = _load(path)
        except OSError as exc:
            print(f"railtrace ucx-evidence: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
            status = 2
            continue
        if getattr(args, "json", False):
            docs.append(log_to_dict(path, log))
        else:
            print(render_human(path, log))
            print()
    if getattr(args, "json", False):
        print(json.dumps({"files": docs}, indent=2))
    return status
