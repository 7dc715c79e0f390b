"""A real NIXL post that raises, with the KV shim on (run as a module in a fresh process).

The initiator prepares a READ from a target process, the target exits, the initiator removes the
peer (`remove_remote_agent`, as vLLM does when a prefill instance goes away), then posts the
stale handle: NIXL 1.5.1 raises `nixlNotFoundError` from `transfer()`.
Prints `RTFAIL <json>` with the exception and spans.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def main() -> int:
    from nixl_cu12 import _api
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from railtrace_tracing.kv_transfer import NixlKVTransferInstrumentor, kv_transfer_scope
    from tests.shims.nixl_loopback import _cfg, _span_dict, spawn_target

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    inst = NixlKVTransferInstrumentor()
    inst.instrument(tracer_provider=provider)
    agent = _api.nixl_agent("fail-initiator", _cfg(_api))
    buf = np.zeros(1 << 16, dtype=np.uint8)
    agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    target, hello = spawn_target(buf.nbytes, "fail-target", {})
    peer = agent.add_remote_agent(bytes.fromhex(hello["meta"]))
    target.stdin.write(json.dumps({"meta": agent.get_agent_metadata().hex()}) + "\n")
    target.stdin.write("bye\n")
    target.stdin.flush()
    local = agent.get_xfer_descs([(buf.ctypes.data, buf.nbytes, 0)], "DRAM")
    remote = agent.get_xfer_descs([(int(hello["addr"]), buf.nbytes, 0)], "DRAM")
    handle = agent.initialize_xfer("READ", local, remote, peer, b"")
    target.wait(timeout=30)
    time.sleep(0.2)
    agent.remove_remote_agent(peer)
    raised = None
    with kv_transfer_scope("cmpl-fail-0", remote_engine_id="prefill-gone"):
        try:
            agent.transfer(handle)
        except Exception as exc:
            raised = type(exc).__name__
    inst.force_flush()
    out = {
        "raised": raised,
        "patch_type": type(vars(_api.nixl_agent)["transfer"]).__name__,  # HotPatch: the C hot path
        "spans": [_span_dict(s) for s in exporter.get_finished_spans()],
    }
    inst.uninstrument()
    print("RTFAIL " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
