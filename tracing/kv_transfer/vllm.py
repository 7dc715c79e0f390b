"""vLLM NixlConnector integration: put each KV transfer into its request's own trace.

vLLM's v1 `NixlConnector` (module `vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector`)
runs the pull in its worker: `NixlConnectorWorker._read_blocks_for_req(req_id, meta)` calls
`make_prepped_xfer` and `transfer` on its `nixl_wrapper` (a `nixl_agent`), and later polls
`check_xfer_state` and `release_xfer_handle`. This hook wraps that method (and the older
`_read_blocks(..., request_id=...)`) in `kv_transfer_scope`, so the NIXL instrumentor's span
carries the request id, remote engine and host from the request's metadata. Two `ReqMeta`
layouts are read: flat (`remote_engine_id`, `remote_host`; built by `add_new_req`) and nested
(`remote: RemoteMeta(engine_id, host, …)`; built by `add_new_req_to_recv`).

The trace context: the scheduler side sees the request (`request.trace_headers`,
`request.kv_transfer_params`); `NixlConnectorMetadata.add_new_req` builds the worker's
`ReqMeta` from `kv_transfer_params`. The hook copies the request's W3C headers into
`kv_transfer_params["trace_headers"]` (unless a railtrace P/D proxy already put them there)
and onto the `ReqMeta`, where the worker hook finds them.

Every wrapper is defensive: a vLLM whose layout differs is left untouched (and logged).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import wrapt
from opentelemetry.instrumentation.utils import unwrap

from railtrace_tracing import semconv as sc
from railtrace_tracing._common import logger
from railtrace_tracing.kv_transfer.instrumentor import kv_transfer_scope

MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector"
_ATTR = "_railtrace_trace_headers"
_state: dict[str, Any] = {"installed": False, "patched": []}


def _headers_of(meta: Any) -> Mapping[str, Any] | None:
    h = getattr(meta, _ATTR, None)
    if isinstance(h, Mapping):
        return h
    params = getattr(meta, "kv_transfer_params", None)
    if isinstance(params, Mapping) and isinstance(params.get(sc.KV_PARAM_TRACE_HEADERS), Mapping):
        return params[sc.KV_PARAM_TRACE_HEADERS]
    return None


def _read_blocks_for_req(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    try:
        req_id = kwargs.get("req_id", args[0] if args else None)
        meta = kwargs.get("meta", args[1] if len(args) > 1 else None)
        remote = getattr(meta, "remote", None)  # newer layout: ReqMeta.remote = RemoteMeta(...)
        src = remote if remote is not None else meta
        scope = kv_transfer_scope(
            None if req_id is None else str(req_id),
            trace_headers=_headers_of(meta),
            remote_engine_id=_s(getattr(src, "engine_id", None) or getattr(meta, "remote_engine_id", None)),
            remote_host=_s(getattr(src, "host", None) or getattr(meta, "remote_host", None)),
            local_gpu=_s(getattr(instance, "device_id", None)),
        )
    except Exception:
        logger.debug("railtrace vllm: no scope", exc_info=True)
        return wrapped(*args, **kwargs)
    with scope:
        return wrapped(*args, **kwargs)


def _read_blocks(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    """Older layout: `_read_blocks(local_block_ids, remote_block_ids, dst_engine_id, request_id)`."""
    try:
        req_id = kwargs.get("request_id", args[3] if len(args) > 3 else None)
        engine = kwargs.get("dst_engine_id", args[2] if len(args) > 2 else None)
        scope = kv_transfer_scope(_s(req_id), remote_engine_id=_s(engine))
    except Exception:
        return wrapped(*args, **kwargs)
    with scope:
        return wrapped(*args, **kwargs)


def _add_new_req(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    result = wrapped(*args, **kwargs)
    with contextlib.suppress(Exception):
        req_id = kwargs.get("request_id", args[0] if args else None)
        params = kwargs.get("kv_transfer_params", args[2] if len(args) > 2 else None)
        headers = params.get(sc.KV_PARAM_TRACE_HEADERS) if isinstance(params, Mapping) else None
        if isinstance(headers, Mapping):
            for table in ("reqs_to_recv", "reqs_to_save", "reqs_to_send", "reqs_in_batch"):
                meta = (
                    getattr(instance, table, {}).get(req_id)
                    if isinstance(getattr(instance, table, None), dict)
                    else None
                )
                if meta is not None and not isinstance(meta, bool | int | float | str):
                    setattr(meta, _ATTR, dict(headers))
    return result


def _update_state_after_alloc(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    with contextlib.suppress(Exception):
        request = kwargs.get("request", args[0] if args else None)
        params = getattr(request, "kv_transfer_params", None)
        headers = getattr(request, "trace_headers", None)
        if isinstance(params, dict) and headers and sc.KV_PARAM_TRACE_HEADERS not in params:
            params[sc.KV_PARAM_TRACE_HEADERS] = {
                k: v for k, v in dict(headers).items() if k.lower() in ("traceparent", "tracestate")
            }
    return wrapped(*args, **kwargs)


_TARGETS = (
    ("NixlConnectorWorker", "_read_blocks_for_req", _read_blocks_for_req),
    ("NixlConnectorWorker", "_read_blocks", _read_blocks),
    ("NixlConnectorMetadata", "add_new_req", _add_new_req),
    ("NixlConnectorMetadata", "add_new_req_to_recv", _add_new_req),
    ("NixlConnectorScheduler", "update_state_after_alloc", _update_state_after_alloc),
)


def _s(v: Any) -> str | None:
    return None if v is None or v == "" else str(v)


def patch_module(module: Any) -> list[str]:
    """Wrap what exists of the NixlConnector layout in `module`; returns what was wrapped."""
    done = []
    for cls_name, meth, wrapper in _TARGETS:
        cls = getattr(module, cls_name, None)
        if cls is None or not hasattr(cls, meth) or (cls, meth) in _state["patched"]:
            continue
        if meth == "_read_blocks" and hasattr(cls, "_read_blocks_for_req"):
            continue  # newer layout: the per-request method already carries the metadata
        try:
            wrapt.wrap_function_wrapper(cls, meth, wrapper)
            _state["patched"].append((cls, meth))
            done.append(f"{cls_name}.{meth}")
        except Exception:
            logger.debug("railtrace vllm: %s.%s not wrapped", cls_name, meth, exc_info=True)
    if not done:
        logger.info("railtrace vllm: NixlConnector layout not recognised; KV spans keep no request id")
    return done


def install() -> None:
    """Patch vLLM's NixlConnector now if imported, else when it is imported."""
    if _state["installed"]:
        return
    _state["installed"] = True

    def hook(module: Any) -> None:
        if _state["installed"]:
            patch_module(module)

    wrapt.register_post_import_hook(hook, MODULE)


def uninstall() -> None:
    _state["installed"] = False
    for cls, meth in _state["patched"]:
        with contextlib.suppress(Exception):
            unwrap(cls, meth)
    _state["patched"].clear()


def register() -> None:
    """vLLM plugin entry (`vllm.general_plugins`): enable the NIXL shim in every vLLM process."""
    from railtrace_tracing.kv_transfer.instrumentor import NixlKVTransferInstrumentor

    NixlKVTransferInstrumentor().instrument()
