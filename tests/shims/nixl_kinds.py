"""Every NIXL user of a vLLM process, with real NIXL transfers (run as a module in a fresh process).

vLLM 0.34.0 creates NIXL agents in its KV connector, its encoder-cache (EC) connector, EPLB and
two KV-offload tiers (docs/shims.md, "Which NIXL agents are traced"). vLLM cannot run here (no
GPU), so each agent is created by a stand-in named like the vLLM module that creates it
(`call_as`); the agents, their peers in other processes and the transfers are real NIXL. The
KV connector's agent reads with an N×5 (strided) prepped list, as vLLM >= 0.33 prepares it.

`python -m tests.shims.nixl_kinds [--otlp-url URL] [--rocm DIR]`: prints `RTRESULT <json>` with
the finished spans, the bytes each transfer moved and the request span of the KV transfer.
`--rocm DIR`: NIXL is loaded as `nixl_rocm` from DIR (tests/shims/test_nixl_agent_kinds.py builds
it from nixl-cu12's files), resolved the way NIXL's meta package resolves it where neither
`nixl_cu13` nor `nixl_cu12` imports, and only the KV connector's agent runs.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import json
import os
import sys
import time
import types
from typing import Any

import numpy as np

from tests.shims.nixl_loopback import _span_dict, call_as, open_initiator

V1 = "vllm.distributed.kv_transfer.kv_connector.v1"
# The creating module of each NIXL user, vLLM 0.34.0 (docs/shims.md cites the lines).
CREATORS = {
    "kv": f"{V1}.nixl.base_worker",
    "ec": "vllm.distributed.ec_transfer.ec_connector.cpu.data.nixl",
    "eplb": "vllm.distributed.eplb.eplb_communicator",
    "offload": "vllm.v1.kv_offload.tiering.p2p.data.nixl",
}
BLOCK = 4096
NBLOCKS = 32
PICKED = [1, 2, 5, 9, 30]  # blocks the KV connector reads, indices into the expanded list


class _NoCudaBackends(importlib.abc.MetaPathFinder):
    """`nixl_cu13` and `nixl_cu12` not installed: what a ROCm image has."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".", 1)[0] in ("nixl_cu12", "nixl_cu13"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def _load_like_meta_package() -> str:
    """Resolve NIXL's backend as its meta package does without a CUDA stack (nixl 1.5.1,
    `nixl/__init__.py` l.37-45: the first of nixl_cu13, nixl_cu12, nixl_rocm that imports) and
    alias its `_api` as `nixl._api` (l.50-55). Returns the backend's name."""
    for name in ("nixl_cu13", "nixl_cu12", "nixl_rocm"):
        try:
            backend = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        api = importlib.import_module(f"{name}._api")
        sys.modules["nixl._api"] = api
        return backend.__name__
    raise ImportError("no NIXL backend")


def _transfer(agent: Any, peer: str, local: Any, remote: Any) -> str:
    handle = agent.initialize_xfer("READ", local, remote, peer, b"done")
    state = agent.transfer(handle)
    deadline = time.monotonic() + 30
    while state not in ("DONE", "ERR") and time.monotonic() < deadline:
        state = agent.check_xfer_state(handle)
    agent.release_xfer_handle(handle)
    return str(state)


def _eplb(agent: Any, peer: str, buf: np.ndarray, remote_addr: int, rounds: int = 3) -> str:
    """EPLB's shape (vllm/distributed/eplb/eplb_communicator.py l.611-681, vLLM 0.34.0): per
    transfer, both lists prepared, one prepped READ, then the lists released."""
    state = ""
    for _ in range(rounds):
        descs = [(buf.ctypes.data + i * BLOCK, BLOCK, 0) for i in range(NBLOCKS)]
        rdescs = [(remote_addr + i * BLOCK, BLOCK, 0) for i in range(NBLOCKS)]
        local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", agent.get_xfer_descs(descs, "DRAM"))
        remote = agent.prep_xfer_dlist(peer, agent.get_xfer_descs(rdescs, "DRAM"))
        idx = np.arange(NBLOCKS, dtype=np.int32)
        handle = agent.make_prepped_xfer("READ", local, idx, remote, idx)
        state = agent.transfer(handle)
        deadline = time.monotonic() + 30
        while state not in ("DONE", "ERR") and time.monotonic() < deadline:
            state = agent.check_xfer_state(handle)
        agent.release_xfer_handle(handle)
        agent.release_dlist_handle(local)
        agent.release_dlist_handle(remote)
    return str(state)


def _kv_strided(agent: Any, peer: str, buf: np.ndarray, remote_addr: int) -> tuple[str, int]:
    """The KV connector's read: local and remote lists prepared as N×5 rows `(addr, len, dev,
    stride, count)` (two rows each), blocks picked by index in the expanded list."""
    half = NBLOCKS // 2
    rows = lambda base: np.array(  # noqa: E731
        [[base, BLOCK, 0, BLOCK, half], [base + half * BLOCK, BLOCK, 0, BLOCK, half]], dtype=np.uint64
    )
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", rows(buf.ctypes.data), mem_type="DRAM")
    remote = agent.prep_xfer_dlist(peer, rows(remote_addr), mem_type="DRAM")
    handle = agent.make_prepped_xfer("READ", local, PICKED, remote, PICKED, b"done")
    state = agent.transfer(handle)
    deadline = time.monotonic() + 30
    while state not in ("DONE", "ERR") and time.monotonic() < deadline:
        state = agent.check_xfer_state(handle)
    agent.release_xfer_handle(handle)
    return str(state), BLOCK * len(PICKED)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--otlp-url")
    p.add_argument("--rocm", help="directory holding a `nixl_rocm` package")
    p.add_argument("--request-id", default="kv-kinds-0")
    args = p.parse_args(argv)

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from railtrace_tracing._common import inject_context
    from railtrace_tracing.kv_transfer import NixlKVTransferInstrumentor, kv_transfer_scope

    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": "vllm-decode", "k8s.pod.name": "decode-0", "k8s.node.name": "node-d"}
        )
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    if args.otlp_url:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=args.otlp_url + "/v1/traces"))
        )
    sys.modules.setdefault("vllm", types.ModuleType("vllm"))  # a vLLM process
    inst = NixlKVTransferInstrumentor()
    inst.instrument(tracer_provider=provider)  # before NIXL is imported, as vLLM's plugin does

    result: dict[str, Any] = {"transfers": {}}
    users = ["kv"] if args.rocm else ["eplb", "offload", "kv", "ec"]
    if args.rocm:
        sys.path.insert(0, args.rocm)
        sys.meta_path.insert(0, _NoCudaBackends())
        result["backend"] = _load_like_meta_package()
        result["nixl_agent_module"] = sys.modules["nixl._api"].nixl_agent.__module__
    tracer = provider.get_tracer("vllm-stand-in")
    size = BLOCK * NBLOCKS
    dlists_after_eplb: list[int] = []
    for user in users:
        buf = np.zeros(size, dtype=np.uint8)
        target, agent, peer, remote_addr = call_as(
            CREATORS[user],
            open_initiator,
            f"{user}-agent",
            buf,
            nixl_module="nixl._api" if args.rocm else "nixl_cu12._api",
        )
        try:
            if user == "kv":
                with tracer.start_as_current_span("llm_request") as req_span:
                    params = {
                        "remote_engine_id": "prefill-engine-7",
                        "remote_host": "10.0.0.7",
                        "trace_headers": inject_context({}),
                    }
                    with kv_transfer_scope(args.request_id, kv_transfer_params=params, local_gpu="0"):
                        state, moved = _kv_strided(agent, peer, buf, remote_addr)
                result["request_span_id"] = f"{req_span.get_span_context().span_id:016x}"
                expect = (np.arange(size) % 251).astype(np.uint8)
                result["verified"] = all(
                    np.array_equal(buf[i * BLOCK : (i + 1) * BLOCK], expect[i * BLOCK : (i + 1) * BLOCK])
                    for i in PICKED
                )
            elif user == "eplb":
                state, moved = _eplb(agent, peer, buf, remote_addr), size
            else:
                local = agent.get_xfer_descs([(buf.ctypes.data, size, 0)], "DRAM")
                remote = agent.get_xfer_descs([(remote_addr, size, 0)], "DRAM")
                state, moved = _transfer(agent, peer, local, remote), size
            result["transfers"][user] = {"state": state, "bytes": moved}
            if user == "eplb":
                dlists_after_eplb.append(len(inst._dlists))  # what the shim kept of its lists
        finally:
            if target.stdin is not None:
                target.stdin.write("bye\n")
                target.stdin.flush()
            target.wait(timeout=30)
    result["dlists_after_eplb"] = dlists_after_eplb[0] if dlists_after_eplb else None
    result["patched"] = [f"{c.__module__}.{c.__qualname__}" for c in inst._patched]
    inst.force_flush()
    provider.force_flush()
    result["spans"] = [_span_dict(s) for s in exporter.get_finished_spans() if s.name != "llm_request"]
    inst.uninstrument()
    provider.shutdown()
    print("RTRESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    sys.exit(main())
