"""Two NIXL agents in two processes moving a buffer over loopback, with the KV shim on.

Run as a module (the tests and the benchmark do):
`python -m tests.shims.nixl_loopback --op READ|WRITE [--size N] [--count K] [--out spans.json]
[--otlp-url URL] [--uninstrumented]`. The initiator process instruments NIXL *before* creating its
agent (UCX reads its log settings once per process), spawns the target process, exchanges agent
metadata over pipes, runs the transfers and writes its finished spans as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np


def call_as(module_name: str, func: Any, *args: Any, **kwargs: Any) -> Any:
    """Call `func` as if its code lived in module `module_name`. The KV shim tells which code
    creates a NIXL agent by the creating frame's module (vLLM's KV connector, its EC connector,
    EPLB, ...), so a stand-in for vLLM's code that cannot run here (no GPU) is named like it."""
    import types

    glb = dict(func.__globals__)
    glb["__name__"] = module_name
    clone = types.FunctionType(func.__code__, glb, func.__name__, func.__defaults__, func.__closure__)
    return clone(*args, **kwargs)


def _cfg(nixl_api: Any) -> Any:
    return nixl_api.nixl_agent_config(enable_prog_thread=False, enable_listen_thread=False, backends=["UCX"])


def open_initiator(
    name: str, buf: np.ndarray, cwd: str | None = None, nixl_module: str = "nixl_cu12._api"
) -> tuple[subprocess.Popen[str], Any, str, int]:
    """Spawn the target process, create this process's agent on `buf` and exchange metadata.

    Returns (target process, agent, peer agent name, target buffer address). Instrument NIXL
    before calling: the agent is created here, with `nixl_agent` of `nixl_module`.
    """
    import importlib

    _api = importlib.import_module(nixl_module)

    size = buf.nbytes
    target = subprocess.Popen(
        [sys.executable, "-m", "tests.shims.nixl_loopback", "--role", "target", "--size", str(size)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )
    assert target.stdout is not None and target.stdin is not None
    line = target.stdout.readline()
    while line and not line.startswith("RTHELLO "):
        line = target.stdout.readline()
    if not line:
        target.kill()
        raise RuntimeError("NIXL loopback target exited before publishing its metadata")
    hello = json.loads(line.split(" ", 1)[1])
    agent = _api.nixl_agent(name, _cfg(_api))
    agent.register_memory([(buf.ctypes.data, size, 0, "")], "DRAM")
    peer = agent.add_remote_agent(bytes.fromhex(hello["meta"]))
    target.stdin.write(json.dumps({"meta": agent.get_agent_metadata().hex()}) + "\n")
    target.stdin.flush()
    return target, agent, peer, int(hello["addr"])


def spawn_target(size: int, name: str, env: dict[str, str] | None = None) -> tuple[Any, dict[str, Any]]:
    """Start one target process (its own UCX settings from `env`) and read its metadata."""
    full = dict(os.environ)
    full.update(env or {})
    target = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.shims.nixl_loopback",
            "--role",
            "target",
            "--size",
            str(size),
            "--name",
            name,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=full,
    )
    line = target.stdout.readline()
    while line and not line.startswith("RTHELLO "):
        line = target.stdout.readline()
    if not line:
        target.kill()
        raise RuntimeError("NIXL loopback target exited before publishing its metadata")
    return target, json.loads(line.split(" ", 1)[1])


def target_main(size: int, name: str = "loop-target") -> int:
    """Target: register a buffer, publish metadata, progress until the initiator says bye."""
    from nixl_cu12 import _api

    agent = _api.nixl_agent(name, _cfg(_api))
    buf = (np.arange(size) % 251).astype(np.uint8)
    agent.register_memory([(buf.ctypes.data, size, 0, "")], "DRAM")
    hello = {"meta": agent.get_agent_metadata().hex(), "addr": buf.ctypes.data}
    sys.stdout.write("RTHELLO " + json.dumps(hello) + "\n")
    sys.stdout.flush()
    peer = json.loads(sys.stdin.readline())
    agent.add_remote_agent(bytes.fromhex(peer["meta"]))
    deadline = time.monotonic() + float(peer.get("linger", 60))  # benchmarks ask for longer
    os.set_blocking(sys.stdin.fileno(), False)
    while time.monotonic() < deadline:
        agent.get_new_notifs()
        try:
            line = sys.stdin.readline()
        except (BlockingIOError, OSError):
            line = ""
        if line.strip() == "bye":
            break
        time.sleep(0.0005)
    return 0


def _span_dict(span: Any) -> dict[str, Any]:
    parent = span.parent
    return {
        "name": span.name,
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent_span_id": f"{parent.span_id:016x}" if parent else None,
        "start": span.start_time,
        "end": span.end_time,
        "status": span.status.status_code.name,
        "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in span.attributes.items()},
    }


def initiator_main(args: argparse.Namespace) -> int:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from railtrace_tracing.kv_transfer import NixlKVTransferInstrumentor, kv_transfer_scope

    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": "vllm-decode", "k8s.pod.name": args.pod, "k8s.node.name": args.node}
        )
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    if args.otlp_url:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=args.otlp_url + "/v1/traces"))
        )
    inst = NixlKVTransferInstrumentor()
    if not args.uninstrumented:
        inst.instrument(tracer_provider=provider)

    buf = (
        np.zeros(args.size, dtype=np.uint8)
        if args.op == "READ"
        else ((np.arange(args.size) % 13).astype(np.uint8))
    )
    target, agent, peer, remote_addr = open_initiator("loop-initiator", buf)
    # The shim's patch of `transfer` on NIXL's class: HotPatch (the C hot path) or function.
    patch_type = type(vars(type(agent)).get("transfer")).__name__
    result: dict[str, Any] = {"op": args.op, "transfers": [], "patch_type": patch_type}
    try:
        local = agent.get_xfer_descs([(buf.ctypes.data, args.size, 0)], "DRAM")
        remote = agent.get_xfer_descs([(remote_addr, args.size, 0)], "DRAM")
        tracer = provider.get_tracer("loopback-test")
        for i in range(args.count):
            with tracer.start_as_current_span("llm_request") as req_span:
                headers: dict[str, str] = {}
                from railtrace_tracing._common import inject_context

                inject_context(headers)
                params = {
                    "remote_engine_id": "prefill-engine-7",
                    "remote_host": "10.0.0.7",
                    "trace_headers": headers,
                }
                t0 = time.perf_counter_ns()
                c0 = time.process_time_ns()
                with kv_transfer_scope(
                    f"{args.request_prefix}{i}", kv_transfer_params=params, local_gpu="GPU0"
                ):
                    handle = agent.initialize_xfer(args.op, local, remote, peer, b"done")
                    state = agent.transfer(handle)
                    deadline = time.monotonic() + 30
                    while state not in ("DONE", "ERR") and time.monotonic() < deadline:
                        state = agent.check_xfer_state(handle)
                    carried = getattr(handle, "_railtrace_record", None) is not None
                    agent.release_xfer_handle(handle)
                result["transfers"].append(
                    {
                        "state": state,
                        # NIXL's handle class, and whether the shim's record rode on the handle
                        "handle_class": type(handle).__qualname__,
                        "record_on_handle": carried,
                        "wall_ns": time.perf_counter_ns() - t0,
                        "cpu_ns": time.process_time_ns() - c0,
                        "request_span_id": f"{req_span.get_span_context().span_id:016x}",
                    }
                )
        expect = (np.arange(args.size) % 251).astype(np.uint8)
        result["verified"] = bool(np.array_equal(buf, expect)) if args.op == "READ" else None
    finally:
        if target.stdin is not None:
            try:
                target.stdin.write("bye\n")
                target.stdin.flush()
            except OSError:
                pass
        target.wait(timeout=30)
    inst.force_flush()
    provider.force_flush()
    result["spans"] = [_span_dict(s) for s in exporter.get_finished_spans()]
    result["ucx_log"] = inst.capture.path
    inst.uninstrument()
    out = json.dumps(result)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(out)
    else:
        print(out)
    provider.shutdown()
    return 0


def peers_main(args: argparse.Namespace) -> int:
    """One initiator agent pulling from several peers whose UCX transports differ: each peer is a
    target process with its own `UCX_TLS`, so UCX's endpoint to it uses what both sides offer."""
    from nixl_cu12 import _api
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from railtrace_tracing.kv_transfer import NixlKVTransferInstrumentor, kv_transfer_scope

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    inst = NixlKVTransferInstrumentor()
    inst.instrument(tracer_provider=provider)
    specs = [p.strip() for p in args.peers.split(",") if p.strip()]
    buf = np.zeros(args.size, dtype=np.uint8)
    agent = _api.nixl_agent("multi-initiator", _cfg(_api))
    agent.register_memory([(buf.ctypes.data, args.size, 0, "")], "DRAM")
    targets, peers = [], []
    result: dict[str, Any] = {"transfers": []}
    try:
        for i, spec in enumerate(specs):
            env = {} if spec == "default" else {"UCX_TLS": spec}
            target, hello = spawn_target(args.size, f"peer-{i}-{spec}", env)
            targets.append(target)
            peer = agent.add_remote_agent(bytes.fromhex(hello["meta"]))
            target.stdin.write(json.dumps({"meta": agent.get_agent_metadata().hex()}) + "\n")
            target.stdin.flush()
            peers.append((peer, int(hello["addr"]), spec))
        local = agent.get_xfer_descs([(buf.ctypes.data, args.size, 0)], "DRAM")
        for i, (peer, addr, spec) in enumerate(peers):
            remote = agent.get_xfer_descs([(addr, args.size, 0)], "DRAM")
            with kv_transfer_scope(f"req-{spec}", remote_engine_id=f"prefill-{spec}"):
                handle = agent.initialize_xfer(args.op, local, remote, peer, b"done")
                state = agent.transfer(handle)
                deadline = time.monotonic() + 30
                while state not in ("DONE", "ERR") and time.monotonic() < deadline:
                    state = agent.check_xfer_state(handle)
                agent.release_xfer_handle(handle)
            result["transfers"].append({"peer": _name(peer), "spec": spec, "state": state, "index": i})
    finally:
        for target in targets:
            with contextlib.suppress(OSError):
                target.stdin.write("bye\n")
                target.stdin.flush()
            target.wait(timeout=30)
    inst.force_flush()
    result["spans"] = [_span_dict(s) for s in exporter.get_finished_spans()]
    result["ucx_log"] = inst.capture.path
    inst.uninstrument()
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(result))
    provider.shutdown()
    return 0


def _name(peer: Any) -> str:
    return peer.decode() if isinstance(peer, bytes) else str(peer)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--role", default="initiator", choices=["initiator", "target"])
    p.add_argument("--op", default="WRITE", choices=["READ", "WRITE"])
    p.add_argument("--size", type=int, default=1 << 20)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--out")
    p.add_argument("--otlp-url")
    p.add_argument("--node", default="node-a")
    p.add_argument("--pod", default="decode-0")
    p.add_argument("--request-prefix", default="req-")
    p.add_argument("--uninstrumented", action="store_true")
    p.add_argument("--name", default="loop-target")
    p.add_argument(
        "--peers", help="comma list of peer UCX_TLS settings, e.g. `default,tcp`: one agent, one peer each"
    )
    args = p.parse_args(argv)
    if args.role == "target":
        return target_main(args.size, args.name)
    if args.peers:
        return peers_main(args)
    return initiator_main(args)


if __name__ == "__main__":
    sys.exit(main())
