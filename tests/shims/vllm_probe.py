"""Run in a fresh process: import vLLM's real NIXL connector from a wheel tree (GPU stack stubbed),
let the railtrace import hook patch it, and call each hooked method to show it calls through.

`python -m tests.shims.vllm_probe <tree>` prints one `RTPROBE <json>` line.
"""

from __future__ import annotations

import importlib
import json
import sys
import traceback
import types
from pathlib import Path
from typing import Any

from tests.shims import vllm_stubs


class ProbeError(Exception):
    """Raised by the probe `self` on first attribute access: vLLM's own body ran up to there."""


def main(tree: Path) -> dict[str, Any]:
    vllm_stubs.install(tree)
    from railtrace_tracing import semconv as sc
    from railtrace_tracing.kv_transfer import instrumentor
    from railtrace_tracing.kv_transfer import vllm as hook

    hook.install()  # before vLLM's modules are imported, as the plugin does
    layout = "module" if (tree / Path(*hook.OLD_MODULE.split("."))).with_suffix(".py").exists() else "package"
    # Only modules this release has (a missing one would come back as a stub).
    targets = [
        t
        for t in hook.TARGETS
        if t.layout == layout and (tree / Path(*t.module.split("."))).with_suffix(".py").exists()
    ]
    out: dict[str, Any] = {"layout": layout, "imported": [], "patched": [], "calls": {}}
    for name in dict.fromkeys(t.module for t in targets):
        mod = importlib.import_module(name)
        out["imported"].append([name, str(getattr(mod, "__file__", ""))])
    out["patched"] = sorted(f"{c.__module__}.{c.__name__}.{m}" for c, m, _ in hook._STATE.patched)

    headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    params = {
        "remote_block_ids": [1, 2, 3],
        "remote_engine_id": "prefill-engine-7",
        "remote_request_id": "cmpl-abc-0-0badc0de",
        "remote_host": "10.0.0.7",
        "remote_port": 5600,
        "tp_size": 1,
    }
    for t in targets:
        cls = getattr(sys.modules[t.module], t.cls, None)
        if cls is None or not hasattr(cls, t.method):
            continue  # an alternative this release does not have (the metadata API changed)
        owner = next(c for c in cls.__mro__ if t.method in c.__dict__)
        method = owner.__dict__[t.method]
        nested = layout == "package" or hasattr(sys.modules[t.module], "RemoteMeta")  # ReqMeta.remote
        seen: dict[str, Any] = {}

        class Probe:
            device_id = 0  # read by the hook for `.local.gpu`

            def __getattr__(self, name: str, seen: dict[str, Any] = seen) -> Any:
                scope = instrumentor._SCOPE.get()
                if scope is not None and hasattr(scope, "resolve"):
                    scope = scope.resolve()  # what the emitter will read for the span
                seen["scope"] = (
                    None
                    if scope is None
                    else {
                        "request_id": scope.request_id,
                        "remote_engine_id": scope.remote_engine_id,
                        "remote_host": scope.remote_host,
                        "parent": scope.parent is not None,
                        "attributes": dict(scope.attributes),
                    }
                )
                raise ProbeError(name)

        result: dict[str, Any] = {
            "wrapped": hasattr(method, "__wrapped__"),
            "owner": f"{owner.__module__}.{owner.__name__}.{t.method}",
        }
        try:
            if t.kind.startswith("worker"):
                if not nested:
                    meta = types.SimpleNamespace(
                        remote_engine_id="prefill-engine-7",
                        remote_host="10.0.0.7",
                        local_block_ids=[1],
                        remote_block_ids=[1],
                        _railtrace_trace_headers=headers,
                    )
                else:
                    meta = types.SimpleNamespace(
                        remote=types.SimpleNamespace(
                            engine_id="prefill-engine-7",
                            host="10.0.0.7",
                            request_id="cmpl-abc-0-0badc0de",
                            block_ids=[1],
                            registration_generation=0,
                        ),
                        local_block_ids=[1],
                        _railtrace_trace_headers=headers,
                    )
                probe = Probe()
                bound = owner.__dict__[t.method].__get__(probe, owner)
                if t.kind == "worker_push":  # vLLM >= 0.25 posts pushes from its writer thread
                    import threading

                    errors: list[BaseException] = []

                    def run(
                        bound: Any = bound, meta: Any = meta, errors: list[BaseException] = errors
                    ) -> None:
                        try:
                            bound("cmpl-abc-0-1a2b3c4d", meta)
                        except BaseException as exc:
                            errors.append(exc)

                    th = threading.Thread(target=run, name="push-writer")
                    th.start()
                    th.join()
                    result["thread"] = th.name
                    raise errors[0]
                bound("cmpl-abc-0-1a2b3c4d", meta)
            elif t.kind == "metadata":
                md = cls()
                getattr(md, t.method)(
                    "cmpl-abc-0-1a2b3c4d", [4, 5, 6], {**params, sc.KV_PARAM_TRACE_HEADERS: headers}
                )
                reqs = md.reqs_to_save if t.method.endswith("save") else md.reqs_to_recv
                req = reqs["cmpl-abc-0-1a2b3c4d"]
                result["real_req_meta"] = type(req).__module__
                result["headers_on_meta"] = getattr(req, hook._ATTR, None) == headers
            elif t.kind == "scheduler":
                request = types.SimpleNamespace(
                    request_id="cmpl-abc-0-1a2b3c4d", trace_headers=headers, kv_transfer_params=dict(params)
                )
                seen["request"] = request
                probe = Probe()
                owner.__dict__[t.method].__get__(probe, owner)(request, [], 0)
        except ProbeError as exc:
            frames = traceback.extract_tb(exc.__traceback__)
            result["raised_in"] = [f.filename for f in frames if f.filename.startswith(str(tree))]
        if "scope" in seen:
            result["scope"] = seen["scope"]
        if "request" in seen:
            result["headers_in_params"] = seen["request"].kv_transfer_params.get(sc.KV_PARAM_TRACE_HEADERS)
        out["calls"][f"{t.cls}.{t.method}"] = result
    out["adds_suffix"] = hook._adds_suffix()
    return out


if __name__ == "__main__":
    print("RTPROBE " + json.dumps(main(Path(sys.argv[1]))))
