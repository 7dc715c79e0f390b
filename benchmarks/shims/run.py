"""Overhead of railtrace's shims, measured beside the real work they wrap, in one run.

    UCX_NET_DEVICES=lo .venv/bin/python -m benchmarks.shims.run [--rounds 5] [--transfers 200]
        [--spans 2000] [--processor batch|simple] [--tracing-dir DIR] [--out FILE]

Part 1 — KV shim vs the real NIXL transfer it wraps: two NIXL agents in two processes move
1 MiB over loopback (cma); the initiator rotates blocks of transfers between three modes —
`off` (wrappers removed), `on` (default: span emitted by the background emitter) and `inline`
(span emitted on the transfer's thread) — so all share the same agents, endpoints, machine
load and UCX settings. Reported per mode: median wall time per transfer (what the caller
waits), the calling thread's CPU, and process CPU per transfer over whole blocks (includes the
emitter thread).

The rounds repeat part 1 with the same agents; each round gives its own medians, and the
report gives the median, min and max over rounds (the spread on a shared machine).

Part 2 — CPU per span of each shim on the OpenTelemetry SDK (BatchSpanProcessor as deployed, an
exporter that drops; `--processor simple` for SimpleSpanProcessor), beside the peers measured in
the same process: a bare SDK span with no attributes, and with the KV contract's 12 attributes.
Also the cost of UCX evidence parsing (a whole probe log from tests/fixtures/transport, and the
cached per-transfer lookup). Part 3 adds them up for one P/D request as the shims would see it.

`--tracing-dir DIR` loads `railtrace_tracing` from another checkout's `tracing/` (to measure an
earlier version with the same harness, in the same conditions).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

from tests.shims.nixl_loopback import open_initiator

ROOT = Path(__file__).resolve().parents[2]
PROBE_LOG = ROOT / "tests" / "fixtures" / "transport" / "probe" / "two_read_default.log"


PROCESSOR = ["batch"]


class DropExporter(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


class TransportTally(SpanExporter):
    """Counts KV spans by transport, keeps nothing else."""

    def __init__(self) -> None:
        self.by_transport: dict[str, int] = {}

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        for span in spans:
            t = str(span.attributes.get("llm_d.kv_transfer.transport"))
            self.by_transport[t] = self.by_transport.get(t, 0) + 1
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def processor(exporter: SpanExporter, kind: str | None = None) -> Any:
    if (kind or PROCESSOR[0]) == "simple":
        return SimpleSpanProcessor(exporter)
    return BatchSpanProcessor(exporter, max_queue_size=1 << 16, max_export_batch_size=512)


def provider(kind: str | None = None) -> TracerProvider:
    p = TracerProvider()
    p.add_span_processor(processor(DropExporter(), kind))
    return p


def load_tracing_from(path: str) -> None:
    """Import `railtrace_tracing` from `path` (another checkout's tracing/) instead of this one."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "railtrace_tracing", os.path.join(path, "__init__.py"), submodule_search_locations=[path]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["railtrace_tracing"] = module
    spec.loader.exec_module(module)


def spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def pct(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def interleaved(bench: list[tuple[str, Callable[[], Any], int]], rounds: int) -> dict[str, list[float]]:
    """Process-CPU µs per call of each entry, one pass of each per round, so that every shim and
    its peers see the same machine load; one value per round."""
    out: dict[str, list[float]] = {name: [] for name, _, _ in bench}
    for _ in range(rounds):
        for name, fn, n in bench:
            c0 = time.process_time_ns()
            for _ in range(n):
                fn()
            out[name].append((time.process_time_ns() - c0) / n / 1000)
    return out


# -- part 1 ------------------------------------------------------------------------------
def nixl_part(transfers: int, block: int, rounds: int) -> dict[str, Any]:
    from railtrace_tracing.kv_transfer import NixlKVTransferInstrumentor, kv_transfer_scope

    tp = TracerProvider()
    tally = TransportTally()
    tp.add_span_processor(processor(tally))
    inst = NixlKVTransferInstrumentor()
    inst.instrument(tracer_provider=tp)  # before the agent: UCX logs where the shim reads

    size = 1 << 20
    buf = np.zeros(size, dtype=np.uint8)
    target, agent, peer, remote_addr = open_initiator("bench-initiator", buf, cwd=str(ROOT))
    local = agent.get_xfer_descs([(buf.ctypes.data, size, 0)], "DRAM")
    remote = agent.get_xfer_descs([(remote_addr, size, 0)], "DRAM")
    modes = ("off", "on", "inline")

    def one(i: int, host_cpu: list[int]) -> int:
        t0, h0 = time.perf_counter_ns(), time.thread_time_ns()
        with kv_transfer_scope(f"bench-{i}", remote_engine_id="e", remote_host="127.0.0.1"):
            h = agent.initialize_xfer("READ", local, remote, peer, b"")
            state = agent.transfer(h)
            while state not in ("DONE", "ERR"):
                state = agent.check_xfer_state(h)
            agent.release_xfer_handle(h)
        assert state == "DONE"
        host_cpu.append(time.thread_time_ns() - h0)
        return time.perf_counter_ns() - t0

    for i in range(10):  # warm-up: endpoint wire-up, UCX protocol selection, evidence cached
        one(i, [])
    inst.force_flush()
    per_round: list[dict[str, Any]] = []
    all_walls: dict[str, list[int]] = {m: [] for m in modes}
    seq = 0
    for _ in range(rounds):
        walls: dict[str, list[int]] = {m: [] for m in modes}
        host: dict[str, list[int]] = {m: [] for m in modes}
        cpu_blocks: dict[str, list[float]] = {m: [] for m in modes}
        done = 0
        while done < transfers:
            for mode in modes:  # rotate modes block by block: same agents, endpoints and load
                inst.uninstrument()
                if mode != "off":
                    inst.instrument(tracer_provider=tp, background_emit=(mode == "on"))
                c0 = time.process_time_ns()
                for _ in range(block):
                    walls[mode].append(one(seq, host[mode]))
                    seq += 1
                inst.force_flush()  # the emitter's CPU is counted in its block
                tp.force_flush()  # and the batch processor's export
                cpu_blocks[mode].append((time.process_time_ns() - c0) / block / 1000)
            done += block
        r: dict[str, Any] = {}
        for mode in modes:
            all_walls[mode] += walls[mode]
            r[mode] = {
                "wall_us_median": statistics.median(walls[mode]) / 1000,
                "thread_cpu_us_median": statistics.median(host[mode]) / 1000,
                "process_cpu_us_per_transfer": statistics.median(cpu_blocks[mode]),
            }
        r["added_wall_us"] = r["on"]["wall_us_median"] - r["off"]["wall_us_median"]
        r["added_wall_pct"] = 100 * r["added_wall_us"] / r["off"]["wall_us_median"]
        r["added_thread_cpu_us"] = r["on"]["thread_cpu_us_median"] - r["off"]["thread_cpu_us_median"]
        r["added_process_cpu_us"] = (
            r["on"]["process_cpu_us_per_transfer"] - r["off"]["process_cpu_us_per_transfer"]
        )
        per_round.append(r)
    inst.force_flush()
    inst.uninstrument()
    tp.shutdown()
    target.stdin.write("bye\n")
    target.stdin.flush()
    target.wait(timeout=30)
    out: dict[str, Any] = {"rounds": rounds, "transfers_per_mode_per_round": transfers}
    for mode in modes:
        out[mode] = {
            key: spread([r[mode][key] for r in per_round])
            for key in ("wall_us_median", "thread_cpu_us_median", "process_cpu_us_per_transfer")
        }
        out[mode]["wall_us_p10_all"] = pct(all_walls[mode], 0.1) / 1000
        out[mode]["wall_us_p90_all"] = pct(all_walls[mode], 0.9) / 1000
    for key in ("added_wall_us", "added_wall_pct", "added_thread_cpu_us", "added_process_cpu_us"):
        out[key] = spread([r[key] for r in per_round])
    out["per_round"] = per_round
    out["spans_by_transport"] = tally.by_transport
    return out


# -- part 2 ------------------------------------------------------------------------------
def span_costs(n: int, rounds: int) -> dict[str, dict[str, float]]:
    from railtrace_tracing.gateway import RailtraceASGIMiddleware
    from railtrace_tracing.kv_transfer import emit_kv_transfer, record_kv_transfer
    from railtrace_tracing.pd import EngineRecorder, PDProxyRecorder
    from railtrace_tracing.router_scoring import Candidate, SchedulingRecorder
    from railtrace_tracing.ucx import parse_text
    from railtrace_tracing.ucx.parser import Evidence

    tp = provider()
    text = PROBE_LOG.read_text()
    log = parse_text(text)
    ev: Evidence | None = log.select("probe-initiator", "read")
    bench: list[tuple[str, Callable[[], Any], int]] = []
    add = lambda name, fn, calls: bench.append((name, fn, calls))  # noqa: E731
    add("noop_baseline", lambda: None, n)
    bare = tp.get_tracer("bare-sdk")
    kv_attrs = {
        "llm_d.kv_transfer.request_id": "r",
        "llm_d.kv_transfer.operation": "read",
        "llm_d.kv_transfer.connector": "nixl",
        "llm_d.kv_transfer.backend": "UCX",
        "llm_d.kv_transfer.bytes": 1 << 20,
        "llm_d.kv_transfer.descriptors": 1,
        "llm_d.kv_transfer.remote.host": "h",
        "llm_d.kv_transfer.remote.engine_id": "e",
        "llm_d.kv_transfer.transport": "shm",
        "llm_d.kv_transfer.devices": ["cma/memory"],
        "llm_d.kv_transfer.evidence": ev.evidence if ev else "",
        "llm_d.kv_transfer.protocol": "zero-copy",
    }
    add(
        "peer: bare SDK span, same 12 attributes",
        lambda: bare.start_span("llm_d.kv_transfer", attributes=kv_attrs, start_time=1).end(end_time=2),
        n,
    )
    add("peer: bare SDK span, no attributes", lambda: bare.start_span("x").end(), n)
    other = "simple" if PROCESSOR[0] == "batch" else "batch"
    other_tp = provider(other)
    other_bare = other_tp.get_tracer("bare-sdk")
    add(
        f"peer: bare SDK span, no attributes ({other} processor)", lambda: other_bare.start_span("x").end(), n
    )

    def kv() -> None:
        with record_kv_transfer(
            tracer_provider=tp,
            request_id="r",
            operation="read",
            bytes=1 << 20,
            descriptors=1,
            remote_host="h",
            remote_engine_id="e",
            evidence=ev,
        ):
            pass

    add("kv_transfer span (record_kv_transfer, with evidence)", kv, n)
    add(
        "kv_transfer span (emit_kv_transfer, timestamps given)",
        lambda: emit_kv_transfer(
            tracer_provider=tp, operation="read", start_time_ns=1, end_time_ns=2, evidence=ev
        ),
        n,
    )
    add(
        f"evidence: parse whole probe log ({len(text.splitlines())} lines)",
        lambda: parse_text(text),
        max(20, n // 50),
    )
    add("evidence: select() on parsed log", lambda: log.select("probe-initiator", "read"), n)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    mw = RailtraceASGIMiddleware(app, tracer_provider=tp)
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "scheme": "http",
        "headers": [(b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")],
        "server": ("gw", 8080),
        "client": ("10.0.0.1", 5555),
        "http_version": "1.1",
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        return None

    loop = asyncio.new_event_loop()
    add("gateway: plain ASGI app", lambda: loop.run_until_complete(app(scope, receive, send)), n)
    add("gateway: app with middleware", lambda: loop.run_until_complete(mw(scope, receive, send)), n)

    rec = SchedulingRecorder(tp)
    cands = [
        Candidate(f"10.0.0.{i}:8000", 0.5 + i / 100, {"prefix": 0.5, "load": 0.4}, "z/b/s/h", f"d-{i}")
        for i in range(8)
    ]
    add(
        "router: one profile run (6 spans, 8 candidates)",
        lambda: rec.record(
            "decode",
            cands,
            "10.0.0.3:8000",
            scorers={"prefix": 2.0, "load": 1.0},
            start_time_ns=1,
            end_time_ns=10_000,
        ),
        n // 2,
    )

    pd = PDProxyRecorder(tp)

    def proxy() -> None:
        with pd.request(request_id="x") as r, r.prefill("10.0.0.7:8000") as p:
            p.headers()
            with r.decode("10.0.1.5:8000") as d:
                d.kv_transfer_params({"remote_host": "10.0.0.7"})

    add("pd proxy: request with prefill+decode (4 spans)", proxy, n // 2)
    eng = EngineRecorder(tp, role="decode")
    add(
        "engine: llm_request span",
        lambda: eng.llm_request(
            request_id="c",
            arrival_time_ns=1,
            scheduled_time_ns=2,
            first_token_time_ns=3,
            last_token_time_ns=4,
        ),
        n,
    )
    per_round = interleaved(bench, rounds)
    loop.close()
    other_tp.shutdown()
    tp.shutdown()  # exports what the batch processor holds; its thread's CPU was counted above
    per_round["gateway middleware (added per request)"] = [
        a - b
        for a, b in zip(
            per_round["gateway: app with middleware"], per_round["gateway: plain ASGI app"], strict=True
        )
    ]
    costs = {name: statistics.median(v) for name, v in per_round.items()}
    costs_min = {name: min(v) for name, v in per_round.items()}
    return {"median": costs, "min": costs_min}


SPANS_PER_CALL = {
    "kv_transfer span (record_kv_transfer, with evidence)": 1,
    "kv_transfer span (emit_kv_transfer, timestamps given)": 1,
    "gateway middleware (added per request)": 1,
    "router: one profile run (6 spans, 8 candidates)": 6,
    "pd proxy: request with prefill+decode (4 spans)": 4,
    "engine: llm_request span": 1,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5, help="repetitions of the transfer comparison")
    ap.add_argument("--transfers", type=int, default=200, help="transfers per mode per round")
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--spans", type=int, default=2000)
    ap.add_argument("--processor", choices=("batch", "simple"), default="batch")
    ap.add_argument("--tracing-dir", help="load railtrace_tracing from this tracing/ directory")
    ap.add_argument("--skip-nixl", action="store_true")
    ap.add_argument("--out", help="write the JSON here (NIXL prints log lines on stdout)")
    args = ap.parse_args(argv)
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    PROCESSOR[0] = args.processor
    if args.tracing_dir:
        load_tracing_from(os.path.abspath(args.tracing_dir))
    import opentelemetry.sdk.version as sdk_version

    result: dict[str, Any] = {
        "when_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "load_average_at_start": os.getloadavg(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "opentelemetry_sdk": sdk_version.__version__,
        "span_processor": args.processor,
        "tracing_dir": args.tracing_dir or "tracing",
    }
    if not args.skip_nixl:
        result["nixl_1MiB_read"] = nixl_part(args.transfers, args.block, args.rounds)
    measured = span_costs(args.spans, args.rounds)
    result["cpu_us_per_call"] = measured["median"]
    result["cpu_us_per_call_min_of_rounds"] = measured["min"]
    costs = measured["median"]
    peer = costs["peer: bare SDK span, no attributes"]
    result["spans_per_call"] = SPANS_PER_CALL
    result["cpu_us_above_bare_sdk_spans"] = {
        name: costs[name] - spans * peer for name, spans in SPANS_PER_CALL.items()
    }
    per_request = (
        costs["gateway middleware (added per request)"]
        + 2 * costs["router: one profile run (6 spans, 8 candidates)"]
        + costs["pd proxy: request with prefill+decode (4 spans)"]
        + 2 * costs["engine: llm_request span"]
    )
    result["cpu_us_per_request_all_python_shims"] = per_request
    result["bare_sdk_spans_per_request"] = 1 + 2 * 6 + 4 + 2
    result["cpu_us_per_request_bare_sdk_floor"] = 19 * peer
    if "nixl_1MiB_read" in result:
        result["cpu_us_per_request_incl_kv"] = per_request + max(
            0.0, result["nixl_1MiB_read"]["added_process_cpu_us"]["median"]
        )
    result["load_average_at_end"] = os.getloadavg()
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
