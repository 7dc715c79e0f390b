"""`NixlKVTransferInstrumentor`: one `llm_d.kv_transfer` span per NIXL transfer of a KV connector.

Each agent is classified when it is created, by the module creating it (`vllm.agent_kind`): in
a vLLM process only the NIXL KV connector's agents give `llm_d.kv_transfer`, the encoder-cache
connector's give `llm_d.ec_transfer`, and the others (EPLB, KV offload) no span; the emitter
reads that mark, the per-transfer patches do not.

Patches `nixl_agent` (nixl / nixl_cu12 / nixl_cu13 / nixl_rocm `_api`): `initialize_xfer` and
`make_prepped_xfer` make the handle's record (what it will move), `transfer` notes the post
time, the request's scope and the trace context (by reference), `transfer` or
`check_xfer_state` note the end when NIXL reports DONE or ERR, `get_xfer_telemetry` keeps the
telemetry the caller reads (vLLM does, after DONE), `release_xfer_handle` reads it if nobody did
and ends a transfer still open. Transport and devices come from UCX's own log (`ucx_capture`).

The five per-transfer patches have a C twin (`_hotpath.c`, used where it is built) that takes
the common call and hands every other one to the Python patch here.

The transfer's own thread (vLLM's engine thread) only fills in the record by reference: with
`cma` the copy runs on that thread and evicts its caches, and each object the shim touches
afterwards is fetched again, so the patches touch as few as they can (plain functions, a list
indexed by literal positions, reached through the handle NIXL's own call has just read; flags on
the agent, not in a set). The emitter thread takes the records once they end and
does everything else: reading the request and trace context, bytes, UCX evidence, the span.
"""

from __future__ import annotations

import collections
import contextvars
import os
import sys
import threading
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import wrapt
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind, Status, StatusCode

from railtrace_tracing import semconv as sc
from railtrace_tracing._common import GatedInstrumentor, extract_context, get_tracer, logger
from railtrace_tracing.kv_transfer.recorder import (
    TRACER_NAME,
    StridedDescriptors,
    cached_evidence_attributes,
    descriptor_bytes,
    is_strided,
)
from railtrace_tracing.kv_transfer.ucx_capture import UcxLogCapture

# What an agent's transfers are, noted at its creation (`vllm.agent_kind`); None: not traced.
KIND_KV = "kv"  # a KV connector's agent (or any agent outside vLLM): `llm_d.kv_transfer`
KIND_EC = "ec"  # vLLM's encoder-cache connector: `llm_d.ec_transfer`
_SPAN_BY_KIND = {KIND_KV: sc.SPAN_KV_TRANSFER, KIND_EC: sc.SPAN_EC_TRANSFER}
# Modules skipped when looking for the code that creates an agent: NIXL's (`nixl`, `nixl_cu12`,
# `nixl_rocm`, ...), the shim's and wrapt's.
_NIXL_PREFIX = "nixl"
_PASS_THROUGH = ("railtrace_tracing.kv_transfer", "wrapt")

# The modules whose `nixl_agent` the shim patches. NIXL's meta package `nixl` (nixl 1.5.1,
# `nixl/__init__.py` l.23-55) imports `nixl_cu<major>` for the CUDA it detects, else the first
# of `nixl_cu13`, `nixl_cu12`, `nixl_rocm` that imports, and aliases its `_api` as `nixl._api`;
# vLLM imports `nixl_rocm._api` itself on ROCm (vllm/distributed/nixl_utils.py l.40-48, 0.34.0).
NIXL_MODULES = ("nixl._api", "nixl_cu12._api", "nixl_cu13._api", "nixl_rocm._api")
# Packages whose import means NIXL is loaded: once one is, a shim that patched nothing says so.
NIXL_PACKAGES = ("nixl", "nixl_cu12", "nixl_cu13", "nixl_rocm")
_METHODS = (
    "__init__",
    "add_remote_agent",
    "prep_xfer_dlist",
    "initialize_xfer",
    "make_prepped_xfer",
    "transfer",
    "check_xfer_state",
    "get_xfer_telemetry",
    "release_xfer_handle",
)
_PATCH_MARK = "__railtrace_original__"
_time_ns = time.time_ns
_ERRORS = {"ERR": "nixl_xfer_err", "RELEASED": "released_before_done"}
_EXC = "EXC:"  # state prefix of a transfer whose post or poll raised: "EXC:<exception class>"
try:  # optional: built from _hotpath.c where the install had a compiler (see tracing/pyproject.toml)
    from railtrace_tracing.kv_transfer import _hotpath

    _HOTPATH_ERROR = ""
    # The patches it has in C (the calls of every transfer); the others stay Python.
    _HOT_METHODS: tuple[str, ...] = _hotpath.METHODS
except ImportError as exc:  # pragma: no cover - depends on the install
    _hotpath = None
    _HOTPATH_ERROR = str(exc)
    _HOT_METHODS = ()
try:  # vectorised byte sums for prepped transfers (vLLM passes numpy index arrays)
    import numpy as _np
except Exception:  # pragma: no cover - numpy is everywhere NIXL is
    _np = None


@dataclass
class TransferScope:
    """Per-request facts for the transfers posted inside `kv_transfer_scope`."""

    request_id: str | None = None
    remote_engine_id: str | None = None
    remote_host: str | None = None
    local_gpu: str | None = None
    parent: otel_context.Context | None = None
    attributes: dict[str, Any] = field(default_factory=dict)


_SCOPE: contextvars.ContextVar[Any] = contextvars.ContextVar("railtrace_kv_scope", default=None)


class _ScopeBlock:
    """The context manager `kv_transfer_scope` returns (a class: cheaper than a generator)."""

    __slots__ = ("_tokens", "scope")

    def __init__(self, scope: TransferScope) -> None:
        self.scope = scope
        self._tokens: list[contextvars.Token[TransferScope | None]] = []

    def __enter__(self) -> TransferScope:
        self._tokens.append(_SCOPE.set(self.scope))
        return self.scope

    def __exit__(self, *exc: object) -> None:
        _SCOPE.reset(self._tokens.pop())


def kv_transfer_scope(
    request_id: str | None = None,
    *,
    kv_transfer_params: Mapping[str, Any] | None = None,
    trace_headers: Mapping[str, Any] | None = None,
    remote_engine_id: str | None = None,
    remote_host: str | None = None,
    local_gpu: str | None = None,
) -> _ScopeBlock:
    """Attach request id, peer and trace context to every NIXL transfer posted inside the block.

    `with kv_transfer_scope(...) as scope:`. The parent is the W3C context in `trace_headers`,
    else in `kv_transfer_params` (`traceparent` or `trace_headers`), else the current one.
    Never raises.
    """
    scope = TransferScope(request_id=request_id, local_gpu=local_gpu)
    try:
        scope.remote_engine_id = remote_engine_id
        scope.remote_host = remote_host
        if kv_transfer_params:
            params = kv_transfer_params
            if not remote_engine_id:
                scope.remote_engine_id = _str(params.get(sc.KV_PARAM_REMOTE_ENGINE_ID))
            if not remote_host:
                scope.remote_host = _str(params.get(sc.KV_PARAM_REMOTE_HOST))
            carriers: tuple[Any, ...] = (trace_headers, params, params.get(sc.KV_PARAM_TRACE_HEADERS))
        else:
            carriers = (trace_headers,)
        for carrier in carriers:
            if carrier and isinstance(carrier, Mapping):
                ctx = extract_context(carrier)
                if ctx is not None:
                    scope.parent = ctx
                    break
    except Exception:
        logger.debug("railtrace: kv_transfer_scope", exc_info=True)
    return _ScopeBlock(scope)


def _str(v: Any) -> str | None:
    return None if v is None or v == "" else str(v)


# What a handle will move, noted at initialize_xfer / make_prepped_xfer (converted later, on the
# emitter's thread): (handle, agent name, operation as passed, bytes, descriptors, remote agent,
# descriptor list whose lengths give bytes and descriptors).
_Handle = tuple[Any, Any, Any, Any, Any, Any, Any]
# A handle's record, made when the handle is (initialize_xfer / make_prepped_xfer), filled in by
# the post and by the patches that see it end; a re-post starts a new one:
# [0 post time, 1 the posting thread's request scope (or None), 2 its OpenTelemetry context,
#  3 the call that made the handle (raw), 4 agent, 5 state, 6 end time,
#  7 NIXL telemetry, 8 closed: nothing more will be learned (telemetry kept, handle released, or
#  an agent without telemetry)]. A list indexed by literal positions: after a `cma` copy a store
#  into it is the cheapest thing a patch can do (no name lookups). It lives on the handle (the
#  slot `_railtrace_record` of the shim's subclass of NIXL's handle class) or, for handles of
#  another class, in `_handles` by id.
_Record = list[Any]
_RECORD_LEN = 9  # REC_LEN in _hotpath.c


class NixlKVTransferInstrumentor(GatedInstrumentor):
    """OpenTelemetry instrumentor for NIXL transfers (entry point `railtrace_nixl`).

    `instrument(tracer_provider=None, capture_ucx_log=True, ucx_log_path=None, evidence_grace_s=1.0,
    background_emit=True, vllm_hook=True, hot_path="auto")`. Call it before the first `nixl_agent`
    is created so that UCX logs where the shim reads. `hot_path`: "auto" patches the per-transfer
    calls with the C type of `_hotpath.c` where it is built, "python" with the Python patches
    below, "c" insists on C. The transfer's own thread only notes post and completion times;
    a background thread looks up the evidence and emits the span with those times (waiting up to
    `evidence_grace_s` for UCX to write the table, and for the release of a handle whose agent
    captures telemetry). `force_flush()` waits for the spans of ended transfers.
    """

    shim_name = "nixl"
    shim_aliases = sc.KV_SHIM_NAMES

    def __init__(self) -> None:
        if getattr(self, "_railtrace_init", False):  # BaseInstrumentor is a singleton
            return
        self._railtrace_init = True
        super().__init__()
        self.capture = UcxLogCapture()
        self._tracer_provider: Any = None
        self._handles: dict[int, _Record] = {}  # handle id → its record (latest post), until released
        self._handle_classes: list[tuple[Any, type, type]] = []  # (module, nixl's class, the shim's)
        self._dlists: dict[int, tuple[Any, Any, str]] = {}  # id → (handle, lengths, agent name)
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._patched: list[Any] = []
        self._active = False
        # Finished transfers, appended by the transfers' threads (deque.append needs no lock)
        # and taken by the emitter; `_waiting` holds those whose UCX evidence is not there yet.
        self._queue: collections.deque[tuple[Any, ...]] = collections.deque()
        self._waiting: list[tuple[Any, ...]] = []
        self._open: list[_Record] = []  # taken from the queue, not ended (or awaiting telemetry)
        self._worker: threading.Thread | None = None
        self._wake = threading.Event()
        self._grace_ns = 1_000_000_000
        self._async = True
        self._capture_wanted = True
        self._ucx_log_path: str | None = None
        self._agents_seen = 0
        self._kv_agents_seen = 0
        self._warned_unpatched = False
        self._hot_path = False
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        """A forked child has no emitter thread and must not re-emit its parent's transfers; it
        starts its own emitter if the parent had one (the patches never check for it)."""
        had_worker = self._worker is not None
        self._worker = None
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._queue.clear()
        self._waiting = []
        self._open = []
        if had_worker and self._active and self._async:
            self._ensure_worker()

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()  # nixl ships as nixl, nixl-cu12 or nixl-cu13; checked at import time instead

    # -- lifecycle ----------------------------------------------------------------------
    def _instrument(self, **kwargs: Any) -> None:
        self._hot_path = _want_hot_path(kwargs.get("hot_path"))  # first: a bad value changes nothing
        self._tracer_provider = kwargs.get("tracer_provider")
        self._active = True
        self._grace_ns = int(float(kwargs.get("evidence_grace_s", 1.0)) * 1e9)
        self._async = bool(kwargs.get("background_emit", True))
        # UCX's log settings are applied when the first NIXL agent is created (UCX reads them
        # then), never at import: vLLM and the operator set their UCX variables first.
        self._capture_wanted = bool(kwargs.get("capture_ucx_log", True))
        self._ucx_log_path = kwargs.get("ucx_log_path")
        for modname in NIXL_MODULES:
            self._patch_when_imported(modname)
        for package in NIXL_PACKAGES:
            if package in sys.modules:
                continue
            wrapt.register_post_import_hook(lambda _module: self._check_patched(), package)
        self._check_patched()
        if self._async and any(m in sys.modules for m in NIXL_MODULES):
            self._ensure_worker()  # agents may exist already; else the first agent starts it
        if kwargs.get("vllm_hook", True):
            from railtrace_tracing.kv_transfer import vllm as vllm_hook

            vllm_hook.install()

    def _patch_when_imported(self, modname: str) -> None:
        def hook(module: Any) -> None:
            cls = getattr(module, "nixl_agent", None)
            if cls is None or cls in self._patched or not self._active:
                self._check_patched()
                return
            base = getattr(module, "nixl_xfer_handle", None)
            traced = _traced_handle_class(base)
            for name in _METHODS:
                original = getattr(cls, name, None)
                if original is None:
                    continue
                patch = getattr(self, "_make_" + name.strip("_"))(original)
                if name in _HOT_METHODS and self._hot_path:
                    patch = self._hot_patch(name, original, patch, traced)
                setattr(patch, _PATCH_MARK, (name in cls.__dict__, original))
                patch.__name__ = getattr(original, "__name__", name)
                patch.__doc__ = getattr(original, "__doc__", None)
                setattr(cls, name, patch)
            self._patched.append(cls)
            if traced is not None:
                module.nixl_xfer_handle = traced
                self._handle_classes.append((module, base, traced))

        # Never import nixl here: importing it early would change what the host (vLLM) decides
        # about UCX. The hook runs at once when the module is already imported.
        module = sys.modules.get(modname)
        if module is not None:
            hook(module)
        else:
            wrapt.register_post_import_hook(hook, modname)

    def _check_patched(self) -> None:
        """One warning when NIXL is loaded but no `nixl_agent` could be patched (a NIXL build
        whose module the shim does not watch, or without `nixl_agent`): no KV span would come."""
        if self._patched or self._warned_unpatched or not self._active:
            return
        loaded = sorted(name for name in sys.modules if name.split(".", 1)[0] in NIXL_PACKAGES)
        if not loaded:
            return
        self._warned_unpatched = True
        logger.warning(
            "railtrace: NIXL is loaded (%s) but the KV shim patched no NIXL module (it patches "
            "nixl_agent in %s); no KV-transfer span will be emitted",
            ", ".join(loaded[:6]),
            ", ".join(NIXL_MODULES),
        )

    def _uninstrument(self, **kwargs: Any) -> None:
        from railtrace_tracing.kv_transfer import vllm as vllm_hook

        vllm_hook.uninstall()
        self._active = False
        for cls in self._patched:
            for name in _METHODS:
                mark = getattr(cls.__dict__.get(name), _PATCH_MARK, None)
                if mark is None:
                    continue  # someone patched over us: leave their patch in place
                own, original = mark
                if own:
                    setattr(cls, name, original)
                else:
                    delattr(cls, name)
        self._patched.clear()
        for module, base, traced in self._handle_classes:
            if getattr(module, "nixl_xfer_handle", None) is traced:
                module.nixl_xfer_handle = base
        self._handle_classes.clear()
        self._handles.clear()
        self._dlists.clear()
        self.flush_deferred(final=True)
        self._open = []  # transfers in flight at uninstrument() are not reported

    # -- patches (run on the host's threads: keep them short) ---------------------------
    def _make_init(self, original: Any) -> Any:
        def __init__(agent: Any, *args: Any, **kwargs: Any) -> None:
            kind: str | None = KIND_KV
            try:
                kind = _agent_kind()
                self._before_first_agent(kind)
            except Exception:
                logger.debug("railtrace: UCX capture setup", exc_info=True)
            original(agent, *args, **kwargs)
            try:
                # Read by the emitter only: the per-transfer patches never look at it.
                agent._railtrace_kind = kind
                conf = kwargs.get("nixl_conf", args[1] if len(args) > 1 else None)
                env = os.environ.get("NIXL_TELEMETRY_ENABLE", "").lower()
                captures = (conf is not None and bool(getattr(conf, "capture_telemetry", False))) or env in (
                    "y",
                    "yes",
                    "1",
                    "true",
                    "on",
                )
                # On the agent, which NIXL's own methods read anyway: a set keyed by id(agent)
                # was one more object fetched per transfer after a large copy.
                agent._railtrace_telemetry = captures
            except Exception:
                pass

        return __init__

    def _before_first_agent(self, kind: str | None = KIND_KV) -> None:
        """Point UCX's info log where the shim reads it, once, just before UCX starts."""
        self._agents_seen += 1
        if kind == KIND_KV:
            self._kv_agents_seen += 1
            if self._kv_agents_seen == 1:
                from railtrace_tracing.kv_transfer import vllm as vllm_hook

                vllm_hook.check_layout_used()
        if self._async:
            self._ensure_worker()  # the emitter: the transfer patches never check for it
        if not self._capture_wanted or self.capture.configured:
            return
        capture = UcxLogCapture(self._ucx_log_path)
        if capture.configure():
            self.capture = capture
            self._ensure_worker()  # also forwards UCX's warnings to stderr

    def _make_add_remote_agent(self, original: Any) -> Any:
        def add_remote_agent(agent: Any, *args: Any, **kwargs: Any) -> Any:
            capture = self.capture
            start = capture.mark() if capture.configured else None
            peer = original(agent, *args, **kwargs)
            if start is not None:
                try:  # UCX prints the endpoint configuration to this peer while connecting
                    capture.note_peer(
                        str(getattr(agent, "name", "")), _peer_name(peer), start, capture.mark()
                    )
                except Exception:
                    logger.debug("railtrace: add_remote_agent", exc_info=True)
            return peer

        return add_remote_agent

    def _make_prep_xfer_dlist(self, original: Any) -> Any:
        def prep_xfer_dlist(agent: Any, *args: Any, **kwargs: Any) -> Any:
            handle = original(agent, *args, **kwargs)
            try:  # once per registration, not per transfer
                if _kind_of(agent) not in _SPAN_BY_KIND:
                    # Not traced: nothing to note. vLLM's EPLB prepares and releases lists per
                    # transfer (eplb_communicator.py l.614-681, 0.34.0); noting them would grow.
                    return handle
                owner = kwargs.get("agent_name", args[0] if args else "")
                lens = _lengths(kwargs.get("xfer_list", args[1] if len(args) > 1 else None))
                if lens is not None and _np is not None and type(lens) is not StridedDescriptors:
                    lens = _np.asarray(lens, dtype=_np.int64)
                self._dlists[id(handle)] = (handle, lens, _peer_name(owner))
            except Exception:
                pass
            return handle

        return prep_xfer_dlist

    def _make_initialize_xfer(self, original: Any) -> Any:
        handles = self._handles

        def initialize_xfer(agent: Any, *args: Any, **kwargs: Any) -> Any:
            handle = original(agent, *args, **kwargs)
            # The call as made; read (operation, descriptors, peer) on the emitter, not here.
            try:  # zero-cost unless it raises: a shim bug never reaches the host
                raw = (handle, agent, args, kwargs, False)
                rec = [
                    None,
                    None,
                    None,
                    raw,
                    agent,
                    None,
                    None,
                    None,
                    _no_telemetry(agent),
                ]
                try:
                    handle._railtrace_record = rec
                except AttributeError:  # not a handle of the shim's class: keyed by id instead
                    handles[id(handle)] = rec
            except Exception:
                logger.debug("railtrace: initialize_xfer", exc_info=True)
            return handle

        return initialize_xfer

    def _describe(self, raw: Any) -> _Handle | None:
        """(handle, agent name, operation, bytes, descriptors, peer, lazy descriptors) of a noted call."""
        if raw is None or len(raw) != 5:
            return raw
        handle, agent, args, kwargs, prepped = raw
        name = getattr(agent, "name", "")
        try:
            if not prepped:
                op = kwargs.get("operation", args[0] if args else "")
                local = kwargs.get("local_descs", args[1] if len(args) > 1 else None)
                remote = kwargs.get("remote_agent", args[3] if len(args) > 3 else None)
                return (handle, name, op, None, None, remote, local)
            op = kwargs.get("operation", args[0] if args else "")
            side = kwargs.get("local_xfer_side", args[1] if len(args) > 1 else None)
            indices = kwargs.get("local_indices", args[2] if len(args) > 2 else None)
            rside = kwargs.get("remote_xfer_side", args[3] if len(args) > 3 else None)
            ndesc = len(indices) if indices is not None else None
            known = self._dlists.get(id(side))
            rknown = self._dlists.get(id(rside))
            remote = rknown[2] if rknown is not None else None
            lazy = (known[1], indices) if known is not None and indices is not None else None
            return (handle, name, op, None, ndesc, remote, lazy)
        except Exception:
            logger.debug("railtrace: unreadable transfer call", exc_info=True)
            return (handle, name, "", None, None, None, None)

    def _make_make_prepped_xfer(self, original: Any) -> Any:
        handles = self._handles

        def make_prepped_xfer(agent: Any, *args: Any, **kwargs: Any) -> Any:
            handle = original(agent, *args, **kwargs)
            # O(1) and nothing read here: the emitter resolves the lists, sums bytes (or takes
            # NIXL's telemetry). The index arrays are vLLM's per-call objects, kept by reference.
            # The handle's record is made here, so that posting it only fills it in.
            try:
                try:  # inline, not _no_telemetry(): one call and one global fewer per transfer
                    quiet = not agent._railtrace_telemetry
                except AttributeError:
                    quiet = True
                raw = (handle, agent, args, kwargs, True)
                rec = [
                    None,
                    None,
                    None,
                    raw,
                    agent,
                    None,
                    None,
                    None,
                    quiet,
                ]
                try:
                    handle._railtrace_record = rec
                except AttributeError:
                    handles[id(handle)] = rec
            except Exception:
                logger.debug("railtrace: make_prepped_xfer", exc_info=True)
            return handle

        return make_prepped_xfer

    def _make_transfer(self, original: Any) -> Any:
        handles, queue = self._handles, self._queue
        scope_now = _SCOPE.get
        # The SDK's context variable read directly when it is the runtime context (no call into
        # the API's runtime-context layer); otherwise the API's get_current().
        parent_now = _OTEL_CONTEXT_VAR.get if _OTEL_CONTEXT_VAR is not None else otel_context.get_current
        inline = not self._async

        def transfer(agent: Any, handle: Any, notif_msg: bytes = b"") -> Any:
            # With `cma` the copy runs inside the post and evicts the caches, so whatever the
            # shim touches afterwards is fetched again: it notes the post by reference before
            # (two context-variable reads, one clock read) and makes two stores after.
            rec = None
            try:
                try:
                    rec = handle._railtrace_record
                except AttributeError:
                    rec = handles.get(id(handle))
                # A handle not seen prepared, re-posted, or whose slot holds something else.
                if type(rec) is not list or len(rec) != _RECORD_LEN or rec[0] is not None:
                    rec = self._new_record(agent, handle, rec)
                rec[1] = scope_now()  # the request's scope and its trace context, by reference
                rec[2] = parent_now()
                rec[0] = _time_ns()
                if not inline:
                    queue.append(rec)  # the emitter holds it until it ends
            except Exception:
                logger.debug("railtrace: transfer", exc_info=True)
            try:
                state = original(agent, handle, notif_msg)
            except Exception as exc:
                self._raised(rec, exc)
                raise
            if state != "PROC" and rec is not None:  # DONE or ERR inside the post (cma, small ones)
                try:  # free unless it raises (a record emptied under NIXL's call)
                    rec[5] = state  # state, then end: the emitter takes a record once its end is set
                    rec[6] = _time_ns()
                    if inline:
                        self._ended_inline(rec)
                except Exception:
                    logger.debug("railtrace: transfer", exc_info=True)
            return state

        return transfer

    def _make_check_xfer_state(self, original: Any) -> Any:
        handles = self._handles
        inline = not self._async

        def check_xfer_state(agent: Any, handle: Any) -> Any:
            try:
                state = original(agent, handle)
            except Exception as exc:
                self._raised(self._record_of(handle), exc)
                raise
            if state != "PROC":
                try:
                    try:
                        rec = handle._railtrace_record
                    except AttributeError:
                        rec = handles.get(id(handle))
                    if rec is not None and rec[6] is None and rec[0] is not None:  # not ended yet
                        rec[5] = state
                        rec[6] = _time_ns()
                        if inline:
                            self._ended_inline(rec)
                except Exception:
                    logger.debug("railtrace: check_xfer_state", exc_info=True)
            return state

        return check_xfer_state

    def _make_get_xfer_telemetry(self, original: Any) -> Any:
        handles = self._handles

        def get_xfer_telemetry(agent: Any, handle: Any) -> Any:
            tel = original(agent, handle)
            # vLLM (0.12 on) reads it right after DONE: the shim keeps that object, no second read.
            try:
                try:
                    rec = handle._railtrace_record
                except AttributeError:
                    rec = handles.get(id(handle))
                if rec is not None and rec[6] is not None and rec[7] is None:
                    rec[7] = tel
                    rec[8] = True
            except Exception:
                logger.debug("railtrace: get_xfer_telemetry", exc_info=True)
            return tel

        return get_xfer_telemetry

    def _make_release_xfer_handle(self, original: Any) -> Any:
        handles = self._handles

        def release_xfer_handle(agent: Any, handle: Any) -> Any:
            try:
                try:
                    rec = handle._railtrace_record
                    handle._railtrace_record = None  # the record refers to its handle: no cycle
                except AttributeError:
                    rec = handles.pop(id(handle), None)
                if rec is not None and rec[0] is not None and (rec[6] is None or not rec[8]):
                    self._release_open(agent, handle, rec)
            except Exception:
                logger.debug("railtrace: release_xfer_handle", exc_info=True)
            return original(agent, handle)

        return release_xfer_handle

    def _hot_patch(self, name: str, original: Any, fallback: Any, handle_type: type | None) -> Any:
        """The C patch for `name` (`_hotpath.c`): the common call in C, every other call to
        `fallback`, the Python patch just made; the cold paths call back into this object. Handles
        of `handle_type` (the shim's subclass of NIXL's) have their record read at its slot."""
        return _hotpath.HotPatch(
            kind=name,
            original=original,
            fallback=fallback,
            handles=self._handles,
            queue_append=self._queue.append if self._async else None,
            scope_var=_SCOPE,
            context_var=_OTEL_CONTEXT_VAR,
            parent_now=otel_context.get_current,
            on_end=None if self._async else self._ended_inline,
            on_raise=self._raised,
            on_release=self._release_open,
            handle_type=handle_type,
        )

    # -- completion (cold paths: re-posts, errors, release, inline mode) ------------------
    def _new_record(self, agent: Any, handle: Any, previous: _Record | None) -> _Record:
        """A record for a handle posted again (the previous transfer is over) or never seen prepared."""
        if type(previous) is not list or len(previous) != _RECORD_LEN:
            previous = None  # not one of the shim's records: nothing to close or to carry on
        if previous is not None:
            self._close(previous, None)
        raw = previous[3] if previous is not None else None
        rec = [None, None, None, raw, agent, None, None, None, _no_telemetry(agent)]
        try:
            handle._railtrace_record = rec
        except AttributeError:
            self._handles[id(handle)] = rec
        return rec

    def _release_open(self, agent: Any, handle: Any, rec: _Record) -> None:
        """A handle released while its transfer is open, or ended with NIXL's telemetry unread."""
        try:
            if rec[5] == "DONE" and rec[7] is None and rec[6] is not None:
                # The caller did not read NIXL's telemetry: read it while the handle lives.
                rec[7] = _read_telemetry(agent, handle)
            self._close(rec, "RELEASED")
        except Exception:
            logger.debug("railtrace: release_xfer_handle", exc_info=True)

    def _record_of(self, handle: Any) -> _Record | None:
        try:
            return handle._railtrace_record
        except AttributeError:
            return self._handles.get(id(handle))

    def _close(self, rec: _Record, state_if_open: str | None) -> None:
        """No more news for this transfer: end it now if it has not ended (re-post, release, error)."""
        if rec[6] is None:
            rec[5] = state_if_open
            rec[6] = _time_ns()
            rec[8] = True
            if not self._async:
                self._ended_inline(rec)
        else:
            rec[8] = True

    def _raised(self, rec: _Record | None, exc: BaseException) -> None:
        """The post or a poll raised: end the transfer's span with the exception's class as its error."""
        try:
            if rec is not None and rec[0] is not None and rec[6] is None:
                self._close(rec, _EXC + type(exc).__name__)
        except Exception:
            logger.debug("railtrace: failed transfer", exc_info=True)

    def _ended_inline(self, rec: _Record) -> None:
        """`background_emit=False`: the span is built on the transfer's thread when it ends."""
        try:
            if rec[5] == "DONE" and rec[7] is None and not rec[8]:
                raw = rec[3]
                if raw is not None:
                    rec[7] = _read_telemetry(rec[4], raw[0])
            rec[8] = True
            if _kind_of(rec[4]) not in _SPAN_BY_KIND:
                return  # not traced (EPLB, KV offload): no span
            item = self._resolved(_item(rec))
            agent_name, op, peer = _ident(item)
            ev = self.capture.evidence(agent_name or None, op or None, peer=peer or None)
            if ev is None and self.capture.configured and self._grace_ns > 0:
                # UCX may not have flushed the table yet: emit later, with the real end time.
                self._queue.append(item)
                self._ensure_worker()
                return
            self._emit(item, ev)
        except Exception:
            logger.debug("railtrace: kv span dropped", exc_info=True)

    def _emit(self, item: tuple[Any, ...], ev: Any, tracer: Any = None) -> None:
        (start, scope, parent), end, state, info, tel, agent = item
        span_name = _SPAN_BY_KIND.get(_kind_of(agent))  # type: ignore[arg-type]
        if span_name is None:
            return  # an agent that is not a KV or EC connector's (EPLB, KV offload): no span
        if scope is not None and type(scope) is not TransferScope:
            scope = scope.resolve()  # a lazy scope (the vLLM hook): built here, off the host's thread
        if scope is not None and scope.parent is not None:
            parent = scope.parent
        extra = None
        if tel is not None:
            info, extra = _telemetry_fields(tel, info)
        if info is None:
            op = nbytes = ndesc = descs = remote_agent = None
        else:
            _, _, op, nbytes, ndesc, remote_agent, descs = info
        if nbytes is None and descs is not None:
            if type(descs) is tuple:  # prepped: (lengths, indices), summed here off the host's thread
                nbytes = _prepped_bytes(*descs)
            else:
                nbytes, ndesc = descriptor_bytes(descs)
        op = _op(op) or "unknown"
        attrs: dict[str, Any] = {
            sc.KV_OPERATION: op,
            sc.KV_CONNECTOR: "nixl",
            sc.KV_BACKEND: "UCX",
        }
        if nbytes is not None:
            attrs[sc.KV_BYTES] = int(nbytes)
        if ndesc is not None:
            attrs[sc.KV_DESCRIPTORS] = int(ndesc)
        remote_agent = _peer_name(remote_agent)
        engine = _str(remote_agent)
        if scope is not None:
            if scope.request_id:
                attrs[sc.KV_REQUEST_ID] = scope.request_id
            if scope.local_gpu is not None and scope.local_gpu != "":
                attrs[sc.KV_LOCAL_GPU] = str(scope.local_gpu)
            if scope.remote_host:
                attrs[sc.KV_REMOTE_HOST] = scope.remote_host
            engine = scope.remote_engine_id or engine
        if engine is not None and engine != "":
            attrs[sc.KV_REMOTE_ENGINE_ID] = str(engine)
        if remote_agent:
            attrs[sc.KV_REMOTE_AGENT] = remote_agent
        attrs.update(cached_evidence_attributes(ev))
        if scope is not None and scope.attributes:
            attrs.update(scope.attributes)
        if extra:
            attrs.update(extra)
        error = _ERRORS.get(state or "")
        if error is None and state and state.startswith(_EXC):
            error = state[len(_EXC) :]
        if error:
            attrs[sc.ERROR_TYPE] = error
        if tracer is None:
            tracer = get_tracer(TRACER_NAME, self._provider())
        span = tracer.start_span(
            span_name, context=parent, kind=SpanKind.INTERNAL, attributes=attrs, start_time=start
        )
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end)

    def _provider(self) -> Any:
        """The provider given to `instrument()`, else the host's global one, else one built from the
        standard `OTEL_*` variables (vLLM worker processes usually have none)."""
        if self._tracer_provider is not None:
            return self._tracer_provider
        from railtrace_tracing.otel_setup import provider_for_shims

        return provider_for_shims()

    def _resolved(self, item: tuple[Any, ...]) -> tuple[Any, ...]:
        info = item[3]
        if info is not None and len(info) == 5:
            return (*item[:3], self._describe(info), *item[4:])
        return item

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            with self._lock:
                if self._worker is None or not self._worker.is_alive():
                    self._worker = threading.Thread(target=self._work, name="railtrace-kv", daemon=True)
                    self._worker.start()

    def _work(self) -> None:
        """Background emitter: evidence lookup and span creation off the transfer's thread."""
        busy = True
        last_poll = 0.0
        while True:
            # Every 50 ms while transfers finish, every 0.5 s when idle (spans keep their own times).
            self._wake.wait(0.05 if busy else 0.5)
            self._wake.clear()
            try:
                had = bool(self._queue) or bool(self._waiting) or bool(self._open)
                now = time.monotonic()
                if self.capture.configured and now - last_poll >= 0.5:  # UCX's warnings reach stderr
                    last_poll = now
                    self.capture.poll()
                left = self.flush_deferred(final=False)
                busy = had or left > 0
            except Exception:
                logger.debug("railtrace: kv emitter", exc_info=True)

    def flush_deferred(self, final: bool = True) -> int:
        """Emit pending spans whose evidence has arrived (all of them when `final`, or whose grace
        has passed); returns how many ended transfers are still waiting (not those in flight)."""
        with self._flush_lock:
            queue = self._queue
            items = self._waiting
            self._waiting = []
            records = self._open
            self._open = []
            while queue:
                queued = queue.popleft()
                if type(queued) is list:
                    records.append(queued)
                else:  # an inline-mode span waiting for its UCX evidence
                    items.append(queued)
            now = _time_ns()
            held = 0
            for rec in records:
                if len(rec) != _RECORD_LEN:  # emptied by someone else: nothing to emit
                    continue
                end = rec[6]
                if end is None:  # still in flight
                    self._open.append(rec)
                elif rec[8] or rec[5] != "DONE" or final or now >= end + self._grace_ns:
                    items.append(self._resolved(_item(rec)))
                else:  # ended; its handle still lives and may yet give NIXL's telemetry
                    self._open.append(rec)
                    held += 1
            if not items:
                return held
            configured = self.capture.configured
            if configured:
                self.capture.poll()  # once per batch
            now = _time_ns()
            tracer = get_tracer(TRACER_NAME, self._provider())
            keep = []
            evidence: dict[tuple[Any, Any], Any] = {}
            for item in items:
                try:
                    if _kind_of(item[5]) not in _SPAN_BY_KIND:
                        continue  # not traced: no evidence to wait for, no span
                    ev = None
                    if configured:
                        key = _ident(item)
                        if key in evidence:
                            ev = evidence[key]
                        else:
                            ev = self.capture.evidence(
                                key[0] or None, key[1] or None, poll=False, peer=key[2] or None
                            )
                            evidence[key] = ev
                    if ev is not None or final or not configured or now >= item[1] + self._grace_ns:
                        self._emit(item, ev, tracer)
                        time.sleep(0)  # hand the GIL to a transfer's thread that may be waiting
                    else:
                        keep.append(item)
                except Exception:
                    logger.debug("railtrace: kv span dropped", exc_info=True)
            self._waiting = keep
            return len(keep) + held

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every finished transfer's span is emitted (evidence or grace); True if all were."""
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        while time.monotonic() < deadline:
            if self.flush_deferred(final=False) == 0:
                return True
            time.sleep(0.01)
        return self.flush_deferred(final=True) == 0


def _creator_module(max_depth: int = 16) -> str | None:
    """The module whose code is creating a NIXL agent: the first caller outside NIXL, the shim
    and wrapt (a subclass of `nixl_agent` counts as its own module's)."""
    frame = sys._getframe(2)
    for _ in range(max_depth):
        if frame is None:
            return None
        name = frame.f_globals.get("__name__")
        if not isinstance(name, str):
            return None
        if not (name.startswith(_NIXL_PREFIX) or name.startswith(_PASS_THROUGH)):
            return name
        frame = frame.f_back
    return None


def _agent_kind() -> str | None:
    """`KIND_KV`, `KIND_EC` or None (not traced) for the agent being created (once per agent)."""
    from railtrace_tracing.kv_transfer import vllm as vllm_hook

    return vllm_hook.agent_kind(_creator_module())


def _kind_of(agent: Any) -> str | None:
    """The kind noted on an agent at its creation; agents made before `instrument()` are KV."""
    try:
        return agent._railtrace_kind  # type: ignore[no-any-return]
    except AttributeError:
        return KIND_KV


def _want_hot_path(asked: Any) -> bool:
    """Whether the hot patches are the C ones: `hot_path` ("auto" by default, "c", "python"), and
    `RAILTRACE_KV_HOT_PATH=python`. "c" without the built extension is an error, not a fallback."""
    mode = str(asked or os.environ.get(sc.ENV_KV_HOT_PATH) or "auto").strip().lower()
    if mode not in ("auto", "c", "python"):
        raise ValueError(f"hot_path must be auto, c or python, not {mode!r}")
    if mode == "c" and _hotpath is None:
        raise RuntimeError(f"railtrace: hot_path='c' but the C hot path is not built ({_HOTPATH_ERROR})")
    return mode != "python" and _hotpath is not None


def _no_telemetry(agent: Any) -> bool:
    """True unless the agent captures NIXL's telemetry (noted when it was created; agents created
    before `instrument()` are treated as not capturing it)."""
    try:
        return not agent._railtrace_telemetry
    except AttributeError:
        return True


def _traced_handle_class(base: Any) -> type | None:
    """NIXL's transfer-handle class with one more slot, where the shim keeps the handle's record.
    The patches reach it through the handle, which NIXL's own call has just read, instead of a
    dict keyed by handle: after a `cma` copy that is one object fewer fetched per call."""
    if not isinstance(base, type) or "__slots__" not in base.__dict__:
        return None  # another NIXL (plain int handles, no slots): the shim keys records by id
    return type(
        base.__name__,
        (base,),
        {"__slots__": ("_railtrace_record",), "__module__": base.__module__, "__doc__": base.__doc__},
    )


def _read_telemetry(agent: Any, handle: Any) -> Any:
    """NIXL's telemetry of a finished transfer the caller did not read, read at its release while
    the handle is live (converted later, on the emitter). The binding is called directly:
    `nixl_agent.get_xfer_telemetry` only forwards."""
    try:
        return agent.agent.getXferTelemetry(handle._handle)
    except AttributeError:
        pass
    except Exception:
        return None
    try:
        return agent.get_xfer_telemetry(handle)
    except Exception:
        return None


def _telemetry_fields(tel: Any, info: _Handle | None) -> tuple[_Handle | None, dict[str, Any]]:
    """NIXL's own numbers (`get_xfer_telemetry`): bytes, descriptors, post and transfer time."""
    extra: dict[str, Any] = {}
    if info is None:
        return info, extra
    handle, name, op, nbytes, ndesc, remote, descs = info
    try:
        if getattr(tel, "totalBytes", None) is not None:
            nbytes, descs = int(tel.totalBytes), None
        if getattr(tel, "descCount", None) is not None:
            ndesc = int(tel.descCount)
        if getattr(tel, "postDuration", None) is not None:
            extra[sc.KV_POST_DURATION_S] = float(tel.postDuration) / 1e6
        if getattr(tel, "xferDuration", None) is not None:
            extra[sc.KV_XFER_DURATION_S] = float(tel.xferDuration) / 1e6
    except Exception:
        logger.debug("railtrace: unreadable NIXL telemetry", exc_info=True)
    return (handle, name, op, nbytes, ndesc, remote, descs), extra


def _item(rec: _Record) -> tuple[Any, ...]:
    """An ended record as the emitter's item: ((post time, scope, parent), end, state, what the
    handle moves, telemetry, agent)."""
    return ((rec[0], rec[1], rec[2]), rec[6], rec[5], rec[3], rec[7], rec[4])


def _ident(item: tuple[Any, ...]) -> tuple[str, str, str]:
    """(agent name, operation, peer agent) of a queued transfer: the key of its UCX evidence."""
    info = item[3]
    if info is None:
        return str(getattr(item[5], "name", "")), "", ""
    return str(info[1]), _op(info[2]), _peer_name(info[5])


def _peer_name(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return "" if v is None else str(v)


def _prepped_bytes(lengths: Any, indices: Any) -> int | None:
    """Bytes of a prepped transfer: the registered lengths at `indices` (vectorised with numpy;
    an N×5 list's rows are looked up per index, not expanded)."""
    try:
        if type(lengths) is StridedDescriptors:
            return lengths.take(indices)
        if _np is not None and isinstance(lengths, _np.ndarray):
            return int(lengths[_np.asarray(indices, dtype=_np.int64)].sum())
        return sum(int(lengths[int(i)]) for i in indices)
    except Exception:
        return None


def _otel_context_var() -> contextvars.ContextVar[Any] | None:
    """The SDK's ContextVar holding the current OpenTelemetry context, when that is the runtime
    context in use: the post then reads it directly, without the API's runtime-context layer.
    None for another runtime context (the post then calls `opentelemetry.context.get_current`)."""
    try:
        from opentelemetry.context import _RUNTIME_CONTEXT

        var = getattr(_RUNTIME_CONTEXT, "_current_context", None)
        # ...and it has a default, so that a thread that never set it reads that, not LookupError.
        fresh = contextvars.Context().run(var.get) if isinstance(var, contextvars.ContextVar) else None
        if isinstance(fresh, otel_context.Context):
            return var
    except Exception:
        pass
    return None


_OTEL_CONTEXT_VAR = _otel_context_var()


def _op(op: Any) -> str:
    return str(op or "").strip().lower()


def _lengths(xfer_list: Any) -> Any:
    """Per-descriptor lengths of a list given to `prep_xfer_dlist` (N×5: `StridedDescriptors`)."""
    if xfer_list is None:
        return None
    if is_strided(xfer_list):
        return StridedDescriptors(xfer_list)
    if hasattr(xfer_list, "descCount"):
        return [int(xfer_list[i][1]) for i in range(xfer_list.descCount())]
    if hasattr(xfer_list, "shape") and len(xfer_list.shape) == 2:
        return [int(x) for x in xfer_list[:, 1]]
    return [int(d[1]) for d in xfer_list]
