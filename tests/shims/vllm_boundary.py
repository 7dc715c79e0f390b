"""vLLM NixlConnector boundary with real NIXL agents (run as a module in a fresh process).

vLLM cannot run here (no GPU), so this module installs a stand-in for vLLM's NIXL connector
modules (tests/shims/test_vllm_wheels.py checks the same targets against the real wheels) whose
classes have vLLM's
method names and argument shapes and whose worker pulls KV blocks with a real `nixl_agent`
(prepped descriptor lists, `make_prepped_xfer`, `transfer`, `check_xfer_state`,
`release_xfer_handle`) from a target agent in another process. The railtrace hook then runs
exactly where it would in vLLM. Prints the finished spans as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tests.shims.nixl_loopback import call_as, open_initiator

BLOCK = 64 * 1024
LAYOUT = os.environ.get("RT_VLLM_LAYOUT", "flat")  # flat | nested: the two ReqMeta shapes of vLLM
NBLOCKS = 16


@dataclass
class ReqMeta:
    local_block_ids: list[int]
    remote_block_ids: list[int]
    remote_engine_id: str
    remote_host: str
    remote_port: int


@dataclass
class NixlConnectorMetadata:
    reqs_to_recv: dict[str, ReqMeta] = field(default_factory=dict)

    def add_new_req(
        self, request_id: str, local_block_ids: list[int], kv_transfer_params: dict[str, Any]
    ) -> None:
        self.reqs_to_recv[request_id] = ReqMeta(
            local_block_ids,
            kv_transfer_params["remote_block_ids"],
            kv_transfer_params["remote_engine_id"],
            kv_transfer_params["remote_host"],
            kv_transfer_params["remote_port"],
        )


@dataclass
class RemoteMeta:
    block_ids: list[int]
    host: str
    port: int
    engine_id: str
    request_id: str


@dataclass
class NestedReqMeta:
    local_block_ids: list[int]
    tp_size: int
    remote: RemoteMeta | None = None


@dataclass
class NestedNixlConnectorMetadata:
    """Nested layout (`add_new_req_to_recv`, `ReqMeta.remote = RemoteMeta(...)`)."""

    reqs_to_recv: dict[str, Any] = field(default_factory=dict)

    def add_new_req_to_recv(
        self, request_id: str, local_block_ids: list[int], kv_transfer_params: dict[str, Any]
    ) -> None:
        req = NestedReqMeta(local_block_ids, 1)
        req.remote = RemoteMeta(
            block_ids=kv_transfer_params["remote_block_ids"],
            engine_id=kv_transfer_params["remote_engine_id"],
            request_id=kv_transfer_params.get("remote_request_id", ""),
            host=kv_transfer_params["remote_host"],
            port=kv_transfer_params["remote_port"],
        )
        self.reqs_to_recv[request_id] = req


class NixlConnectorScheduler:
    def __init__(self) -> None:
        self.pending: list[tuple[str, list[int], dict[str, Any]]] = []

    def update_state_after_alloc(self, request: Any, blocks: list[int], num_external_tokens: int) -> None:
        self.pending.append((request.request_id, blocks, request.kv_transfer_params))

    def build_connector_meta(self) -> Any:
        meta: Any = NixlConnectorMetadata() if LAYOUT == "flat" else NestedNixlConnectorMetadata()
        for rid, blocks, params in self.pending:
            if LAYOUT == "flat":
                meta.add_new_req(rid, blocks, params)
            else:
                meta.add_new_req_to_recv(rid, blocks, params)
        self.pending.clear()
        return meta


class NixlConnectorWorker:
    def __init__(self, agent: Any, local_addr: int, remote_name: str, remote_addr: int) -> None:
        self.nixl_wrapper = agent
        self.tp_rank = 0
        blocks = [(local_addr + i * BLOCK, BLOCK, 0) for i in range(NBLOCKS)]
        rblocks = [(remote_addr + i * BLOCK, BLOCK, 0) for i in range(NBLOCKS)]
        self.src = agent.prep_xfer_dlist("NIXL_INIT_AGENT", blocks, "DRAM")
        self.dst = agent.prep_xfer_dlist(remote_name, rblocks, "DRAM")
        self._recving_transfers: dict[str, list[Any]] = {}

    def start_load_kv(self, metadata: NixlConnectorMetadata) -> None:
        for req_id, meta in metadata.reqs_to_recv.items():
            self._read_blocks_for_req(req_id, meta)

    def _read_blocks_for_req(self, req_id: str, meta: Any) -> None:
        remote_ids = meta.remote.block_ids if LAYOUT == "nested" else meta.remote_block_ids
        handle = self.nixl_wrapper.make_prepped_xfer(
            "READ", self.src, meta.local_block_ids, self.dst, remote_ids, notif_msg=req_id.encode()
        )
        self.nixl_wrapper.transfer(handle)
        self._recving_transfers.setdefault(req_id, []).append(handle)

    def get_finished(self) -> set[str]:
        done = set()
        for req_id, handles in list(self._recving_transfers.items()):
            states = [self.nixl_wrapper.check_xfer_state(h) for h in handles]
            if all(s in ("DONE", "ERR") for s in states):
                for h in handles:
                    self.nixl_wrapper.release_xfer_handle(h)
                del self._recving_transfers[req_id]
                done.add(req_id)
        return done


def _install_stub() -> types.SimpleNamespace:
    """Register the stand-in classes under the module names of the chosen layout: `flat` as vLLM
    0.11-0.19's `nixl_connector` module, `nested` as the `v1/nixl/` package of vLLM 0.20 on."""
    v1 = "vllm.distributed.kv_transfer.kv_connector.v1"
    for n in ["vllm", "vllm.distributed", "vllm.distributed.kv_transfer", f"{v1[:-3]}", v1]:
        sys.modules.setdefault(n, types.ModuleType(n))

    def module(name: str, **objs: Any) -> None:
        mod = types.ModuleType(name)
        for key, obj in objs.items():
            setattr(mod, key, obj)
        sys.modules[name] = mod

    if LAYOUT == "flat":
        module(
            f"{v1}.nixl_connector",
            ReqMeta=ReqMeta,
            NixlConnectorMetadata=NixlConnectorMetadata,
            NixlConnector=NixlConnectorScheduler,  # the connector delegates to its scheduler
            NixlConnectorScheduler=NixlConnectorScheduler,
            NixlConnectorWorker=NixlConnectorWorker,
        )
    else:
        sys.modules.setdefault(f"{v1}.nixl", types.ModuleType(f"{v1}.nixl"))
        module(f"{v1}.nixl.metadata", NixlConnectorMetadata=NestedNixlConnectorMetadata)
        module(f"{v1}.nixl.connector", NixlBaseConnector=NixlConnectorScheduler)
        module(f"{v1}.nixl.pull_worker", NixlPullConnectorWorker=NixlConnectorWorker)
    return types.SimpleNamespace(
        NixlConnectorScheduler=NixlConnectorScheduler, NixlConnectorWorker=NixlConnectorWorker
    )


def main() -> int:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from railtrace_tracing.kv_transfer import NixlKVTransferInstrumentor
    from tests.shims.nixl_loopback import _span_dict

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    nc = _install_stub()  # vLLM imported before the shim (the hook also patches on later import)
    inst = NixlKVTransferInstrumentor()
    inst.instrument(tracer_provider=provider)

    size = BLOCK * NBLOCKS
    buf = np.zeros(size, dtype=np.uint8)
    # The agent is created where vLLM creates it: the connector module (0.11-0.19), the
    # package's base worker (0.24 on; the pull and push workers derive from it).
    v1 = "vllm.distributed.kv_transfer.kv_connector.v1"
    creator = f"{v1}.nixl_connector" if LAYOUT == "flat" else f"{v1}.nixl.base_worker"
    target, agent, remote_name, remote_addr = call_as(creator, open_initiator, "decode-engine-0", buf)

    tracer = provider.get_tracer("vllm-stand-in")
    with tracer.start_as_current_span("llm_request") as req_span:  # vLLM's request context
        from railtrace_tracing._common import inject_context

        trace_headers = inject_context({})
    request = types.SimpleNamespace(
        request_id="cmpl-abc-0",
        trace_headers=trace_headers,
        kv_transfer_params={
            "remote_request_id": "cmpl-abc-0",
            "do_remote_prefill": True,
            "remote_block_ids": list(range(4)),
            "remote_engine_id": "prefill-engine-7",
            "remote_host": "10.0.0.7",
            "remote_port": 5600,
            "tp_size": 1,
        },
    )
    sched = nc.NixlConnectorScheduler()
    worker = nc.NixlConnectorWorker(agent, buf.ctypes.data, remote_name, remote_addr)
    sched.update_state_after_alloc(request, [4, 5, 6, 7], 4 * 16)
    meta = sched.build_connector_meta()
    worker.start_load_kv(meta)
    deadline = time.monotonic() + 30
    while not worker.get_finished() and time.monotonic() < deadline:
        pass
    target.stdin.write("bye\n")
    target.stdin.flush()
    target.wait(timeout=30)
    inst.force_flush()
    expect = (np.arange(size) % 251).astype(np.uint8)
    out = {
        "request_span_id": f"{req_span.get_span_context().span_id:016x}",
        "verified": bool(np.array_equal(buf[4 * BLOCK : 8 * BLOCK], expect[0 : 4 * BLOCK])),
        "spans": [_span_dict(s) for s in exporter.get_finished_spans() if s.name != "llm_request"],
    }
    inst.uninstrument()
    print("RTRESULT " + json.dumps(out))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    sys.exit(main())
