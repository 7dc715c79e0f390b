"""KV shim cost on real NIXL loopback transfers the way vLLM posts them: 1, 16 and 256 MiB, with
8k to 131k blocks per transfer.

    UCX_NET_DEVICES=lo .venv/bin/python -m benchmarks.shims.kv_sizes [--transfers 30] [--block 5]
        [--no-telemetry] [--hot-path auto|c|python] [--out FILE]

Two NIXL 1.5.1 agents in two processes (the target from tests.shims.nixl_loopback). The initiator
registers one buffer per size, prepares descriptor lists of N equal blocks on both sides
(`prep_xfer_dlist`, as vLLM does at registration) and posts each transfer with
`make_prepped_xfer(READ, local, indices, remote, indices)` → `transfer` (result ignored) → polls
until DONE → `get_xfer_telemetry` (with telemetry, as vLLM ≥ 0.12) → `release_xfer_handle`, in
vLLM's order (0.34.0 `nixl/pull_worker.py`, `base_worker.py` `_pop_done_transfers`). Agents are created with
`capture_telemetry=True` (what vLLM ≥ 0.13 does) unless `--no-telemetry`.

Modes alternate block by block on the same agents and endpoints: `off` (the shim's class patches
removed), `bare` (the peer: the same five methods patched by functions that only call through, the
floor of any Python-level patch) and `on` (patched, background emitter, UCX evidence; the C hot
path where it is built, the Python patches with `--hot-path python`; the output's `hot_path`). With `cma`
the copy runs inside `transfer()` on the calling thread, so the thread's CPU per transfer is the
copy (ms) and its noise hides a µs-scale shim. The benchmark therefore puts a timer *under* the
shim: each NIXL method is wrapped by a timing function before the shim patches it, so on the
calling thread (vLLM's engine thread) `outer − inner` of every call is the wrapper's own CPU
(`time.thread_time_ns`); `added` = (outer − inner) with the shim − (outer − inner) without it (the
timer's own cost cancels), summed over the calls of one transfer (prep, post, completing poll,
release; intermediate `PROC` polls are reported per poll). Median and p99 over transfers; share =
added median / the transfer's wall time (post to DONE) without the shim. The CPU railtrace's
emitter thread spends per transfer (evidence lookup, the span and its attributes, handing it to
the SDK's batch processor) is read from its own thread clock over the `on` blocks; the batch
processor's export runs on the SDK's thread and is not counted.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import threading
import time
from typing import Any

import numpy as np
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

MIB = 1 << 20
MODES = ("off", "bare", "on")
HOT_CALLS = ("make_prepped_xfer", "transfer", "check_xfer_state", "get_xfer_telemetry", "release_xfer_handle")
CONFIGS = (
    (4096, 1),  # a copy too small to evict the caches: the shim's warm cost on real NIXL
    (1 * MIB, 8192),
    (1 * MIB, 131072),
    (16 * MIB, 8192),
    (16 * MIB, 32768),
    (16 * MIB, 131072),
    (256 * MIB, 8192),
    (256 * MIB, 131072),
)


class Drop(SpanExporter):
    """Counts spans per transport and drops them (export cost without a network)."""

    def __init__(self) -> None:
        self.by_transport: dict[str, int] = {}
        self.bytes_seen: set[int] = set()
        self.with_telemetry = 0

    def export(self, spans: Any) -> SpanExportResult:
        for s in spans:
            t = str(s.attributes.get("llm_d.kv_transfer.transport"))
            self.by_transport[t] = self.by_transport.get(t, 0) + 1
            self.bytes_seen.add(int(s.attributes.get("llm_d.kv_transfer.bytes", -1)))
            self.with_telemetry += "llm_d.kv_transfer.xfer_duration_s" in s.attributes
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def emitter_cpu(inst: Any) -> int:
    """CPU (ns) of railtrace's emitter thread, from its own clock."""
    worker = inst._worker
    if worker is None or worker.ident is None:
        return 0
    with contextlib.suppress(OSError):
        return time.clock_gettime_ns(time.pthread_getcpuclockid(worker.ident))
    return 0


def drain(inst: Any, timeout_s: float = 10.0) -> None:
    """Wait until the emitter has turned every finished transfer into a span (on its thread)."""
    deadline = time.monotonic() + timeout_s
    inst._wake.set()  # rather than waiting for its timer
    while (inst._queue or inst._waiting) and time.monotonic() < deadline:
        time.sleep(0.005)


class GcPauses:
    """CPU time of the garbage collector's runs on one thread (the posting thread), by generation:
    a collection that starts inside a timed call lands in that call's `added` (the p99 outliers)."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.runs: dict[int, list[int]] = {}
        self._start = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if threading.get_ident() != self.thread:
            return
        if phase == "start":
            self._start = time.thread_time_ns()
        else:
            self.runs.setdefault(int(info["generation"]), []).append(time.thread_time_ns() - self._start)

    def summary(self) -> dict[str, Any]:
        return {
            f"gen{g}": {"runs": len(v), "median_us": statistics.median(v) / 1e3, "max_us": max(v) / 1e3}
            for g, v in sorted(self.runs.items())
        }


def pct(values: list[int], q: float) -> float:
    s = sorted(values)
    return float(s[min(len(s) - 1, int(q * len(s)))])


def run(
    transfers: int,
    block: int,
    telemetry: bool,
    sizes: set[float] | None = None,
    progress_thread: bool = False,
    hot_path: str = "auto",
) -> dict[str, Any]:
    from nixl_cu12 import _api

    from railtrace_tracing.kv_transfer import NixlKVTransferInstrumentor, kv_transfer_scope
    from railtrace_tracing.kv_transfer import instrumentor as mod
    from tests.shims.nixl_loopback import spawn_target

    inner: list[int] = [0]  # CPU of the last real NIXL call (set by the timers under the shim)
    cls0 = _api.nixl_agent
    for name in HOT_CALLS:
        real = getattr(cls0, name)

        def timed(agent: Any, *a: Any, _real: Any = real, **k: Any) -> Any:
            t0 = time.thread_time_ns()
            try:
                return _real(agent, *a, **k)
            finally:
                inner[0] = time.thread_time_ns() - t0

        timed.__name__ = name
        setattr(cls0, name, timed)

    exporter = Drop()
    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(exporter))
    inst = NixlKVTransferInstrumentor()
    inst.instrument(tracer_provider=tp, hot_path=hot_path)
    cls = _api.nixl_agent
    patched = {n: cls.__dict__[n] for n in mod._METHODS if n in cls.__dict__}
    originals = {n: getattr(f, mod._PATCH_MARK)[1] for n, f in patched.items()}

    def passthrough(original: Any) -> Any:
        def bare(agent: Any, *a: Any, **k: Any) -> Any:
            return original(agent, *a, **k)

        return bare

    # The peer: the same five methods patched by functions that only call through, the least any
    # Python-level patch costs (its frames, run on the caches the copy left).
    bare = {n: passthrough(originals[n]) for n in HOT_CALLS if n in originals}

    def set_mode(mode: str) -> None:
        for name in patched:
            fn = (
                patched[name] if mode == "on" else bare.get(name, originals[name]) if mode == "bare" else None
            )
            setattr(cls, name, fn or originals[name])

    largest = max(size for size, _ in CONFIGS)
    conf = _api.nixl_agent_config(
        enable_prog_thread=progress_thread,
        enable_listen_thread=False,
        backends=["UCX"],
        capture_telemetry=telemetry,
    )
    agent = _api.nixl_agent("bench-kv-initiator", conf)
    buf = np.zeros(largest, dtype=np.uint8)
    agent.register_memory([(buf.ctypes.data, largest, 0, "")], "DRAM")
    target, hello = spawn_target(largest, "bench-kv-target", {})
    peer = agent.add_remote_agent(bytes.fromhex(hello["meta"]))
    target.stdin.write(json.dumps({"meta": agent.get_agent_metadata().hex(), "linger": 3600}) + "\n")
    target.stdin.flush()
    raddr = int(hello["addr"])
    results: list[dict[str, Any]] = []
    gc_pauses = GcPauses()
    gc.callbacks.append(gc_pauses)
    try:
        for size, nblocks in CONFIGS:
            if sizes and size / MIB not in sizes:
                continue
            bs = size // nblocks
            local = agent.prep_xfer_dlist(
                "NIXL_INIT_AGENT", [(buf.ctypes.data + i * bs, bs, 0) for i in range(nblocks)], "DRAM"
            )
            remote = agent.prep_xfer_dlist(peer, [(raddr + i * bs, bs, 0) for i in range(nblocks)], "DRAM")
            idx = np.arange(nblocks, dtype=np.int64)
            cpu: dict[str, list[int]] = {m: [] for m in MODES}
            wall: dict[str, list[int]] = {m: [] for m in MODES}
            polls: dict[str, list[tuple[int, int]]] = {m: [] for m in MODES}
            per_call: dict[str, dict[str, list[int]]] = {m: {} for m in MODES}
            n = 0

            def call(fn: Any, *a: Any) -> tuple[Any, int]:
                t0 = time.thread_time_ns()
                out = fn(*a)
                return out, time.thread_time_ns() - t0 - inner[0]  # the wrapper's own CPU

            def one(  # the loop's objects bound as defaults: this configuration's
                mode: str,
                i: int,
                local: Any = local,
                remote: Any = remote,
                idx: Any = idx,
                cpu: dict[str, list[int]] = cpu,
                wall: dict[str, list[int]] = wall,
                polls: dict[str, list[tuple[int, int]]] = polls,
                per_call: dict[str, dict[str, list[int]]] = per_call,
            ) -> None:
                # vLLM's order: post inside the request's worker method (the scope), ignoring what
                # `transfer` returns; poll in a later step until DONE; then, from 0.12 on (agents
                # with telemetry), `get_xfer_telemetry`; then release.
                with kv_transfer_scope(f"cmpl-bench-{i}-0", remote_engine_id="prefill-0"):
                    h, o_prep = call(agent.make_prepped_xfer, "READ", local, idx, remote, idx)
                    w0 = time.perf_counter_ns()
                    _, o_post = call(agent.transfer, h)
                poll_own, npoll = 0, 0
                while True:
                    state, o_poll = call(agent.check_xfer_state, h)
                    if state != "PROC":
                        break
                    poll_own += o_poll
                    npoll += 1
                w1 = time.perf_counter_ns()
                o_tel = call(agent.get_xfer_telemetry, h)[1] if telemetry else 0
                _, o_rel = call(agent.release_xfer_handle, h)
                assert state == "DONE", state
                if i >= 0:
                    own = {
                        "prep": o_prep,
                        "post": o_post,
                        "done_poll": o_poll,
                        "telemetry": o_tel,
                        "release": o_rel,
                    }
                    for name, o in own.items():
                        per_call[mode].setdefault(name, []).append(o)
                    cpu[mode].append(sum(own.values()))
                    wall[mode].append(w1 - w0)
                    polls[mode].append((npoll, poll_own))

            for w in range(3):  # warm-up: protocol selection, UCX tables, evidence cached
                set_mode("on")
                one("on", -1 - w)
            bg = 0
            while n < transfers:
                for mode in MODES:
                    set_mode(mode)
                    if mode == "on":
                        b0 = emitter_cpu(inst)
                    for _ in range(block):
                        one(mode, n)
                    if mode == "on":
                        drain(inst)  # the emitter builds the spans on its own thread
                        bg += emitter_cpu(inst) - b0
                n += block
            set_mode("on")
            inst.force_flush()
            tp.force_flush()
            agent.release_dlist_handle(local)
            agent.release_dlist_handle(remote)
            r: dict[str, Any] = {
                "size_bytes": size,
                "size_mib": size / MIB,
                "blocks": nblocks,
                "transfers_per_mode": transfers,
            }
            for mode in MODES:
                np_, pc = sum(p for p, _ in polls[mode]), sum(c for _, c in polls[mode])
                r[mode] = {
                    "cpu_us_median": statistics.median(cpu[mode]) / 1e3,
                    "cpu_us_p99": pct(cpu[mode], 0.99) / 1e3,
                    "wall_us_median": statistics.median(wall[mode]) / 1e3,
                    "polls_per_transfer": np_ / len(polls[mode]),
                    "cpu_us_per_poll": (pc / np_ / 1e3) if np_ else None,
                }
            off_sorted = sorted(cpu["off"])
            added = [c - off_sorted[len(off_sorted) // 2] for c in cpu["on"]]
            r["added_cpu_us_median_by_call"] = {
                name: (statistics.median(per_call["on"][name]) - statistics.median(per_call["off"][name]))
                / 1e3
                for name in per_call["on"]
            }
            r["passthrough_cpu_us_median_by_call"] = {
                name: (statistics.median(per_call["bare"][name]) - statistics.median(per_call["off"][name]))
                / 1e3
                for name in per_call["bare"]
            }
            r["added_cpu_us_median"] = (statistics.median(cpu["on"]) - statistics.median(cpu["off"])) / 1e3
            r["added_cpu_us_p99"] = pct(added, 0.99) / 1e3
            r["added_share_pct"] = 100 * r["added_cpu_us_median"] / r["off"]["wall_us_median"]
            # What five call-through patches cost on the same caches, and the shim above that floor.
            r["passthrough_cpu_us_median"] = (
                statistics.median(cpu["bare"]) - statistics.median(cpu["off"])
            ) / 1e3
            r["shim_over_passthrough_us_median"] = r["added_cpu_us_median"] - r["passthrough_cpu_us_median"]
            r["emitter_cpu_us_per_transfer"] = bg / n / 1e3
            results.append(r)
            print(json.dumps(r), file=sys.stderr)
    finally:
        gc.callbacks.remove(gc_pauses)
        set_mode("on")
        inst.force_flush()
        inst.uninstrument()
        tp.shutdown()
        target.stdin.write("bye\n")
        target.stdin.flush()
        target.wait(timeout=60)
    return {
        "telemetry": telemetry,
        # what `on` measured: "c" (the C hot path, _hotpath.c) or "python" (the Python patches)
        "hot_path": "c" if type(patched["transfer"]).__name__ == "HotPatch" else "python",
        "configs": results,
        "spans_by_transport": exporter.by_transport,
        "span_bytes_seen": sorted(exporter.bytes_seen),
        "spans_with_nixl_telemetry": exporter.with_telemetry,
        # every mode and configuration together
        "gc_on_posting_thread": gc_pauses.summary(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--transfers", type=int, default=30, help="transfers per mode per configuration")
    ap.add_argument("--block", type=int, default=5, help="transfers per mode before switching")
    ap.add_argument("--no-telemetry", action="store_true", help="agents without capture_telemetry")
    ap.add_argument("--sizes", help="only these transfer sizes, MiB, comma-separated (e.g. 16,256)")
    ap.add_argument(
        "--progress-thread",
        action="store_true",
        help="NIXL's progress thread on, as vLLM's agents have it (nixl_agent_config's default)",
    )
    ap.add_argument(
        "--hot-path",
        choices=("auto", "c", "python"),
        default="auto",
        help="the shim's C hot path (auto: where built) or its Python patches",
    )
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    sizes = {float(s) for s in args.sizes.split(",")} if args.sizes else None
    out = run(args.transfers, args.block, not args.no_telemetry, sizes, args.progress_thread, args.hot_path)
    text = json.dumps(out, indent=1)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
