"""`NixlKVTransferInstrumentor`: one `llm_d.kv_transfer` span per NIXL transfer.

Wraps `nixl_agent` (nixl / nixl_cu12 / nixl_cu13 `_api`) with wrapt: `initialize_xfer` and
`make_prepped_xfer` note what a handle will move, `transfer` opens the span at post time,
`check_xfer_state` ends it when it reports DONE or ERR, `release_xfer_handle` ends a span
still open. Transport and devices come from UCX's own log (see `ucx_capture`).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import wrapt
from opentelemetry import context as otel_context
from opentelemetry.instrumentation.utils import unwrap

from railtrace_tracing import semconv as sc
from railtrace_tracing._common import GatedInstrumentor, extract_context, logger
from railtrace_tracing.kv_transfer.recorder import descriptor_bytes, emit_kv_transfer
from railtrace_tracing.kv_transfer.ucx_capture import UcxLogCapture

NIXL_MODULES = ("nixl._api", "nixl_cu12._api", "nixl_cu13._api")
_METHODS = (
    "__init__",
    "prep_xfer_dlist",
    "initialize_xfer",
    "make_prepped_xfer",
    "transfer",
    "check_xfer_state",
    "release_xfer_handle",
)


@dataclass
class TransferScope:
    """Per-request facts for the transfers posted inside `kv_transfer_scope`."""

    request_id: str | None = None
    remote_engine_id: str | None = None
    remote_host: str | None = None
    local_gpu: str | None = None
    parent: otel_context.Context | None = None
    attributes: dict[str, Any] = field(default_factory=dict)


_SCOPE: contextvars.ContextVar[TransferScope | None] = contextvars.ContextVar(
    "railtrace_kv_scope", default=None
)


@contextlib.contextmanager
def kv_transfer_scope(
    request_id: str | None = None,
    *,
    kv_transfer_params: Mapping[str, Any] | None = None,
    trace_headers: Mapping[str, Any] | None = None,
    remote_engine_id: str | None = None,
    remote_host: str | None = None,
    local_gpu: str | None = None,
) -> Iterator[TransferScope]:
    """Attach request id, peer and trace context to every NIXL transfer posted inside the block.

    The parent is the W3C context in `trace_headers`, else in `kv_transfer_params`
    (`traceparent` or `trace_headers`), else the current one. Never raises.
    """
    scope = TransferScope(request_id=request_id, local_gpu=local_gpu)
    try:
        params = kv_transfer_params or {}
        scope.remote_engine_id = remote_engine_id or _str(params.get(sc.KV_PARAM_REMOTE_ENGINE_ID))
        scope.remote_host = remote_host or _str(params.get(sc.KV_PARAM_REMOTE_HOST))
        for carrier in (trace_headers, params, params.get(sc.KV_PARAM_TRACE_HEADERS)):
            if isinstance(carrier, Mapping):
                ctx = extract_context(carrier)
                if ctx is not None:
                    scope.parent = ctx
                    break
    except Exception:
        logger.debug("railtrace: kv_transfer_scope", exc_info=True)
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def _str(v: Any) -> str | None:
    return None if v is None or v == "" else str(v)


@dataclass
class _Pending:
    handle: Any
    agent: str
    operation: str
    bytes: int | None
    descriptors: int | None
    remote_agent: str | None
    scope: TransferScope | None = None
    posted_ns: int | None = None  # set by transfer(); None when no transfer is in flight
    descs: Any = None  # descriptor list whose lengths give bytes/descriptors
    parent: otel_context.Context | None = None


class NixlKVTransferInstrumentor(GatedInstrumentor):
    """OpenTelemetry instrumentor for NIXL transfers (entry point `railtrace_nixl`).

    `instrument(tracer_provider=None, capture_ucx_log=True, ucx_log_path=None, evidence_grace_s=1.0,
    background_emit=True, vllm_hook=True)`. Call it before the first `nixl_agent` is created so that
    UCX logs where the shim reads. The transfer's own thread only notes post and completion times;
    a background thread looks up the evidence and emits the span with those times (waiting up to
    `evidence_grace_s` for UCX to write the table). `force_flush()` waits for pending spans.
    """

    shim_name = "nixl"

    def __init__(self) -> None:
        if getattr(self, "_railtrace_init", False):  # BaseInstrumentor is a singleton
            return
        self._railtrace_init = True
        super().__init__()
        self.capture = UcxLogCapture()
        self._tracer_provider: Any = None
        self._pending: dict[int, _Pending] = {}
        self._dlists: dict[int, tuple[Any, list[int]]] = {}
        self._telemetry_agents: set[int] = set()
        self._lock = threading.Lock()
        self._patched: list[Any] = []
        self._active = False
        self._deferred: list[tuple[tuple[Any, ...], float]] = []
        self._worker: threading.Thread | None = None
        self._wake = threading.Event()
        self._inflight = 0
        self._grace_s = 1.0
        self._async = True

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()  # nixl ships as nixl, nixl-cu12 or nixl-cu13; checked at import time instead

    # -- lifecycle ----------------------------------------------------------------------
    def _instrument(self, **kwargs: Any) -> None:
        self._tracer_provider = kwargs.get("tracer_provider")
        self._active = True
        self._grace_s = float(kwargs.get("evidence_grace_s", 1.0))
        self._async = bool(kwargs.get("background_emit", True))
        if kwargs.get("capture_ucx_log", True):
            self.capture = UcxLogCapture(kwargs.get("ucx_log_path"))
            self.capture.configure()
        for modname in NIXL_MODULES:
            self._patch_when_imported(modname)
        if kwargs.get("vllm_hook", True):
            from railtrace_tracing.kv_transfer import vllm as vllm_hook

            vllm_hook.install()

    def _patch_when_imported(self, modname: str) -> None:
        def hook(module: Any) -> None:
            cls = getattr(module, "nixl_agent", None)
            if cls is None or cls in self._patched or not self._active:
                return
            for name in _METHODS:
                wrapt.wrap_function_wrapper(cls, name, getattr(self, "_w_" + name.strip("_")))
            self._patched.append(cls)

        try:
            module = importlib.import_module(modname)
        except Exception:
            wrapt.register_post_import_hook(hook, modname)
            return
        hook(module)

    def _uninstrument(self, **kwargs: Any) -> None:
        from railtrace_tracing.kv_transfer import vllm as vllm_hook

        vllm_hook.uninstall()
        self._active = False
        for cls in self._patched:
            for name in _METHODS:
                unwrap(cls, name)
        self._patched.clear()
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
            self._dlists.clear()
        self.flush_deferred(final=True)
        del pending  # transfers in flight at uninstrument() are not reported

    # -- wrappers -------------------------------------------------------------------------
    def _w_init(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        result = wrapped(*args, **kwargs)
        try:
            conf = kwargs.get("nixl_conf", args[1] if len(args) > 1 else None)
            env_on = os.environ.get("NIXL_TELEMETRY_ENABLE", "").lower() in ("y", "yes", "1", "true", "on")
            if (conf is not None and getattr(conf, "capture_telemetry", False)) or env_on:
                self._telemetry_agents.add(id(instance))
        except Exception:
            pass
        return result

    def _w_prep_xfer_dlist(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        handle = wrapped(*args, **kwargs)
        try:
            xfer_list = kwargs.get("xfer_list", args[1] if len(args) > 1 else None)
            lens = _lengths(xfer_list)
            if lens is not None:
                with self._lock:
                    self._dlists[id(handle)] = (handle, lens)
        except Exception:
            pass
        return handle

    def _w_initialize_xfer(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        handle = wrapped(*args, **kwargs)
        try:
            op = kwargs.get("operation", args[0] if args else "")
            local = kwargs.get("local_descs", args[1] if len(args) > 1 else None)
            remote_agent = kwargs.get("remote_agent", args[3] if len(args) > 3 else None)
            self._remember(instance, handle, op, None, None, remote_agent)
            self._pending[id(handle)].descs = local  # summed off the transfer's thread
        except Exception:
            logger.debug("railtrace: initialize_xfer", exc_info=True)
        return handle

    def _w_make_prepped_xfer(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        handle = wrapped(*args, **kwargs)
        try:
            op = kwargs.get("operation", args[0] if args else "")
            side = kwargs.get("local_xfer_side", args[1] if len(args) > 1 else None)
            indices = kwargs.get("local_indices", args[2] if len(args) > 2 else None)
            ndesc = len(indices) if indices is not None else None
            nbytes = None
            with self._lock:
                known = self._dlists.get(id(side))
            if known is not None and indices is not None:
                lens = known[1]
                nbytes = sum(lens[int(i)] for i in indices)
            self._remember(instance, handle, op, nbytes, ndesc, None)
        except Exception:
            logger.debug("railtrace: make_prepped_xfer", exc_info=True)
        return handle

    def _remember(self, agent: Any, handle: Any, op: str, nbytes: Any, ndesc: Any, remote: Any) -> None:
        p = _Pending(handle, str(getattr(agent, "name", "")), _op(op), nbytes, ndesc, _str(remote))
        self._pending[id(handle)] = p  # dict assignment is atomic under the GIL

    def _w_transfer(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        start = time.time_ns()
        state = wrapped(*args, **kwargs)
        try:
            handle = kwargs.get("handle", args[0] if args else None)
            p = self._pending.get(id(handle))
            if p is None:
                p = _Pending(handle, str(getattr(instance, "name", "")), "", None, None, None)
                self._pending[id(handle)] = p
            if p.posted_ns is not None:  # re-post of the same handle: the previous transfer is over
                self._finish(instance, p, None)
            scope = _SCOPE.get()
            p.scope = scope
            p.parent = (
                scope.parent if scope is not None and scope.parent is not None else otel_context.get_current()
            )
            p.posted_ns = start
            if state in ("DONE", "ERR"):  # small transfers can complete inside the post
                self._finish(instance, p, state)
        except Exception:
            logger.debug("railtrace: transfer", exc_info=True)
        return state

    def _w_check_xfer_state(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        state = wrapped(*args, **kwargs)
        if state == "DONE" or state == "ERR":
            try:
                handle = kwargs.get("handle", args[0] if args else None)
                p = self._pending.get(id(handle))
                if p is not None and p.posted_ns is not None:
                    self._finish(instance, p, state)
            except Exception:
                logger.debug("railtrace: check_xfer_state", exc_info=True)
        return state

    def _w_release_xfer_handle(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        try:
            handle = kwargs.get("handle", args[0] if args else None)
            with self._lock:
                p = self._pending.pop(id(handle), None)
            if p is not None and p.posted_ns is not None:
                self._finish(instance, p, "RELEASED")
        except Exception:
            logger.debug("railtrace: release_xfer_handle", exc_info=True)
        return wrapped(*args, **kwargs)

    # -- completion -----------------------------------------------------------------------
    def _finish(self, agent: Any, p: _Pending, state: str | None) -> None:
        """Note completion on the transfer's thread; the span is built once, later, from a snapshot."""
        if p.posted_ns is None:
            return
        start, p.posted_ns = p.posted_ns, None
        end = time.time_ns()
        nbytes, ndesc, extra = p.bytes, p.descriptors, None
        if id(agent) in self._telemetry_agents and state == "DONE":  # the handle must still be live
            nbytes, ndesc, extra = self._telemetry(agent, p, nbytes, ndesc)
        snap = (
            p.scope,
            p.parent,
            start,
            end,
            state,
            p.agent,
            p.operation,
            nbytes,
            ndesc,
            p.descs,
            p.remote_agent,
            extra,
        )
        item = (snap, time.monotonic() + self._grace_s)
        if self._async:
            with self._lock:
                self._deferred.append(item)
                backlog = len(self._deferred)
            if self._worker is None:
                self._ensure_worker()
            if backlog >= 256:  # otherwise the emitter wakes on its own timer, batching
                self._wake.set()
            return
        ev = self.capture.evidence(p.agent or None, p.operation or None)
        if ev is None and self.capture.configured and self._grace_s > 0:
            # UCX may not have flushed the table yet: emit later, with the real end time.
            with self._lock:
                self._deferred.append(item)
            self._ensure_worker()
            return
        self._emit(snap, ev)

    def _emit(self, snap: tuple[Any, ...], ev: Any) -> None:
        scope, parent, start, end, state, _agent, op, nbytes, ndesc, descs, remote_agent, extra = snap
        if nbytes is None and descs is not None:
            nbytes, ndesc = descriptor_bytes(descs)
        error = {"ERR": "nixl_xfer_err", "RELEASED": "released_before_done"}.get(state or "")
        attrs = {**(scope.attributes if scope else {}), **(extra or {})}
        emit_kv_transfer(
            tracer_provider=self._tracer_provider,
            operation=op or "unknown",
            request_id=scope.request_id if scope else None,
            bytes=nbytes,
            descriptors=ndesc,
            local_gpu=scope.local_gpu if scope else None,
            remote_host=scope.remote_host if scope else None,
            remote_engine_id=(scope.remote_engine_id if scope else None) or remote_agent,
            parent=parent,
            start_time_ns=start,
            end_time_ns=end,
            error_type=error,
            evidence=ev,
            attributes=attrs or None,
        )

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            with self._lock:
                if self._worker is None or not self._worker.is_alive():
                    self._worker = threading.Thread(target=self._work, name="railtrace-kv", daemon=True)
                    self._worker.start()

    def _work(self) -> None:
        """Background emitter: evidence lookup and span creation off the transfer's thread."""
        while True:
            self._wake.wait(0.05)
            self._wake.clear()
            try:
                self.flush_deferred(final=False)
            except Exception:
                logger.debug("railtrace: kv emitter", exc_info=True)

    def flush_deferred(self, final: bool = True) -> int:
        """Emit pending spans whose evidence has arrived (all of them when `final`, or whose grace
        has passed); returns how many are still waiting."""
        with self._lock:
            items, self._deferred = self._deferred, []
            self._inflight += len(items)
        keep = []
        now = time.monotonic()
        if items and self.capture.configured:
            self.capture.poll()  # once per batch
        for item in items:
            snap, deadline = item
            try:
                ev = (
                    self.capture.evidence(snap[5] or None, snap[6] or None, poll=False)
                    if self.capture.configured
                    else None
                )
                if ev is not None or final or now >= deadline or not self.capture.configured:
                    self._emit(snap, ev)
                else:
                    keep.append(item)
            except Exception:
                logger.debug("railtrace: kv span dropped", exc_info=True)
        with self._lock:
            self._deferred.extend(keep)
            self._inflight -= len(items)
            return len(self._deferred)

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every finished transfer's span is emitted (evidence or grace); True if all were."""
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        while time.monotonic() < deadline:
            if self.flush_deferred(final=False) == 0 and self._inflight == 0:
                return True
            time.sleep(0.01)
        self.flush_deferred(final=True)
        return self._inflight == 0

    def _telemetry(self, agent: Any, p: _Pending, nbytes: Any, ndesc: Any) -> tuple[Any, Any, dict[str, Any]]:
        """NIXL's own numbers when telemetry is on (bytes, descriptors, post and transfer time)."""
        extra: dict[str, Any] = {}
        try:
            tel = agent.get_xfer_telemetry(p.handle)
            if getattr(tel, "totalBytes", None) is not None:
                nbytes = int(tel.totalBytes)
            if getattr(tel, "descCount", None) is not None:
                ndesc = int(tel.descCount)
            if getattr(tel, "postDuration", None) is not None:
                extra[sc.KV_POST_DURATION_S] = float(tel.postDuration) / 1e6
            if getattr(tel, "xferDuration", None) is not None:
                extra[sc.KV_XFER_DURATION_S] = float(tel.xferDuration) / 1e6
        except Exception:
            logger.debug("railtrace: no NIXL telemetry", exc_info=True)
        return nbytes, ndesc, extra


def _op(op: Any) -> str:
    return str(op or "").strip().lower()


def _lengths(xfer_list: Any) -> list[int] | None:
    if xfer_list is None:
        return None
    if hasattr(xfer_list, "descCount"):
        return [int(xfer_list[i][1]) for i in range(xfer_list.descCount())]
    if hasattr(xfer_list, "shape") and len(xfer_list.shape) == 2:
        return [int(x) for x in xfer_list[:, 1]]
    return [int(d[1]) for d in xfer_list]
