"""Overhead of railtrace's shims, measured beside the real work they wrap, in one run.

    UCX_NET_DEVICES=lo .venv/bin/python -m benchmarks.shims.run [--transfers 200] [--spans 2000]

Part 1 — KV shim vs the real NIXL transfer it wraps: two NIXL agents in two processes move
1 MiB over loopback (cma); the initiator rotates blocks of transfers between three modes —
`off` (wrappers removed), `on` (default: span emitted by the background emitter) and `inline`
(span emitted on the transfer's thread) — so all share the same agents, endpoints, machine
load and UCX settings. Reported per mode: median wall time per transfer (what the caller
waits), the calling thread's CPU, and process CPU per transfer over whole blocks (includes the
emitter thread).

Part 2 — CPU per span of each shim on the OpenTelemetry SDK (SimpleSpanProcessor, an exporter
that drops), and the cost of UCX evidence parsing (a whole 300-line probe log, and the cached
per-transfer lookup). Part 3 adds them up for one P/D request as the shims would see it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

ROOT = Path(__file__).resolve().parents[2]
PROBE_LOG = (
    Path(os.environ.get("RAILTRACE_SHARED") or Path(__file__).resolve().parents[3] / "shared")
    / "fixtures/transport/probe/two_read_default.log"
)


class DropExporter(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def provider() -> TracerProvider:
    p = TracerProvider()
    p.add_span_processor(SimpleSpanProcessor(DropExporter()))
    return p


def cpu_per_call(fn: Callable[[], Any], n: int) -> float:
    """Median over 5 rounds of process-CPU µs per call."""
    rounds = []
    for _ in range(5):
        c0 = time.process_time_ns()
        for _ in range(n):
            fn()
        rounds.append((time.process_time_ns() - c0) / n / 1000)
    return statistics.median(rounds)


# -- part 1 ------------------------------------------------------------------------------
def nixl_part(transfers: int, block: int) -> dict[str, Any]:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from railtrace_tracing.kv_transfer import NixlKVTransferInstrumentor, kv_transfer_scope

    tp = TracerProvider()
    mem = InMemorySpanExporter()
    tp.add_span_processor(SimpleSpanProcessor(mem))
    inst = NixlKVTransferInstrumentor()
    inst.instrument(tracer_provider=tp)  # before the agent: UCX logs where the shim reads
    from nixl_cu12 import _api

    size = 1 << 20
    target = subprocess.Popen(
        [sys.executable, "-m", "tests.shims.nixl_loopback", "--role", "target", "--size", str(size)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert target.stdin is not None and target.stdout is not None
    line = target.stdout.readline()
    while line and not line.startswith("RTHELLO "):
        line = target.stdout.readline()
    hello = json.loads(line.split(" ", 1)[1])
    cfg = _api.nixl_agent_config(enable_prog_thread=False, enable_listen_thread=False, backends=["UCX"])
    agent = _api.nixl_agent("bench-initiator", cfg)
    buf = np.zeros(size, dtype=np.uint8)
    agent.register_memory([(buf.ctypes.data, size, 0, "")], "DRAM")
    peer = agent.add_remote_agent(bytes.fromhex(hello["meta"]))
    target.stdin.write(json.dumps({"meta": agent.get_agent_metadata().hex()}) + "\n")
    target.stdin.flush()
    local = agent.get_xfer_descs([(buf.ctypes.data, size, 0)], "DRAM")
    remote = agent.get_xfer_descs([(hello["addr"], size, 0)], "DRAM")

    host_cpu: dict[str, list[int]] = {"on": [], "off": [], "inline": []}
    current = ["off"]

    def one(i: int) -> int:
        t0, h0 = time.perf_counter_ns(), time.thread_time_ns()
        with kv_transfer_scope(f"bench-{i}", remote_engine_id="e", remote_host="127.0.0.1"):
            h = agent.initialize_xfer("READ", local, remote, peer, b"")
            state = agent.transfer(h)
            while state not in ("DONE", "ERR"):
                state = agent.check_xfer_state(h)
            agent.release_xfer_handle(h)
        assert state == "DONE"
        host_cpu[current[0]].append(time.thread_time_ns() - h0)
        return time.perf_counter_ns() - t0

    for i in range(10):  # warm-up: endpoint wire-up, UCX protocol selection, evidence cached
        one(i)
    inst.force_flush()
    walls: dict[str, list[int]] = {"on": [], "off": [], "inline": []}
    cpu_blocks: dict[str, list[float]] = {"on": [], "off": [], "inline": []}
    done = 0
    while done < transfers:
        for mode in ("off", "on", "inline"):
            inst.uninstrument()
            if mode != "off":
                inst.instrument(tracer_provider=tp, background_emit=(mode == "on"))
            current[0] = mode
            c0 = time.process_time_ns()
            for _ in range(block):
                walls[mode].append(one(done))
            inst.force_flush()  # the background emitter's CPU is counted in its block
            cpu_blocks[mode].append((time.process_time_ns() - c0) / block / 1000)
        done += block
    inst.force_flush()
    inst.uninstrument()
    target.stdin.write("bye\n")
    target.stdin.flush()
    target.wait(timeout=30)
    out: dict[str, Any] = {}
    for mode in ("on", "inline", "off"):
        out[mode] = {
            "n": len(walls[mode]),
            "wall_us_median": statistics.median(walls[mode]) / 1000,
            "wall_us_p90": sorted(walls[mode])[int(0.9 * len(walls[mode]))] / 1000,
            "cpu_us_per_transfer_median_of_blocks": statistics.median(cpu_blocks[mode]),
            "host_thread_cpu_us_median": statistics.median(host_cpu[mode][-len(walls[mode]) :]) / 1000,
        }
    off, on = out["off"], out["on"]
    out["added_wall_us"] = on["wall_us_median"] - off["wall_us_median"]
    out["added_wall_pct"] = 100 * out["added_wall_us"] / off["wall_us_median"]
    out["added_cpu_us"] = (
        on["cpu_us_per_transfer_median_of_blocks"] - off["cpu_us_per_transfer_median_of_blocks"]
    )
    transports: dict[str, int] = {}
    for span in mem.get_finished_spans():
        t = str(span.attributes.get("llm_d.kv_transfer.transport"))
        transports[t] = transports.get(t, 0) + 1
    out["spans_by_transport"] = transports
    return out


# -- part 2 ------------------------------------------------------------------------------
def span_costs(n: int) -> dict[str, float]:
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
    costs: dict[str, float] = {}
    costs["noop_baseline"] = cpu_per_call(lambda: None, n)
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
    costs["peer: bare SDK span, same 12 attributes"] = cpu_per_call(
        lambda: bare.start_span("llm_d.kv_transfer", attributes=kv_attrs, start_time=1).end(end_time=2), n
    )
    costs["peer: bare SDK span, no attributes"] = cpu_per_call(lambda: bare.start_span("x").end(), n)

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

    costs["kv_transfer span (record_kv_transfer, with evidence)"] = cpu_per_call(kv, n)
    costs["kv_transfer span (emit_kv_transfer, timestamps given)"] = cpu_per_call(
        lambda: emit_kv_transfer(
            tracer_provider=tp, operation="read", start_time_ns=1, end_time_ns=2, evidence=ev
        ),
        n,
    )
    costs["evidence: parse whole probe log (308 lines)"] = cpu_per_call(
        lambda: parse_text(text), max(20, n // 50)
    )
    costs["evidence: select() on parsed log"] = cpu_per_call(lambda: log.select("probe-initiator", "read"), n)

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
    plain = cpu_per_call(lambda: loop.run_until_complete(app(scope, receive, send)), n)
    with_mw = cpu_per_call(lambda: loop.run_until_complete(mw(scope, receive, send)), n)
    loop.close()
    costs["gateway middleware (added per request)"] = with_mw - plain

    rec = SchedulingRecorder(tp)
    cands = [
        Candidate(f"10.0.0.{i}:8000", 0.5 + i / 100, {"prefix": 0.5, "load": 0.4}, "z/b/s/h", f"d-{i}")
        for i in range(8)
    ]
    costs["router: one profile run (6 spans, 8 candidates)"] = cpu_per_call(
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

    costs["pd proxy: request with prefill+decode (4 spans)"] = cpu_per_call(proxy, n // 2)
    eng = EngineRecorder(tp, role="decode")
    costs["engine: llm_request span"] = cpu_per_call(
        lambda: eng.llm_request(
            request_id="c",
            arrival_time_ns=1,
            scheduled_time_ns=2,
            first_token_time_ns=3,
            last_token_time_ns=4,
        ),
        n,
    )
    return costs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--transfers", type=int, default=200)
    ap.add_argument("--block", type=int, default=20)
    ap.add_argument("--spans", type=int, default=2000)
    ap.add_argument("--skip-nixl", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    result: dict[str, Any] = {}
    if not args.skip_nixl:
        result["nixl_1MiB_read"] = nixl_part(args.transfers, args.block)
    costs = span_costs(args.spans)
    result["cpu_us_per_call"] = costs
    per_request = (
        costs["gateway middleware (added per request)"]
        + 2 * costs["router: one profile run (6 spans, 8 candidates)"]
        + costs["pd proxy: request with prefill+decode (4 spans)"]
        + 2 * costs["engine: llm_request span"]
    )
    result["cpu_us_per_request_all_python_shims"] = per_request
    if "nixl_1MiB_read" in result:
        result["cpu_us_per_request_incl_kv"] = per_request + max(
            0.0, result["nixl_1MiB_read"]["added_cpu_us"]
        )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
