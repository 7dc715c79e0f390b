"""Emit the `llm_d.kv_transfer` span (PRODUCT.md contract) without needing a NIXL agent.

The NIXL instrumentor, the vLLM connector hook and the simulator all go through this one
function, so every KV span has the same shape. Timestamps are optional so that a simulator
can emit realistic timings without sleeping.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from railtrace_tracing import semconv as sc
from railtrace_tracing._common import extract_context, get_tracer, logger
from railtrace_tracing.ucx.parser import Evidence, UcxLog, parse_text

TRACER_NAME = "railtrace_tracing.kv_transfer"


@functools.lru_cache(maxsize=128)
def _parsed(text: str) -> UcxLog:
    """Parsed once per distinct log text (simulators pass the same endpoint log many times)."""
    return parse_text(text)


def evidence_attributes(evidence: Evidence | None) -> dict[str, Any]:
    """`.transport`, `.devices`, `.split`, `.evidence`, `.warnings` from UCX evidence; `unknown` without."""
    if evidence is None:
        return {sc.KV_TRANSPORT: sc.Transport.UNKNOWN.value}
    attrs: dict[str, Any] = {
        sc.KV_TRANSPORT: evidence.transport.value,
        sc.KV_DEVICES: list(evidence.devices),
        sc.KV_EVIDENCE: evidence.evidence,
        sc.KV_EVIDENCE_SCOPE: "peer" if evidence.peer else "process",
    }
    if len(evidence.devices) > 1 and evidence.split:
        attrs[sc.KV_SPLIT] = [float(s) for s in evidence.split]
    if evidence.protocol:
        attrs[sc.KV_PROTOCOL] = evidence.protocol
    if evidence.warnings:
        attrs[sc.KV_WARNINGS] = list(evidence.warnings)
    return attrs


_UNKNOWN_ATTRS: Mapping[str, Any] = {sc.KV_TRANSPORT: sc.Transport.UNKNOWN.value}
_EV_ATTRS: dict[int, tuple[Evidence, dict[str, Any]]] = {}


def cached_evidence_attributes(evidence: Evidence | None) -> Mapping[str, Any]:
    """`evidence_attributes`, built once per evidence object (the UCX capture and the parsed-log
    cache hand out the same object for every transfer of an endpoint). Read only: copy to change."""
    if evidence is None:
        return _UNKNOWN_ATTRS
    hit = _EV_ATTRS.get(id(evidence))
    if hit is not None and hit[0] is evidence:
        return hit[1]
    attrs = evidence_attributes(evidence)
    if len(_EV_ATTRS) > 512:
        _EV_ATTRS.clear()
    _EV_ATTRS[id(evidence)] = (evidence, attrs)
    return attrs


def kv_attributes(
    *,
    request_id: str | None = None,
    operation: str | None = None,
    connector: str | None = "nixl",
    backend: str | None = "UCX",
    bytes: int | None = None,
    descriptors: int | None = None,
    local_gpu: str | None = None,
    remote_host: str | None = None,
    remote_engine_id: str | None = None,
) -> dict[str, Any]:
    """The contract attributes that are known, typed as the registry says."""
    attrs: dict[str, Any] = {}
    if request_id is not None and request_id != "":
        attrs[sc.KV_REQUEST_ID] = request_id
    if operation:
        attrs[sc.KV_OPERATION] = operation.lower()
    if connector is not None and connector != "":
        attrs[sc.KV_CONNECTOR] = connector
    if backend is not None and backend != "":
        attrs[sc.KV_BACKEND] = backend
    if bytes is not None:
        attrs[sc.KV_BYTES] = int(bytes)
    if descriptors is not None:
        attrs[sc.KV_DESCRIPTORS] = int(descriptors)
    if local_gpu is not None and local_gpu != "":
        attrs[sc.KV_LOCAL_GPU] = str(local_gpu)
    if remote_host is not None and remote_host != "":
        attrs[sc.KV_REMOTE_HOST] = remote_host
    if remote_engine_id is not None and remote_engine_id != "":
        attrs[sc.KV_REMOTE_ENGINE_ID] = str(remote_engine_id)
    return attrs


@dataclass
class KVTransferRecord:
    """The open span of one transfer; methods never raise."""

    span: trace.Span | None
    attributes: dict[str, Any] = field(default_factory=dict)
    ended: bool = False

    def set(self, **kwargs: Any) -> None:
        """Set contract attributes by their keyword names (`bytes=`, `remote_host=` …)."""
        with contextlib.suppress(Exception):
            attrs = kv_attributes(connector=None, backend=None, **kwargs)
            self.attributes.update(attrs)
            if self.span is not None:
                self.span.set_attributes(attrs)

    def set_evidence(self, evidence: Evidence | None) -> None:
        with contextlib.suppress(Exception):
            attrs = evidence_attributes(evidence)
            self.attributes.update(attrs)
            if self.span is not None:
                self.span.set_attributes(attrs)

    def fail(self, error_type: str, description: str | None = None) -> None:
        with contextlib.suppress(Exception):
            self.attributes[sc.ERROR_TYPE] = error_type
            if self.span is not None:
                self.span.set_attribute(sc.ERROR_TYPE, error_type)
                self.span.set_status(Status(StatusCode.ERROR, description or error_type))

    def end(self, end_time_ns: int | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        with contextlib.suppress(Exception):
            if self.span is not None:
                self.span.end(end_time=end_time_ns)


def _parent(
    parent: otel_context.Context | None,
    trace_headers: Mapping[str, Any] | None,
    kv_transfer_params: Mapping[str, Any] | None,
) -> otel_context.Context | None:
    if parent is not None:
        return parent
    if not trace_headers and not kv_transfer_params:
        return None
    for carrier in (trace_headers, kv_transfer_params, (kv_transfer_params or {}).get("trace_headers")):
        if carrier and isinstance(carrier, Mapping):
            ctx = extract_context(carrier)
            if ctx is not None:
                return ctx
    return None


def start_kv_transfer(
    *,
    tracer_provider: trace.TracerProvider | None = None,
    operation: str,
    request_id: str | None = None,
    connector: str | None = "nixl",
    backend: str | None = "UCX",
    bytes: int | None = None,
    descriptors: int | None = None,
    local_gpu: str | None = None,
    remote_host: str | None = None,
    remote_engine_id: str | None = None,
    evidence: Evidence | None = None,
    parent: otel_context.Context | None = None,
    trace_headers: Mapping[str, Any] | None = None,
    kv_transfer_params: Mapping[str, Any] | None = None,
    start_time_ns: int | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> KVTransferRecord:
    """Open a `llm_d.kv_transfer` span; end it with `.end()`. Parent: explicit `parent`, else the
    W3C context in `trace_headers` / `kv_transfer_params`, else the current context."""
    try:
        if kv_transfer_params:
            remote_host = remote_host or kv_transfer_params.get("remote_host")
            remote_engine_id = remote_engine_id or kv_transfer_params.get("remote_engine_id")
        attrs = kv_attributes(
            request_id=request_id,
            operation=operation,
            connector=connector,
            backend=backend,
            bytes=bytes,
            descriptors=descriptors,
            local_gpu=local_gpu,
            remote_host=remote_host,
            remote_engine_id=remote_engine_id,
        )
        attrs.update(cached_evidence_attributes(evidence))
        if attributes:
            attrs.update(attributes)
        tracer = get_tracer(TRACER_NAME, tracer_provider)
        span = tracer.start_span(
            sc.SPAN_KV_TRANSFER,
            context=_parent(parent, trace_headers, kv_transfer_params),
            kind=SpanKind.INTERNAL,
            attributes=attrs,
            start_time=start_time_ns,
        )
        return KVTransferRecord(span, attrs)  # the SDK copied what it keeps
    except Exception:
        logger.debug("railtrace: cannot start kv_transfer span", exc_info=True)
        return KVTransferRecord(None)


@contextlib.contextmanager
def record_kv_transfer(
    *,
    ucx_log_text: str | None = None,
    ucx_context: str | None = None,
    end_time_ns: int | None = None,
    **kwargs: Any,
) -> Iterator[KVTransferRecord]:
    """Context manager around one transfer. Takes every keyword of `start_kv_transfer`, plus
    `ucx_log_text` (a UCX info log to take the evidence from, for `ucx_context`/`operation`) and
    `end_time_ns`. An exception of the body marks the span failed and propagates unchanged."""
    if ucx_log_text is not None and kwargs.get("evidence") is None:
        try:
            kwargs["evidence"] = _parsed(ucx_log_text).select(ucx_context, kwargs.get("operation"))
        except Exception:
            logger.debug("railtrace: UCX log text not parsed", exc_info=True)
    rec = start_kv_transfer(**kwargs)
    token = _CURRENT.set(rec)
    try:
        yield rec
    except BaseException as exc:
        rec.fail(type(exc).__qualname__, str(exc) or None)
        raise
    finally:
        _CURRENT.reset(token)
        rec.end(end_time_ns)


def emit_kv_transfer(
    *, start_time_ns: int, end_time_ns: int, error_type: str | None = None, **kwargs: Any
) -> KVTransferRecord:
    """One finished span with the given timestamps (for simulators and replays)."""
    rec = start_kv_transfer(start_time_ns=start_time_ns, **kwargs)
    if error_type:
        rec.fail(error_type)
    rec.end(end_time_ns)
    return rec


_CURRENT: contextvars.ContextVar[KVTransferRecord | None] = contextvars.ContextVar(
    "railtrace_kv_record", default=None
)


def current_kv_transfer() -> KVTransferRecord | None:
    """The record opened by the innermost `record_kv_transfer` of this context, if any."""
    return _CURRENT.get()


class StridedDescriptors:
    """An N×5 descriptor array `(address, len, device, stride, count)`: each row stands for
    `count` descriptors of `len` bytes. NIXL >= 1.5 prepares such a list directly (nixl-cu12
    1.5.1 `_api.py`, `nixl_agent.prep_xfer_dlist`, l.512-541) and vLLM's NIXL connector passes
    one from vLLM 0.33 (read in 0.34.0; 0.24.0 still passes N×3):
    vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py, 0.34.0,
    `_pack_strided_descs` l.2199-2207, `_block_strided_descs` l.2210-2239, prepared at l.2409.
    Indices of a prepped transfer count the expanded descriptors, so bytes are summed
    per row found for each index -- never by expanding the rows (millions of blocks)."""

    __slots__ = ("ends", "lengths")

    def __init__(self, rows: Any) -> None:
        import numpy as np

        counts = np.asarray(rows[:, 4], dtype=np.int64)
        self.lengths = np.asarray(rows[:, 1], dtype=np.int64)
        self.ends = np.cumsum(counts)  # one past the last expanded index of each row

    @property
    def count(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def total(self) -> int:
        import numpy as np

        counts = np.diff(self.ends, prepend=0)
        return int((self.lengths * counts).sum())

    def take(self, indices: Any) -> int | None:
        """Bytes of the expanded descriptors at `indices`; None for an index out of range."""
        import numpy as np

        idx = np.asarray(indices, dtype=np.int64).ravel()
        if idx.size == 0:
            return 0
        if int(idx.min()) < 0 or int(idx.max()) >= self.count:
            return None
        return int(self.lengths[np.searchsorted(self.ends, idx, side="right")].sum())


def is_strided(descs: Any) -> bool:
    """Whether `descs` is an N×5 (strided) descriptor array."""
    shape = getattr(descs, "shape", None)
    return shape is not None and len(shape) == 2 and shape[1] == 5


def descriptor_bytes(descs: Any, indices: Sequence[int] | None = None) -> tuple[int | None, int | None]:
    """(bytes, count) of a NIXL descriptor list: list of (addr, len, dev) tuples, N×3 array, or
    N×5 strided array (`StridedDescriptors`; `indices` and count then refer to the expanded list)."""
    try:
        if is_strided(descs):
            strided = StridedDescriptors(descs)
            if indices is None:
                return strided.total(), strided.count
            nbytes = strided.take(indices)
            return (nbytes, len(indices)) if nbytes is not None else (None, None)
        if hasattr(descs, "descCount"):
            n = descs.descCount()
            idx = range(n) if indices is None else indices
            return sum(int(descs[i][1]) for i in idx), len(idx)
        if hasattr(descs, "shape") and len(descs.shape) == 2:
            lens = descs[:, 1] if indices is None else descs[list(indices), 1]
            return int(lens.sum()), len(lens)
        seq = list(descs)
        if indices is not None:
            seq = [seq[i] for i in indices]
        return sum(int(d[1]) for d in seq), len(seq)
    except Exception:
        return None, None
