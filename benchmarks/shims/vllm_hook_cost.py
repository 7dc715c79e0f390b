"""CPU the vLLM hook adds per request on vLLM's worker thread (the scope around
`_read_blocks_for_req` / `_xfer_blocks_for_req`), warm and right after a 64 MiB copy.

    .venv/bin/python -m benchmarks.shims.vllm_hook_cost

The patch the hook installs on vLLM's worker method is applied to a stand-in method with vLLM's
signature (the real method needs a GPU); the same call without the patch is the baseline. Warm:
best of 5 × 20 000 calls. Cold: median of 200 calls, each right after `numpy.copyto` of 64 MiB
(what a `cma` transfer does to the calling core's caches).
"""

from __future__ import annotations

import json
import sys
import time
import types
from typing import Any

import numpy as np

from railtrace_tracing.kv_transfer import vllm as hook

HEADERS = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


class Plain:
    device_id = 0

    def _read_blocks_for_req(self, req_id: str, meta: Any) -> None:
        return None


class Hooked(Plain):
    pass


Hooked._read_blocks_for_req = hook._worker("pull")(Plain.__dict__["_read_blocks_for_req"])  # type: ignore[method-assign]


def warm(fn: Any, n: int = 20000) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.thread_time_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time_ns() - t) / n)
    return best / 1e3


def cold(fn: Any, n: int = 200) -> float:
    big = np.ones(64 << 20, dtype=np.uint8)
    dst = np.empty_like(big)
    values = []
    for _ in range(n):
        np.copyto(dst, big)
        t = time.thread_time_ns()
        fn()
        values.append(time.thread_time_ns() - t)
    values.sort()
    return values[len(values) // 2] / 1e3


def main() -> int:
    remote = types.SimpleNamespace(engine_id="prefill-0", host="10.0.0.7", request_id="cmpl-x-0-0badc0de")
    out = {}
    for name, meta in (
        ("with trace headers", types.SimpleNamespace(remote=remote, _railtrace_trace_headers=HEADERS)),
        ("without", types.SimpleNamespace(remote=remote)),
    ):
        on, off = Hooked(), Plain()

        def call_on(on: Any = on, meta: Any = meta) -> None:
            on._read_blocks_for_req("cmpl-x-0-1a2b3c4d", meta)

        def call_off(off: Any = off, meta: Any = meta) -> None:
            off._read_blocks_for_req("cmpl-x-0-1a2b3c4d", meta)

        out[name] = {
            "warm_added_us": round(warm(call_on) - warm(call_off), 2),
            "cold_added_us": round(cold(call_on) - cold(call_off), 2),
        }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
