"""`railtrace topology show PATH… [--json]`: the model built from those inputs, for humans or tools;
`railtrace topology collect`: a node's own hardware as railtrace topology YAML."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from railtrace.topology.loaders import TopologyError, load_paths
from railtrace.topology.model import Topology


def render_text(t: Topology) -> str:
    lines: list[str] = []
    for node in sorted(t.nodes.values(), key=lambda n: n.name):
        hier = " ".join(
            f"{k}={getattr(node, k)}"
            for k in ("zone", "block", "subblock", "host", "nvlink_domain")
            if getattr(node, k)
        )
        rdma = {True: "RDMA path", False: "no RDMA path", None: "RDMA path unknown"}[node.rdma_path]
        lines.append(f"node {node.name}  {node.machine_type or ''}  {hier}".rstrip())
        lines.append(f"  {rdma}: {node.rdma_reason}")
        for g in t.gpus_on(node.name):
            p = t.pairing(node.name, g.name)
            nics = ", ".join(
                (t.nic(node.name, n).label if t.nic(node.name, n) else n)
                for n in (p.nics if p else ())  # type: ignore[union-attr]
            )
            how = f"by {p.method}" if p and p.method else f"unpaired: {p.evidence if p else '?'}"
            lines.append(
                f"  {g.name:<10} {g.pci_bus_id or '':<13} root={g.pcie_root or '-':<11} "
                f"numa={g.numa if g.numa is not None else '-'}"
                f"  -> {nics or '-'} ({how})"
            )
        for n in t.nics_on(node.name):
            kind = "rdma" if n.rdma else "net" if n.rdma is False else "?"
            sriov = f" {n.function}" + (f" of {n.pf or n.pf_pci_address}" if n.function == "VF" else "")
            lines.append(
                f"  nic {n.label:<12} {kind:<4} dev={n.name} root={n.pcie_root or '-'} "
                f"numa={n.numa if n.numa is not None else '-'} rail={n.rail or '-'}"
                + (sriov if n.function else "")
            )
    if t.pods:
        lines.append("pods")
        for p in sorted(t.pods.values(), key=lambda p: p.name):
            lines.append(f"  {p.name} node={p.node or '-'} ips={','.join(p.ips) or '-'}")
    for a in t.allocations:
        lines.append(f"claim {a.claim} pods={','.join(a.pods)} node={a.node}: {a.alignment}")
        lines += [f"  {e}" for e in a.evidence]
    for tc in t.templates:
        lines.append(f"{tc.kind} {tc.name}: {tc.alignment}")
        lines += [f"  {e}" for e in tc.evidence]
    if t.networks:
        lines.append("networks " + ", ".join(f"{k}({v})" for k, v in sorted(t.networks.items())))
    for w in t.warnings:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def collect_command(args: Any, out: TextIO | None = None) -> int:
    """`railtrace topology collect`: this node's hardware as railtrace topology YAML.

    With `--interval` it runs until stopped (the DaemonSet's mode); a failed round is reported
    and retried at the next one, so a brief API outage costs nothing but freshness.
    """
    import os
    import time

    out = out or sys.stdout
    root = args.sysfs_root or "/"
    if not os.path.isdir(os.path.join(root, "sys")):
        print(f"railtrace topology collect: {root}: no sys/ folder to read", file=sys.stderr)
        return 2
    matrix = None
    if args.topo_matrix:
        try:
            with open(args.topo_matrix, encoding="utf-8") as f:
                matrix = f.read()
        except OSError as exc:
            print(f"railtrace topology collect: {args.topo_matrix}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    interval = float(getattr(args, "interval", 0) or 0)
    while True:
        rc = _collect_once(args, root, matrix, out)
        if interval <= 0:
            return rc
        time.sleep(interval)


def _collect_once(args: Any, root: str, matrix: str | None, out: TextIO) -> int:
    import os

    import yaml

    from railtrace.topology.collect import collect, publish

    doc = collect(
        root,
        node=args.node,
        topo_matrix=matrix,
        run_nvidia_smi=not args.no_nvidia_smi and os.path.realpath(root) == "/",
    )
    # libyaml's emitter where PyYAML has it: the same text, and the pure-Python one took most
    # of a big node's collection (12 s of 16 for 10,000 NICs).
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    text = yaml.dump(doc, Dumper=dumper, sort_keys=False, width=110)
    for warning in doc["collected"].get("warnings", []):
        print(f"railtrace topology collect: warning: {warning}", file=sys.stderr)
    try:
        # Publish first: the output file's age then tells a probe when a round last fully succeeded.
        if getattr(args, "configmap", None):
            where = publish(text, doc["nodes"][0]["name"], args.configmap, getattr(args, "kubeconfig", None))
            print(f"railtrace topology collect: stored in ConfigMap {where}", file=sys.stderr)
        if args.output:
            tmp = f"{args.output}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, args.output)  # a reader never sees half a file
        elif not getattr(args, "configmap", None):
            out.write(text)
    except Exception as exc:  # reported; the next round retries
        print(f"railtrace topology collect: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def topology_command(args: Any, out: TextIO | None = None) -> int:
    if getattr(args, "topology_command", None) == "collect":
        return collect_command(args, out)
    out = out or sys.stdout
    try:
        topology = load_paths(list(args.paths))
    except TopologyError as exc:
        print(f"railtrace topology: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "json", False):
        out.write(json.dumps(topology.to_dict(), indent=2, sort_keys=False, default=str) + "\n")
    else:
        out.write(render_text(topology) + "\n")
    return 0
