"""`railtrace demo`: a simulated P/D fleet with injected faults, end to end in one command.

It writes the fleet's Kubernetes objects to a temp folder, starts the real service on a fresh
SQLite database there, drives the simulated requests through the real shims and the official
OTLP exporter, waits until the service has assembled every request, and reports what the
service found next to what was injected.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from railtrace.server.ui import request_path
from railtrace.simulator import scenarios as scen
from railtrace.simulator.emit import (
    GENERATIONS,
    RECIPES,
    RELEASES,
    RESOURCE_MODES,
    Emitter,
    Processes,
    epp_request_id,
    otlp_grpc_exporter,
    otlp_http_exporter,
)
from railtrace.simulator.engine import SimRequest, simulate
from railtrace.simulator.fleet import SHAPES, Fleet, build_fleet
from railtrace_tracing.semconv import ENGINE_ROLES, FlagName, PathClass

WORST = 6


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def demo_command(args: argparse.Namespace) -> int:
    """Entry point of `railtrace demo` (parser in railtrace.cli)."""
    try:
        chosen = scen.resolve(args.scenario)
        if args.shape not in SHAPES:
            raise ValueError(f"unknown shape {args.shape!r}; choose one of {', '.join(SHAPES)}")
        recipe, resources = getattr(args, "recipe", "full"), getattr(args, "resources", "collector")
        generations = list(GENERATIONS) if args.generation == "all" else [args.generation]
        recipes = list(RECIPES) if recipe == "all" else [recipe]
        if any(g not in GENERATIONS for g in generations):
            raise ValueError(
                f"unknown generation {args.generation!r}; choose one of {', '.join(GENERATIONS)}, all"
            )
        if any(r not in RECIPES for r in recipes):
            raise ValueError(f"unknown recipe {recipe!r}; choose one of {', '.join(RECIPES)}, all")
        if resources not in RESOURCE_MODES:
            raise ValueError(f"unknown resources {resources!r}; choose one of {', '.join(RESOURCE_MODES)}")
        if args.requests < 1:
            raise ValueError("--requests must be at least 1")
    except ValueError as exc:
        print(f"railtrace demo: {exc}", file=sys.stderr)
        return 2
    for flag, port in (("--port", args.port), ("--grpc-port", args.grpc_port)):
        if port and not _port_free("127.0.0.1", port):
            print(
                f"railtrace demo: port {port} ({flag}) is already in use; pick another or leave it out "
                "and the demo picks a free one",
                file=sys.stderr,
            )
            return 2
    runs = [(g, r) for g in generations for r in recipes]
    reports: list[dict[str, Any]] = []
    for i, (generation, recipe) in enumerate(runs):
        workdir = Path(tempfile.mkdtemp(prefix="railtrace-demo-"))
        try:
            reports.append(
                run_demo(
                    requests=args.requests,
                    seed=args.seed,
                    scenario_names=[s.name for s in chosen],
                    shape=args.shape,
                    generation=generation,
                    recipe=recipe,
                    resources=resources,
                    workdir=workdir,
                    db=args.db if len(runs) == 1 else None,
                    port=args.port if len(runs) == 1 else 0,
                    grpc_port=args.grpc_port if len(runs) == 1 else 0,
                    keep_serving=not args.exit and i == len(runs) - 1,
                    as_json=args.json,
                    print_report=len(runs) == 1,
                    topology_source=getattr(args, "topology_source", "dra"),
                )
            )
        except OSError as exc:
            print(f"railtrace demo: {exc}", file=sys.stderr)
            return 2
        finally:
            shutil.rmtree(workdir, ignore_errors=True)  # the service is gone; so is its database
    if len(runs) > 1:
        print(json.dumps(reports, indent=2) if args.json else format_releases(reports), flush=True)
    return 0 if all(r.get("complete") for r in reports) else 1


def format_releases(reports: list[dict[str, Any]]) -> str:
    """One line per release and tracing recipe: requests with a full verdict, and why the rest
    have none."""
    out = ["", "release   recipe        assembled  full verdict  why not"]
    for rep in reports:
        cov = rep["coverage"]
        why = ", ".join(f"{k} {v}" for k, v in cov["not_full"].items()) or "—"
        out.append(
            f"{rep['release']:<10}{cov['recipe']:<14}{rep['assembled']:>4}/{rep['requests']:<5}"
            f"{cov['full_verdict']:>8}      {why}"
        )
    return "\n".join(out)


def run_demo(
    *,
    requests: int,
    seed: int,
    scenario_names: list[str],
    shape: str = "a3-ultra",
    generation: str = "current",
    recipe: str = "full",
    resources: str = "collector",
    workdir: Path,
    db: str | None = None,
    port: int = 0,
    grpc_port: int = 0,
    keep_serving: bool = False,
    as_json: bool = False,
    print_report: bool = True,
    quiet_period_s: float = 1.0,
    include_requests: bool = False,
    protocol: str = "http",
    topology_source: str = "dra",
) -> dict[str, Any]:
    """Run the whole demo and return the report (also printed unless `print_report` is False)."""
    from railtrace.server.runner import Service
    from railtrace.settings import Settings

    started = time.monotonic()
    chosen = scen.resolve(scenario_names)
    fleet = build_fleet(shape, chosen, seed)
    topo_dir = workdir / "topology"
    if topology_source == "collected":  # node collector output plus Pods; no DRA objects
        from railtrace.simulator.collected import write_collected

        write_collected(fleet, topo_dir)
    else:
        fleet.write(topo_dir)
    _say(
        f"railtrace demo: fleet {shape}: {len(fleet.nodes)} nodes, {len(fleet.pods)} pods; "
        f"objects in {topo_dir}"
    )
    sim = simulate(fleet, chosen, requests, seed)
    if recipe == "decode_only":
        # The EPP is not traced: its picks, which topology_blind_pairing judges, are not there.
        for r in sim:
            r.expected_flags.discard(FlagName.TOPOLOGY_BLIND_PAIRING)
    settings = Settings(
        # `emitted`: each simulated pod's address reaches the service as X-Forwarded-For from
        # loopback, standing in for the pod IPs a real sender connects from.
        trusted_proxies=["127.0.0.1/32"] if resources == "emitted" else [],
        # `collector`: the simulated pods' k8s.* stand for a collector's k8sattributes, and the
        # demo sends them from loopback as that collector would.
        trusted_collectors=["127.0.0.1/32"] if resources == "collector" else [],
        db=db or f"sqlite:///{workdir / 'railtrace.db'}",
        topology=[str(topo_dir)],
        host="127.0.0.1",
        port=port,
        grpc_port=grpc_port,
        quiet_period_s=quiet_period_s,
    )
    with Service(settings) as svc:
        _say(f"railtrace demo: service on {svc.http_url} (OTLP/gRPC {svc.grpc_endpoint})")
        span_end = max(r.end for r in sim) + 1.0
        base_ns = time.time_ns() - int(span_end * 1e9)
        exporter = (
            otlp_grpc_exporter(svc.grpc_endpoint) if protocol == "grpc" else otlp_http_exporter(svc.http_url)
        )
        procs = Processes(exporter, seed)
        emitter = Emitter(fleet, procs, generation, base_ns, resources=resources, recipe=recipe)
        step = max(1, len(sim) // 10)
        for i, r in enumerate(sim, 1):
            emitter.emit(r)
            if i % step == 0 or i == len(sim):
                _say(f"railtrace demo: sent {i}/{len(sim)} requests")
        procs.flush()
        procs.shutdown()
        # The id a request's summary carries: the sidecar's UUID when the sidecar is traced,
        # else vLLM's (the EPP's x-request-id).
        key = (lambda r: r.request_id) if recipe == "full" else epp_request_id
        found = _wait_assembled(
            svc.http_url, sim, timeout_s=90 + len(sim) * 0.1, settle_s=quiet_period_s + 0.5, key=key
        )
        summaries = {r.request_id: found[key(r)] for r in sim if key(r) in found}
        report = build_report(
            fleet, sim, summaries, svc.http_url, generation, seed, time.monotonic() - started
        )
        report["incidents"] = incident_report(
            svc.http_url, fleet, chosen, summaries, base_ns, include_requests
        )
        report["release"] = RELEASES[generation]
        report["coverage"] = coverage_report(summaries, recipe, resources)
        if include_requests:
            report["requests_detail"] = [_detail(r, summaries.get(r.request_id) or {}) for r in sim]
        if print_report:
            print(json.dumps(report, indent=2) if as_json else format_report(report), flush=True)
        if keep_serving:
            _serve_until_interrupted(svc.http_url, svc.grpc_endpoint, workdir)
    return report


def incident_report(
    http_url: str,
    fleet: Fleet,
    chosen: list[Any],
    summaries: dict[str, dict[str, Any]],
    since_ns: int,
    include_items: bool = False,
) -> dict[str, Any]:
    """The service's incidents over the run, scored against the injected faults, and the cost
    story in seconds and GPU-hours (docs/simulator.md, "Incidents against ground truth")."""
    from railtrace.simulator.truth import injected_faults, localisation

    items: list[dict[str, Any]] = []
    params: dict[str, Any] = {"since": since_ns / 1e9, "until": time.time() + 1, "limit": 500}
    with httpx.Client(base_url=http_url, timeout=60) as client:
        while True:
            page = client.get("/api/v1/incidents", params=params).raise_for_status().json()
            items += page["items"]
            if not page["next_cursor"]:
                break
            params["cursor"] = page["next_cursor"]
    by_cause: dict[str, dict[str, float]] = {}
    for inc in items:
        acc = by_cause.setdefault(inc["cause"], {"incidents": 0, "seconds_lost": 0.0, "gpu_hours_lost": 0.0})
        acc["incidents"] += 1
        acc["seconds_lost"] += inc["seconds_lost"]
        acc["gpu_hours_lost"] += inc["gpu_hours_lost"]
    costs = [s.get("cost") or {} for s in summaries.values()]
    tcp = [
        s.get("cost") or {}
        for s in summaries.values()
        if any(f["name"] == FlagName.TCP_FALLBACK for f in s.get("flags", []))
    ]
    return {
        **({"items": items} if include_items else {}),
        "count": len(items),
        "by_cause": {k: {n: round(v, 6) for n, v in acc.items()} for k, acc in sorted(by_cause.items())},
        "top": [
            {
                k: inc[k]
                for k in ("id", "cause", "scope", "requests", "seconds_lost", "gpu_hours_lost", "next_step")
            }
            for inc in items[:5]
        ],
        "localisation": localisation(items, fleet, injected_faults(fleet, chosen)),
        "kinds": dict(sorted(Counter(f"{i['cause']}/{i['scope']['kind']}" for i in items).items())),
        "story": {
            "tcp_fallback_requests": len(tcp),
            "tcp_fallback_ttft_s_lost": round(sum(c.get("ttft_s_lost") or 0 for c in tcp), 6),
            "tcp_fallback_gpu_hours_lost": round(sum(c.get("gpu_s_lost") or 0 for c in tcp) / 3600, 9),
            "aligning_saves_ttft_s": round(sum(c.get("ttft_s_lost") or 0 for c in costs), 6),
            "aligning_saves_gpu_hours": round(sum(c.get("gpu_s_lost") or 0 for c in costs) / 3600, 9),
        },
    }


def _detail(r: SimRequest, summary: dict[str, Any]) -> dict[str, Any]:
    """One request's injected faults (ground truth) next to what the service reported."""
    return {
        "request_id": r.request_id,
        "scenario": r.scenario,
        "injected": sorted(r.expected_flags),
        "flags": sorted({f["name"] for f in summary.get("flags", [])}),
        "trace_id": summary.get("trace_id"),
        "path_class": (summary.get("kv_transfer") or {}).get("path_class"),
        "decode_pod": (summary.get("decode") or {}).get("pod"),
        "cost": summary.get("cost"),
    }


def _serve_until_interrupted(http_url: str, grpc: str, workdir: Path) -> None:
    # One URL: the fleet page links to everything else (API, metrics and files are in the docs).
    # The data goes with the process: `--db URL` keeps it for `railtrace serve --db URL` later.
    _say(
        f"railtrace demo: the web UI stays up until Ctrl-C (`--exit` stops here); "
        f"files in {workdir}; open the fleet page:"
    )
    print(f"{http_url}/", flush=True)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


def coverage_report(summaries: dict[str, dict[str, Any]], recipe: str, resources: str) -> dict[str, Any]:
    """How many requests got a full verdict -- both legs on node, GPU and NIC and a KV transfer
    judged -- and, for the rest, why not (the first reason of each)."""
    full = 0
    why: Counter[str] = Counter()
    for s_ in summaries.values():
        cov = s_.get("coverage") or {}
        missing = set(cov.get("missing") or [])
        if s_.get("resolved") and s_.get("kv_transfer"):
            full += 1
            continue
        if not s_.get("resolved"):
            for leg in ENGINE_ROLES:
                if not ((s_.get(leg) or {}).get("nic")):
                    # No engine span for the leg (untraced, or lost), or a span that names no pod.
                    no_span = f"{leg}_engine" in missing
                    why[f"{leg} leg {'has no engine span' if no_span else 'not resolved'}"] += 1
                    break
        elif not s_.get("kv_transfer"):
            why["no KV-transfer span"] += 1
    return {
        "recipe": recipe,
        "resources": resources,
        "full_verdict": full,
        "not_full": dict(why.most_common()),
        "recipes_seen": dict(Counter((s.get("coverage") or {}).get("recipe") for s in summaries.values())),
    }


def _wait_assembled(
    http_url: str,
    sim: list[SimRequest],
    timeout_s: float,
    settle_s: float = 1.5,
    key: Any = None,
) -> dict[str, dict[str, Any]]:
    """Poll the API until every simulated request has a summary that no longer changes
    (a span exported late re-opens its request; one more quiet period shows it settled).
    `key`: the id each request's summary carries (default: the sidecar's)."""
    wanted = {(key or (lambda r: r.request_id))(r) for r in sim}
    found: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    last = -1
    settled: dict[str, Any] | None = None
    with httpx.Client(base_url=http_url, timeout=30) as client:
        while True:
            found = _fetch_all(client, wanted)
            # Present, not `complete`: a request whose hops were lost (the broken-trace scenario)
            # never completes; the settle check below waits out late spans instead.
            done = sum(1 for rid in wanted if rid in found)
            if done != last:
                _say(f"railtrace demo: assembled {done}/{len(wanted)} requests")
                last = done
            if time.monotonic() > deadline:
                break
            if done == len(wanted):
                digest = {rid: (s.get("span_count"), s.get("flags")) for rid, s in found.items()}
                if digest == settled:
                    break
                settled = digest
                time.sleep(settle_s)
                continue
            settled = None
            time.sleep(0.5)
    return found


def _fetch_all(client: httpx.Client, wanted: set[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 1000}
        if cursor:
            params["cursor"] = cursor
        resp = client.get("/api/v1/requests", params=params)
        resp.raise_for_status()
        body = resp.json()
        for item in body.get("items", []):
            rid = _request_id(item)
            if rid in wanted:
                prev = out.get(rid)
                # A request split over traces may show a partial summary first; keep the fullest.
                if prev is None or item.get("span_count", 0) > prev.get("span_count", 0):
                    out[rid] = item
        cursor = body.get("next_cursor")
        if not cursor:
            return out


def _request_id(item: dict[str, Any]) -> str | None:
    rid = item.get("request_id")
    if not rid:
        return None
    for prefix in ("chatcmpl-", "cmpl-"):
        if rid.startswith(prefix):
            rid = rid[len(prefix) :]
    if len(rid) > 36 and rid[36] == "-":
        rid = rid[:36]
    return rid


# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def build_report(
    fleet: Fleet,
    sim: list[SimRequest],
    summaries: dict[str, dict[str, Any]],
    http_url: str,
    generation: str,
    seed: int,
    elapsed_s: float,
) -> dict[str, Any]:
    flags_of = {rid: {f["name"] for f in s.get("flags", [])} for rid, s in summaries.items()}
    flag_counts = Counter(f for fl in flags_of.values() for f in fl)
    path_counts = Counter(
        ((s.get("kv_transfer") or {}).get("path_class") or PathClass.UNKNOWN) for s in summaries.values()
    )
    scenarios: list[dict[str, Any]] = []
    for name in sorted({r.scenario for r in sim}, key=list(scen.SCENARIOS).index):
        rs = [r for r in sim if r.scenario == name]
        ttfts = [
            summaries[r.request_id]["ttft_s"]
            for r in rs
            if r.request_id in summaries
            and summaries[r.request_id].get("ttft_s") is not None
            and not r.failed
        ]
        expected = Counter(f for r in rs for f in r.expected_flags)
        found = Counter(f for r in rs for f in r.expected_flags if f in flags_of.get(r.request_id, set()))
        scenarios.append(
            {
                "scenario": name,
                "description": scen.SCENARIOS[name].description,
                "requests": len(rs),
                "assembled": sum(1 for r in rs if r.request_id in summaries),
                "ttft_mean_s": _r(_mean(ttfts)),
                "ttft_p99_s": _r(_pct(ttfts, 0.99)),
                "timed_out": sum(1 for r in rs if r.failed),
                "injected": dict(sorted(expected.items())),
                "found": dict(sorted(found.items())),
                "flags": dict(
                    sorted(Counter(f for r in rs for f in flags_of.get(r.request_id, set())).items())
                ),
            }
        )
    # Verdicts against ground truth.
    healthy = [r for r in sim if not r.expected_flags and r.request_id in summaries]
    healthy_flagged = [r for r in healthy if flags_of.get(r.request_id)]
    missed = sum(
        1
        for r in sim
        if r.request_id in summaries
        for f in r.expected_flags
        if f not in flags_of[r.request_id]
    )
    injected = sum(len(r.expected_flags) for r in sim if r.request_id in summaries)
    # TCP fallback effect.
    # TCP against verified RDMA: aligned pods, whose RDMA channel is the one DRA promised.
    tcp = [r for r in sim if r.transport == "tcp"]
    verified = [r for r in sim if r.transport == "rdma" and r.decode.aligned]
    rdma = [r for r in verified if not r.failed]

    def kv_time(rs: list[SimRequest]) -> float | None:
        vals = [((summaries.get(r.request_id) or {}).get("kv_transfer") or {}).get("duration_s") for r in rs]
        return _mean([v for v in vals if v is not None])

    tcp_mean, rdma_mean = kv_time(tcp), kv_time(rdma)
    tcp_effect = {
        "tcp_requests": len(tcp),
        "tcp_timed_out": sum(1 for r in tcp if r.failed),
        "rdma_requests": len(verified),
        "rdma_timed_out": sum(1 for r in verified if r.failed),
        "kv_mean_s_tcp": _r(tcp_mean),
        "kv_mean_s_rdma": _r(rdma_mean),
        "kv_time_cut_by_rdma_pct": _r(100 * (1 - rdma_mean / tcp_mean), 1)
        if tcp_mean and rdma_mean
        else None,
        "flagged_tcp_fallback": sum(
            1 for r in tcp if FlagName.TCP_FALLBACK in flags_of.get(r.request_id, set())
        ),
    }
    # The worst request of each distinct set of flags, worst first (timeouts have no TTFT).
    by_flags: dict[frozenset[str], dict[str, Any]] = {}
    for s_ in sorted(
        (s for s in summaries.values() if s.get("flags")),
        key=lambda s: (-_or(s.get("ttft_s"), 1e9), s.get("trace_id", "")),
    ):
        by_flags.setdefault(frozenset(f["name"] for f in s_["flags"]), s_)
    worst = list(by_flags.values())[:WORST]
    worst_out = [
        {
            "trace_id": s["trace_id"],
            "request_id": s.get("request_id"),
            "ttft_s": _r(s.get("ttft_s")),
            "path_class": (s.get("kv_transfer") or {}).get("path_class"),
            "prefill": (s.get("prefill") or {}).get("pod"),
            "decode": (s.get("decode") or {}).get("pod"),
            "flags": [{"name": f["name"], "evidence": f.get("evidence")} for f in s.get("flags", [])],
            "url": f"{http_url}{request_path(s['trace_id'])}",  # the UI page of the request
        }
        for s in worst
    ]
    ladder = [next((s for s in scenarios if s["scenario"] == n), None) for n in scen.LADDER]
    ladder_vals = [s["ttft_mean_s"] for s in ladder if s is not None and s["ttft_mean_s"] is not None]
    return {
        "fleet": {
            "shape": fleet.shape.name,
            "machine_type": fleet.shape.machine_type,
            "nodes": len(fleet.nodes),
            "pods": len(fleet.pods),
            "blocks": len({n.block for n in fleet.nodes}),
            "subblocks": len({n.subblock for n in fleet.nodes}),
        },
        "generation": generation,
        "seed": seed,
        "requests": len(sim),
        "assembled": len(summaries),
        "complete": len(summaries) == len(sim),
        "flags": dict(sorted(flag_counts.items())),
        "path_classes": dict(sorted(path_counts.items())),
        "scenarios": scenarios,
        "ladder_holds": len(ladder_vals) == 3 and ladder_vals[0] > ladder_vals[1] > ladder_vals[2],
        "tcp_fallback": tcp_effect,
        "verdicts": {
            "injected": injected,
            "missed": missed,
            "healthy": len(healthy),
            "healthy_flagged": len(healthy_flagged),
        },
        "worst": worst_out,
        "api": f"{http_url}/api/v1/requests",
        "ui": f"{http_url}/",
        "elapsed_s": round(elapsed_s, 1),
    }


def format_report(rep: dict[str, Any]) -> str:
    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}s"

    f = rep["fleet"]
    out = [
        "",
        f"railtrace demo — {rep['requests']} requests, seed {rep['seed']}, "
        f"llm-d span names {rep['generation']}"
        + (f" (router {rep['release']})" if rep.get("release") else ""),
        f"fleet: {f['nodes']} × {f['machine_type']} in {f['blocks']} blocks / {f['subblocks']} subblocks, "
        f"{f['pods']} vLLM pods; assembled {rep['assembled']}/{rep['requests']}",
        "",
        "flags        " + ("  ".join(f"{k} {v}" for k, v in rep["flags"].items()) or "none"),
        "path class   " + "  ".join(f"{k} {v}" for k, v in rep["path_classes"].items()),
        "",
        f"{'scenario':<16}{'reqs':>5}{'mean TTFT':>11}{'p99 TTFT':>10}{'timeouts':>10}  injected → found",
    ]
    for sc_ in rep["scenarios"]:
        inj = ", ".join(f"{k} {sc_['found'].get(k, 0)}/{v}" for k, v in sc_["injected"].items()) or "—"
        out.append(
            f"{sc_['scenario']:<16}{sc_['requests']:>5}{s(sc_['ttft_mean_s']):>11}{s(sc_['ttft_p99_s']):>10}"
            f"{sc_['timed_out']:>10}  {inj}"
        )
    if any(x["scenario"] in scen.LADDER for x in rep["scenarios"]):
        out.append(
            "published ladder (mean TTFT): unconstrained 2.15s ≫ DRA-aligned 1.157s ≫ topology-aware 0.33s"
            + (" — reproduced in shape" if rep["ladder_holds"] else "")
        )
    t = rep["tcp_fallback"]
    if t["tcp_requests"]:
        out += [
            "",
            f"TCP fallback: {t['tcp_requests']} transfers over TCP, {t['tcp_timed_out']} timed out "
            f"(verified RDMA: {t['rdma_timed_out']} of {t['rdma_requests']}); "
            f"flagged tcp_fallback {t['flagged_tcp_fallback']}",
            f"  mean KV transfer TCP {s(t['kv_mean_s_tcp'])} vs RDMA {s(t['kv_mean_s_rdma'])}"
            + (f" (RDMA cuts it by {t['kv_time_cut_by_rdma_pct']}%)" if t["kv_time_cut_by_rdma_pct"] else ""),
            "  published: 436 of 5,400 requests timed out on TCP, none on RDMA; removing one fallback "
            "cut mean KV-transfer time by more than 93%",
        ]
    v = rep["verdicts"]
    out += [
        "",
        f"verdicts vs injected faults: {v['injected'] - v['missed']}/{v['injected']} found; "
        f"healthy requests flagged {v['healthy_flagged']}/{v['healthy']}",
        "",
        "worst flagged requests:",
    ]
    for w in rep["worst"]:
        out.append(
            f"  {w['trace_id']}  TTFT {s(w['ttft_s'])}  {w['path_class']}  {w['prefill']} → {w['decode']}"
        )
        for fl in w["flags"]:
            out.append(f"    {fl['name']}: {fl['evidence']}")
        out.append(f"    {w['url']}")
    inc = rep.get("incidents")
    if inc:
        loc, st = inc["localisation"], inc["story"]
        out += ["", f"incidents: {inc['count']} (open and ended, biggest cost first)"]
        for i in inc["top"]:
            out.append(
                f"  {i['cause']:<24}{i['scope']['kind']:<10}{i['requests']:>5} req  "
                f"{i['seconds_lost']:.2f} s lost  {i['gpu_hours_lost'] * 3600:.1f} GPU-s  "
                f"→ {i['next_step'][:90]}"
            )
        out.append(
            f"  scope vs injected faults: precision {loc['precision']} (part-scoped only "
            f"{loc['precision_scoped']}; {loc['single_request']} single-request)  recall {loc['recall']}"
        )
        for name, row in loc["per_scenario"].items():
            out.append(
                f"    {name:<16} faults {row['faults']}  incidents {row['incidents']}  "
                f"precision {row['precision']}  recall {row['recall']}"
            )
        tcp_gpu_s, all_gpu_s = st["tcp_fallback_gpu_hours_lost"] * 3600, st["aligning_saves_gpu_hours"] * 3600
        out.append(
            f"  TCP fallback: {st['tcp_fallback_requests']} requests lost "
            f"{st['tcp_fallback_ttft_s_lost']:.2f} s of TTFT and {tcp_gpu_s:.1f} GPU-seconds; aligning "
            f"every path would save {st['aligning_saves_ttft_s']:.2f} s and {all_gpu_s:.1f} GPU-s"
        )
    cov = rep.get("coverage")
    if cov:
        why = ", ".join(f"{k} {v}" for k, v in cov["not_full"].items()) or "none"
        out += [
            "",
            f"tracing {cov['recipe']} ({cov['resources']} resources): full verdict "
            f"{cov['full_verdict']}/{rep['assembled']}; without one: {why}",
        ]
    out += ["", f"UI {rep['ui']}   ({rep['elapsed_s']}s)"]
    return "\n".join(out)


def _or(value: float | None, default: float) -> float:
    return default if value is None else value
