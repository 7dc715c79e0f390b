"""`railtrace contract`: the audit as a table an operator reads, or JSON for CI and tools.

Exit code: 0 when nothing is broken, 1 when any obligation is broken (so a CI job can gate a
planned deployment on it), 2 when the inputs cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

import orjson

from railtrace.contract.audit import ContractConfig, audit
from railtrace.contract.report import BROKEN, OBLIGATIONS, ContractReport


def contract_command(args: argparse.Namespace) -> int:
    """Run the audit over `--topology` inputs and, with `--db`, the store's recent requests."""
    from railtrace.settings import Settings

    settings = Settings()
    paths = list(getattr(args, "topology", None) or []) or list(settings.topology)
    db = getattr(args, "db", None)
    if not paths and not db:
        print("railtrace contract: give --topology PATH (repeatable) and/or --db URL", file=sys.stderr)
        return 2
    try:
        from railtrace.topology import TopologyError, load_paths
        from railtrace.topology.model import Topology
    except ImportError as exc:  # pragma: no cover - a broken install
        print(f"railtrace contract: topology support unavailable ({exc})", file=sys.stderr)
        return 2
    try:
        # Traffic alone still judges verified and consumed; discovered/preserved stay unknown.
        topology = load_paths(paths) if paths else Topology()
    except TopologyError as exc:
        print(f"railtrace contract: {exc}", file=sys.stderr)
        return 2
    config = ContractConfig()
    summaries = None
    if db:
        try:
            from railtrace.contract.online import recent_summaries
            from railtrace.store import Store, make_engine

            engine = make_engine(Settings(db=db).db)
            try:
                summaries = list(recent_summaries(Store(engine), config.window_s))
            finally:
                engine.dispose()
        except Exception as exc:
            print(f"railtrace contract: cannot read requests from {db}: {exc}", file=sys.stderr)
            return 2
    report = audit(topology, summaries, config)
    try:
        if getattr(args, "json", False):
            sys.stdout.write(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
        else:
            print_table(report, sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:  # `railtrace contract | head`
        sys.stderr.close()
    return 1 if any(v["status"] == BROKEN for v in report.fleet.obligations.values()) else 0


# ---------------------------------------------------------------------------------------
# Table
# ---------------------------------------------------------------------------------------

_MARK = {"ok": "ok", "broken": "BROKEN", "unknown": "unknown"}


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")


def print_table(report: ContractReport, out: TextIO) -> None:
    """Fleet line, then pods/templates, nodes and pools, then the evidence of every non-ok result."""
    head = [o.upper() for o in OBLIGATIONS]
    fleet = report.fleet.obligations
    out.write(
        f"topology contract ({report.mode}, {report.fleet.members} pod(s)/template(s)): "
        + "  ".join(f"{o}={_MARK[fleet[o]['status']]}" for o in OBLIGATIONS)
        + "\n\n"
    )
    subjects = [s for s in report.subjects]
    if subjects:
        rows = [["KIND", "POD/TEMPLATE", "POOL", "NODE", *head]]
        for s in subjects:
            rows.append(
                [s.kind, s.key, s.pool, s.node or "-", *(_MARK[s.obligations[o].status] for o in OBLIGATIONS)]
            )
        _table(rows, out)
        out.write("\n")
    if report.nodes:
        rows = [["NODE", "PODS", *head]]
        for r in report.nodes:
            rows.append([r.name, str(r.members), *(_MARK[r.obligations[o]["status"]] for o in OBLIGATIONS)])
        _table(rows, out)
        out.write("\n")
    if report.pools:
        rows = [["POOL", "MEMBERS", *head]]
        for r in report.pools:
            rows.append([r.name, str(r.members), *(_MARK[r.obligations[o]["status"]] for o in OBLIGATIONS)])
        _table(rows, out)
        out.write("\n")
    lines: list[str] = []
    for s in subjects:
        for o in OBLIGATIONS:
            res = s.obligations[o]
            if res.status == "ok":
                continue
            if report.mode == "offline" and o in ("verified", "consumed"):
                continue  # said once below, not per pod
            lines.append(f"{s.kind} {s.key} {o} {_MARK[res.status]}: {res.summary}")
            for e in res.evidence[:3]:
                if e.message == res.summary and not e.missing and not e.link:
                    continue  # already said on the line above
                miss = f" [missing: {', '.join(e.missing)}]" if e.missing else ""
                link = f" -> {e.link}" if e.link else ""
                lines.append(f"    {e.object}: {e.message}{miss}{link}")
            if len(res.evidence) > 3:
                lines.append(f"    … {len(res.evidence) - 3} more (see --json)")
    for name, res in sorted(report.node_findings.items()):
        if res.status != "ok" and not any(s.node == name for s in subjects):
            lines.append(f"node {name} discovered {_MARK[res.status]}: {res.summary}")
            for e in res.evidence[:3]:
                miss = f" [missing: {', '.join(e.missing)}]" if e.missing else ""
                lines.append(f"    {e.object}: {e.message}{miss}")
    if lines:
        out.write("evidence:\n" + "\n".join(lines) + "\n")
    if report.mode == "offline":
        out.write("\nverified and consumed are unknown offline: they need traffic (--db).\n")
    for w in report.warnings:
        out.write(f"warning: {w}\n")
