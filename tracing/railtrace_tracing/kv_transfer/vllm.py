"""vLLM NIXL connector integration: put each KV transfer into its request's own trace.

Supported: vLLM 0.11.0 to 0.34.0 (`SUPPORTED`). Every release in that range was read from its PyPI
wheel (`pip download --no-deps vllm==X`); tests/shims/test_vllm_wheels.py checks the releases of
`MATRIX`, one per layout boundary, against their real source. Three layouts:

- **module** (0.11.0 - 0.19.1): `vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py`.
  `NixlConnectorWorker._read_blocks_for_req(req_id, meta)` posts the pull. The metadata API is
  `add_new_req` with a flat `ReqMeta` (`remote_engine_id`, `remote_host`) up to 0.12, then
  `add_new_req_to_recv` / `add_new_req_to_save` with `ReqMeta.remote = RemoteMeta(...)`.
- **package** (0.20.0 - 0.23.0): `.../v1/nixl/`: `worker.NixlConnectorWorker`,
  `connector.NixlConnector`, `metadata.NixlConnectorMetadata`.
- **package, pull and push** (0.24.0 on): `pull_worker.NixlPullConnectorWorker._read_blocks_for_req`
  posts READs on the engine thread; `push_worker.NixlPushConnectorWorker._xfer_blocks_for_req`
  posts WRITEs from the push writer's background thread; `connector.NixlBaseConnector`. The old
  names remain as aliases (`NixlConnectorWorker = NixlPullConnectorWorker`, …).

Each worker method runs its transfers inside `kv_transfer_scope`, a ContextVar set on the thread
that posts them, so the push writer's transfers carry their request like the pull's. The
scheduler side sees the request (`request.trace_headers`, set when vLLM runs with
`--otlp-traces-endpoint`): the connector's `update_state_after_alloc` hook copies the W3C headers
into `kv_transfer_params["trace_headers"]`, and the metadata hook (`add_new_req*`) puts them on
the worker's `ReqMeta`. Without headers the span joins its request by id: the public id (vLLM's
response and logs) and vLLM's internal one (`<public>-<8 hex>` from 0.14).

A method is wrapped once, on the class that defines it (aliases and subclasses share it). A
vLLM whose layout is not recognised is left untouched and named in one warning.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import wrapt

from railtrace_tracing import semconv as sc
from railtrace_tracing._common import logger
from railtrace_tracing.kv_transfer.instrumentor import (
    _SCOPE,
    KIND_EC,
    KIND_KV,
    TransferScope,
    kv_transfer_scope,
)

SUPPORTED = ("0.11.0", "0.34.0")  # oldest and newest release; every release between was read
# The releases CI checks against their wheels: the oldest, each side of every layout change, the newest,
# and 0.21.0, the release llm-d v0.9.0 to HEAD pin.
MATRIX = ("0.11.0", "0.12.0", "0.13.0", "0.19.1", "0.20.0", "0.21.0", "0.23.0", "0.24.0", "0.34.0")
OLD_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector"
PACKAGE = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
_ATTR = "_railtrace_trace_headers"
_SUFFIX = re.compile(r"^(?P<public>.+)-[0-9a-f]{8}$")


@dataclass(frozen=True)
class Target:
    """One method the shim wraps: where it lives and the leading parameters it expects."""

    layout: str  # module | package
    module: str
    cls: str
    method: str
    params: tuple[str, ...]  # leading positional parameters, `self` first
    kind: str  # worker_pull | worker_push | metadata | scheduler
    since: str = ""  # first release that has it (informational; the wheel check proves it)


_REQ = ("self", "req_id", "meta")
_META = ("self", "request_id", "local_block_ids", "kv_transfer_params")
_ALLOC = ("self", "request", "blocks", "num_external_tokens")
_M, _P = OLD_MODULE, PACKAGE
# Alternatives of one kind are for different releases (or aliases of one another): a release has a
# layout when each required kind has at least one target there.
TARGETS: tuple[Target, ...] = (
    Target("module", _M, "NixlConnectorWorker", "_read_blocks_for_req", _REQ, "worker_pull", "0.11.0"),
    Target("module", _M, "NixlConnectorMetadata", "add_new_req", _META, "metadata", "0.11.0"),
    Target("module", _M, "NixlConnectorMetadata", "add_new_req_to_recv", _META, "metadata", "0.13.0"),
    Target("module", _M, "NixlConnectorMetadata", "add_new_req_to_save", _META, "metadata", "0.13.0"),
    Target("module", _M, "NixlConnector", "update_state_after_alloc", _ALLOC, "scheduler", "0.11.0"),
    Target(
        "package",
        _P + ".worker",
        "NixlConnectorWorker",
        "_read_blocks_for_req",
        _REQ,
        "worker_pull",
        "0.20.0",
    ),
    Target(
        "package",
        _P + ".pull_worker",
        "NixlPullConnectorWorker",
        "_read_blocks_for_req",
        _REQ,
        "worker_pull",
        "0.24.0",
    ),
    Target(
        "package",
        _P + ".push_worker",
        "NixlPushConnectorWorker",
        "_xfer_blocks_for_req",
        _REQ,
        "worker_push",
        "0.24.0",
    ),
    Target(
        "package",
        _P + ".metadata",
        "NixlConnectorMetadata",
        "add_new_req_to_recv",
        _META,
        "metadata",
        "0.20.0",
    ),
    Target(
        "package",
        _P + ".metadata",
        "NixlConnectorMetadata",
        "add_new_req_to_save",
        _META,
        "metadata",
        "0.20.0",
    ),
    Target(
        "package",
        _P + ".connector",
        "NixlConnector",
        "update_state_after_alloc",
        _ALLOC,
        "scheduler",
        "0.20.0",
    ),
    Target(
        "package",
        _P + ".connector",
        "NixlBaseConnector",
        "update_state_after_alloc",
        _ALLOC,
        "scheduler",
        "0.24.0",
    ),
)
REQUIRED_KINDS = ("worker_pull", "metadata", "scheduler")  # worker_push: releases with push mode
MODULES = tuple(dict.fromkeys(t.module for t in TARGETS))


def groups(layout: str) -> dict[str, list[Target]]:
    """The targets of `layout` by kind: a release has the layout when each kind has a target
    (the metadata kind has alternatives across releases)."""
    out: dict[str, list[Target]] = {}
    for t in TARGETS:
        if t.layout == layout:
            out.setdefault(t.kind, []).append(t)
    return out


class _State:
    """What this process has patched (one instance; `uninstall()` undoes it)."""

    def __init__(self) -> None:
        self.installed = False
        self.patched: list[tuple[Any, str, Any]] = []  # (class, method, what was there before)
        self.warned = False
        self.strip_suffix: bool | None = None
        self.untraced: set[str] = set()  # creator modules of agents not traced (logged once each)


_STATE = _State()


def vllm_version() -> str:
    mod = sys.modules.get("vllm")
    v = getattr(mod, "__version__", None)
    if v:
        return str(v)
    try:
        from importlib.metadata import version

        return version("vllm")
    except Exception:
        return "unknown"


# Which NIXL agents of a vLLM process are traced, by the module whose code creates the agent
# (`nixl_agent(...)`, vLLM's `NixlWrapper`). Read from the wheels (`pip download --no-deps
# vllm==X`), docs/shims.md "Which NIXL agents are traced" has the lines per release:
# - the NIXL KV connector, pull and push: `v1/nixl_connector.py` (0.11.0 - 0.19.1), then the
#   `v1/nixl/` package (`worker.py` 0.20.0 - 0.23.0, `base_worker.py` from 0.24.0, the base of
#   the pull and push workers) -> KV spans;
# - the encoder-cache connector of encode/prefill/decode disaggregation
#   (`vllm/distributed/ec_transfer/`, 0.34.0 `ec_connector/cpu/data/nixl.py`) -> EC spans;
# - every other creator in a vLLM process -- expert-parallel load balancing
#   (`vllm/distributed/eplb/eplb_communicator.py`, 0.21.0 and 0.34.0), the KV-offload tiers
#   (`vllm/v1/kv_offload/tiering/obj/manager.py`, `.../p2p/data/nixl.py`, 0.34.0), libraries
#   such as Ray's NIXL transport or KVCR -> not traced: their transfers serve no request.
# Outside vLLM (no `vllm` module loaded) every agent is traced as a KV agent (the shim's API).
EC_PACKAGE = "vllm.distributed.ec_transfer"


def agent_kind(creator: str | None) -> str | None:
    """What an agent's transfers are, from the module that created it: `KIND_KV`, `KIND_EC`,
    or None (not traced). Logs once per untraced vLLM module, naming it."""
    if "vllm" not in sys.modules:
        return KIND_KV
    name = creator or ""
    if name == OLD_MODULE or name.startswith(PACKAGE + "."):
        return KIND_KV
    if name == EC_PACKAGE or name.startswith(EC_PACKAGE + "."):
        return KIND_EC
    if name not in _STATE.untraced:
        _STATE.untraced.add(name)
        logger.info(
            "railtrace: the NIXL agent created by %s is not vLLM's NIXL KV connector (vLLM %s); "
            "its transfers are not traced",
            name or "an unknown caller",
            vllm_version(),
        )
    return None


def _adds_suffix() -> bool:
    """Whether this vLLM appends `-<8 hex>` to the public request id inside the engine: read once
    from vLLM's own input processor source (no import; the worker process may not have it)."""
    if _STATE.strip_suffix is None:
        found = False
        for name in ("vllm.v1.engine.input_processor", "vllm.v1.engine.processor"):
            with contextlib.suppress(Exception):
                spec = importlib.util.find_spec(name)
                if spec is not None and spec.origin:
                    with open(spec.origin, encoding="utf-8") as fh:
                        text = fh.read()
                    if "external_req_id" in text and "random_uuid():.8" in text:
                        found = True
                        break
        _STATE.strip_suffix = found
    return _STATE.strip_suffix


def public_request_id(internal: str | None) -> str | None:
    """vLLM's public request id for its internal one (equal where vLLM adds no suffix)."""
    if internal is None:
        return None
    if _adds_suffix():
        m = _SUFFIX.match(internal)
        if m:
            return m["public"]
    return internal


def _headers_of(meta: Any) -> Mapping[str, Any] | None:
    h = getattr(meta, _ATTR, None)
    if isinstance(h, Mapping):
        return h
    params = getattr(meta, "kv_transfer_params", None)
    if isinstance(params, Mapping) and isinstance(params.get(sc.KV_PARAM_TRACE_HEADERS), Mapping):
        return params[sc.KV_PARAM_TRACE_HEADERS]
    return None


def _s(v: Any) -> str | None:
    return None if v is None or v == "" else str(v)


def _scope_for(instance: Any, req_id: Any, meta: Any, mode: str) -> Any:
    remote = getattr(meta, "remote", None)  # package layout: ReqMeta.remote = RemoteMeta(...)
    src = remote if remote is not None else meta
    internal = _s(req_id)
    scope = kv_transfer_scope(
        public_request_id(internal),
        trace_headers=_headers_of(meta),
        remote_engine_id=_s(getattr(src, "engine_id", None) or getattr(meta, "remote_engine_id", None)),
        remote_host=_s(getattr(src, "host", None) or getattr(meta, "remote_host", None)),
        local_gpu=_s(getattr(instance, "device_id", None)),
    )
    attrs = scope.scope.attributes
    attrs[sc.KV_MODE] = mode
    if internal is not None:
        attrs[sc.KV_VLLM_REQUEST_ID] = internal
    remote_req = _s(getattr(remote, "request_id", None)) if remote is not None else None
    if remote_req is not None:
        attrs[sc.KV_REMOTE_REQUEST_ID] = remote_req
    return scope


class _LazyScope:
    """The request of the transfers posted inside a worker method, noted by reference on vLLM's
    thread and turned into a `TransferScope` (ids, peer, trace context) on the shim's emitter."""

    __slots__ = ("_done", "args", "instance", "kwargs", "mode")

    def __init__(self, instance: Any, args: Any, kwargs: Any, mode: str) -> None:
        self.instance, self.args, self.kwargs, self.mode = instance, args, kwargs, mode
        self._done: TransferScope | None = None

    def resolve(self) -> TransferScope:
        if self._done is None:
            args, kwargs = self.args, self.kwargs
            try:
                req_id = kwargs.get("req_id", args[0] if args else None)
                meta = kwargs.get("meta", args[1] if len(args) > 1 else None)
                self._done = _scope_for(self.instance, req_id, meta, self.mode).scope
            except Exception:
                logger.debug("railtrace vllm: request not readable", exc_info=True)
                self._done = TransferScope(attributes={sc.KV_MODE: self.mode})
        return self._done


def _worker(mode: str) -> Any:
    """Patch maker for a worker method: the patch sets the request for the transfers the method
    posts (on this thread, so the push writer's thread carries its own) and reads nothing of vLLM's
    objects here. A plain function, not a wrapt proxy: this runs per request on the engine thread."""
    scope_var = _SCOPE

    def make(original: Any) -> Any:
        def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
            token = scope_var.set(_LazyScope(self, args, kwargs, mode))
            try:
                return original(self, *args, **kwargs)
            finally:
                scope_var.reset(token)

        patched.__wrapped__ = original  # type: ignore[attr-defined]
        patched.__name__ = getattr(original, "__name__", "patched")
        patched.__qualname__ = getattr(original, "__qualname__", patched.__name__)
        patched.__doc__ = getattr(original, "__doc__", None)
        return patched

    make.plain = True  # type: ignore[attr-defined]
    return make


def _add_new_req(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    result = wrapped(*args, **kwargs)
    with contextlib.suppress(Exception):
        req_id = kwargs.get("request_id", args[0] if args else None)
        params = kwargs.get("kv_transfer_params", args[2] if len(args) > 2 else None)
        headers = params.get(sc.KV_PARAM_TRACE_HEADERS) if isinstance(params, Mapping) else None
        if isinstance(headers, Mapping):
            for table in ("reqs_to_recv", "reqs_to_save"):
                reqs = getattr(instance, table, None)
                meta = reqs.get(req_id) if isinstance(reqs, dict) else None
                if meta is not None and hasattr(meta, "__dict__"):
                    setattr(meta, _ATTR, dict(headers))
    return result


def _update_state_after_alloc(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    with contextlib.suppress(Exception):
        request = kwargs.get("request", args[0] if args else None)
        params = getattr(request, "kv_transfer_params", None)
        headers = getattr(request, "trace_headers", None)
        if isinstance(params, dict) and headers and sc.KV_PARAM_TRACE_HEADERS not in params:
            carried = {k: v for k, v in dict(headers).items() if k.lower() in ("traceparent", "tracestate")}
            if carried:
                params[sc.KV_PARAM_TRACE_HEADERS] = carried
    return wrapped(*args, **kwargs)


_WRAPPERS = {
    "worker_pull": _worker("pull"),
    "worker_push": _worker("push"),
    "metadata": _add_new_req,
    "scheduler": _update_state_after_alloc,
}


def check_signature(func: Any, target: Target) -> bool:
    """True when `func`'s leading parameters are the ones the wrapper reads."""
    import inspect

    try:
        names = tuple(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return False
    return names[: len(target.params)] == target.params


def patch_module(module: Any) -> list[str]:
    """Wrap the targets that live in `module`; returns what was wrapped. A target whose class or
    signature is not what the shim expects is left alone and named in one warning."""
    done: list[str] = []
    found: dict[str, bool] = {}
    wanted: dict[str, list[str]] = {}
    for target in TARGETS:
        if target.module != module.__name__:
            continue
        found.setdefault(target.kind, False)
        wanted.setdefault(target.kind, []).append(f"{target.cls}.{target.method}")
        cls = getattr(module, target.cls, None)
        func = getattr(cls, target.method, None) if cls is not None else None
        if func is None or not check_signature(func, target):
            continue
        found[target.kind] = True
        # Wrap where the method is defined: an alias or subclass must not wrap it a second time.
        cls = next((c for c in cls.__mro__ if target.method in c.__dict__), cls)
        if any(c is cls and m == target.method for c, m, _ in _STATE.patched):
            continue
        try:
            wrapper = _WRAPPERS[target.kind]
            original = cls.__dict__[target.method]
            if getattr(wrapper, "plain", False):
                setattr(cls, target.method, wrapper(original))
            else:
                wrapt.wrap_function_wrapper(cls, target.method, wrapper)
            _STATE.patched.append((cls, target.method, original))
            done.append(f"{target.cls}.{target.method}")
        except Exception:
            found[target.kind] = False
    missing = [" or ".join(wanted[kind]) for kind, ok in found.items() if not ok and kind in REQUIRED_KINDS]
    if missing:
        warn_unknown_layout(f"{module.__name__} lacks {', '.join(missing)}")
    return done


def warn_unknown_layout(detail: str) -> None:
    """One warning per process naming the vLLM version whose NIXL connector the shim cannot hook."""
    if _STATE.warned:
        return
    _STATE.warned = True
    logger.warning(
        "railtrace: vLLM %s has a NIXL connector layout the KV shim does not know (%s); KV spans "
        "carry no request id. Supported: vLLM %s to %s.",
        vllm_version(),
        detail,
        *SUPPORTED,
    )


def check_layout_used() -> None:
    """Called when a NIXL agent is created: inside vLLM, no hooked connector means an unknown layout."""
    if _STATE.installed and not _STATE.patched and "vllm" in sys.modules:
        watched = [m for m in MODULES if m in sys.modules]
        warn_unknown_layout("none of " + ", ".join(MODULES) + " was imported" if not watched else "no target")


def install() -> None:
    """Patch vLLM's NIXL connector modules now if imported, else when they are (never imports them)."""
    if _STATE.installed:
        return
    _STATE.installed = True

    def hook(module: Any) -> None:
        if _STATE.installed:
            try:
                patch_module(module)
            except Exception:
                logger.debug("railtrace vllm: patch failed", exc_info=True)

    for name in MODULES:
        wrapt.register_post_import_hook(hook, name)


def uninstall() -> None:
    _STATE.installed = False
    for cls, meth, original in _STATE.patched:
        with contextlib.suppress(Exception):
            setattr(cls, meth, original)
    _STATE.patched.clear()
    _STATE.warned = False
    _STATE.untraced.clear()


def register() -> None:
    """vLLM plugin entry (`vllm.general_plugins`), run in every vLLM process.

    Inert unless `RAILTRACE_SHIMS` names the KV shim (`nixl`, `kv`, `vllm` or `all`): then it
    registers import hooks only. It imports neither `nixl` nor vLLM's connector and sets no
    environment variable here; UCX's log settings are applied when the first NIXL agent is made.
    """
    from railtrace_tracing._common import enabled_shims

    if not (enabled_shims() & sc.KV_SHIM_NAMES):
        return
    from railtrace_tracing.kv_transfer.instrumentor import NixlKVTransferInstrumentor

    inst = NixlKVTransferInstrumentor()
    if not inst.is_instrumented_by_opentelemetry:  # opentelemetry-instrument may have done it
        inst.instrument(from_plugin=True)
