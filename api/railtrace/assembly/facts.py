"""One group of normalised spans -> one RequestFacts.

Timing rule (docs/normalisation.md, "Clock skew"): every stage is a duration measured inside
one process -- a vLLM `gen_ai.latency.*` value, a sidecar `llm_d.pd_proxy.*_ms` value or one
span's own end minus start. The only cross-process difference used (gateway start to the
next hop's start, inside TTFT) is bounded by the within-process difference of the two
spans' durations. Whatever still comes out negative is clamped to 0 and the clamp is
written into `timing_sources`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import orjson

from railtrace.assembly.joins import JoinNotes
from railtrace.model import KV_SOURCE, Candidate, Endpoint, Flag, KVFacts, RequestFacts, RouterPick, Span
from railtrace.normalize import engine_leg_hint, is_epp, normalize_request_id, span_request_keys
from railtrace.normalize import table as ntable
from railtrace_tracing import semconv
from railtrace_tracing.semconv import FLAG, HOP, IDENTITY, RECIPE, ROLE, STAGE, TRANSPORT

SERVER_KIND = 2  # OTLP SpanKind SERVER
LOOPBACK_PREFIXES = ("localhost", "127.", "[::1]", "::1", "0.0.0.0")
MAX_ANCESTRY = 64
ROUTER_ONLY_ROLES = frozenset({ROLE.GATEWAY, ROLE.SCHEDULING, ROLE.KV_CACHE, ROLE.OTHER})
TOP_ROLES = (ROLE.GATEWAY, ROLE.PROXY)
REQUEST_ROLE_VALUES = frozenset(
    {ROLE.GATEWAY, ROLE.SCHEDULING, ROLE.PROXY, ROLE.PREFILL, ROLE.DECODE, ROLE.KV_TRANSFER}
)
TRANSPORTS = frozenset(vars(TRANSPORT).values())
UNKNOWN_TRANSPORT = TRANSPORT.UNKNOWN
TCP = TRANSPORT.TCP
BROKEN_TRACE = FLAG.BROKEN_TRACE


def _num(value: Any) -> float | None:
    """A finite number from an attribute value (numbers, numeric strings); bool is not one."""
    cls = value.__class__
    exact = cls is float or cls is int  # checked first: this runs for every number read
    if not exact and (isinstance(value, bool) or not isinstance(value, (int, float))):
        if not isinstance(value, str):
            return None
        try:
            value = float(value)
        except ValueError:
            return None
    value = float(value)
    return value if math.isfinite(value) else None


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _int(value: Any) -> int | None:
    """An integer from an attribute value, within OTLP's (and the stores') signed 64 bits: a
    double like 1e300 is integral, and a summary holding it could be neither encoded as JSON
    nor stored, so its whole page of requests would fail to store again and again."""
    number = _num(value)
    if number is None or not number.is_integer():
        return None
    n = int(number)
    return n if INT64_MIN <= n <= INT64_MAX else None


def _int64_sum(values: list[int]) -> int | None:
    """The sum of these, or None if there are none or it leaves the signed 64-bit range."""
    total = sum(values)
    return total if values and INT64_MIN <= total <= INT64_MAX else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _str_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def _num_list(value: Any) -> list[float | None]:
    if not isinstance(value, list):
        return []
    return [_num(v) for v in value]


def _ref(span: Span) -> str:
    return f"{span.canonical_name}@{span.span_id}"


class _Trees:
    """Parent lookups inside one group (ids are unique per trace, not globally)."""

    def __init__(self, spans: Sequence[Span]) -> None:
        self.by_key = {(s.trace_id, s.span_id): s for s in spans}

    def parent(self, span: Span) -> Span | None:
        if not span.parent_span_id:
            return None
        return self.by_key.get((span.trace_id, span.parent_span_id))

    def ancestors(self, span: Span) -> Iterable[Span]:
        seen = {span.span_id}
        current = self.parent(span)
        for _ in range(MAX_ANCESTRY):
            if current is None or current.span_id in seen:
                return
            seen.add(current.span_id)
            yield current
            current = self.parent(current)


def _first(spans: Iterable[Span]) -> Span | None:
    return min(spans, key=lambda s: (s.start_ns, s.span_id), default=None)


def _is_sidecar_leg(span: Span) -> bool:
    return span.canonical_name in (ROLE.PREFILL, ROLE.DECODE) and span.role in (ROLE.PREFILL, ROLE.DECODE)


def _is_sidecar_server(span: Span) -> bool:
    return (
        span.role == ROLE.PROXY
        and span.canonical_name.startswith("llm_d.pd_proxy.")
        and span.canonical_name != "forward_request"
    )


class _Timing:
    """Collects stages with their sources; clamps negatives and says so."""

    def __init__(self) -> None:
        self.stages: dict[str, float] = {}
        self.sources: dict[str, str] = {}

    def put(self, stage: str, value: float | None, source: str) -> float | None:
        if value is None or not math.isfinite(value):
            return None
        if value < 0:
            source = f"{source}; clamped from {value:.6f} to 0"
            value = 0.0
        self.stages[stage] = round(value, 6)
        self.sources[stage] = source
        return value


def _engine_leg(span: Span, trees: _Trees) -> tuple[str | None, str]:
    """The leg of a vLLM `llm_request`: nearest sidecar leg ancestor first, then the span's
    own evidence (`llm_d.role`, service name, `max_tokens=1`)."""
    for ancestor in trees.ancestors(span):
        if _is_sidecar_leg(ancestor):
            return ancestor.role, f"parent chain: {_ref(ancestor)}"
    return engine_leg_hint(span)


def _warmups(
    legs: list[tuple[Span, str | None, str]], trees: _Trees, sidecar: Sequence[Span]
) -> list[tuple[Span, str]]:
    """The engine spans that are the sidecar's speculative warm-up prefill, with the evidence.

    With `x-speculative-prefill` the sidecar, once the client's response has been written,
    sends a `max_tokens=1` request of the next turn's prefix to the prefill pod (or, without
    P/D, to the decoder) from a detached goroutine (llm-d-router
    pkg/sidecar/proxy/speculative_prefill.go, `speculativePrefillMiddleware`,
    `triggerSpeculativePrefill`): one more single-token `llm_request` in the trace, after
    decode. It is no leg of the request. Proof, best first: its parent chain reaches a sidecar
    span that began after the sidecar's own request or decode leg had ended (one process's
    clock); else, not under a sidecar leg, it starts after the decode engine's span ended (two
    processes; a real prefill starts before decode does, by the whole of decode). A span the
    decode service sent is taken only with `max_tokens=1`: a later decode retry is not one."""
    decode = next(
        (s for s, leg, basis in legs if leg == ROLE.DECODE and basis.startswith("parent chain")), None
    ) or next((s for s, leg, _ in legs if leg == ROLE.DECODE), None)
    found: list[tuple[Span, str]] = []
    for span, leg, basis in legs:
        if span is decode or basis.startswith("parent chain"):
            continue
        if leg == ROLE.DECODE and _int(span.attributes.get(semconv.GEN_AI_MAX_TOKENS)) != 1:
            continue
        chain = list(trees.ancestors(span))
        proof = ""
        for ancestor in chain:
            ended = [
                s
                for s in sidecar
                if s.service_name == ancestor.service_name
                and s.trace_id == ancestor.trace_id
                and s.end_ns <= ancestor.start_ns
                and all(s is not a for a in chain)
            ]
            if ended:
                last = max(ended, key=lambda s: s.end_ns)
                proof = f"its parent {_ref(ancestor)} began after sidecar {_ref(last)} ended (one process)"
                break
        if not proof and decode is not None and span.start_ns >= decode.end_ns:
            proof = f"it starts after decode {_ref(decode)} ended"
        if proof:
            found.append((span, proof))
    return found


class _Request:
    def __init__(self, spans: Sequence[Span]) -> None:
        self.spans = sorted(spans, key=lambda s: (s.start_ns, s.trace_id, s.span_id))
        self.trees = _Trees(self.spans)
        named: dict[str, list[Span]] = {}
        for span in self.spans:
            named.setdefault(span.canonical_name, []).append(span)
        self.named = named
        # The EPP's root by role, not name: normalisation and `stitch.promote_epp_roots` give it.
        self.gateways = [s for s in self.spans if s.role == ROLE.GATEWAY]
        self.orchestrations = named.get(semconv.SPAN_GATEWAY_ORCHESTRATION) or self._server_children(
            self.gateways
        )
        self.profiles = named.get(semconv.SPAN_RUN_SCHEDULER_PROFILE, [])
        self.pick_spans = named.get(semconv.SPAN_PICK_ENDPOINTS, [])
        self.prepares = named.get("prepare_disaggregation", [])
        self.servers = [s for s in self.spans if _is_sidecar_server(s)]
        self.forwards = named.get(semconv.SPAN_PD_FORWARD, [])
        self.sc_prefill = [s for s in named.get(ROLE.PREFILL, []) if s.role == ROLE.PREFILL]
        self.sc_decode = [s for s in named.get(ROLE.DECODE, []) if s.role == ROLE.DECODE]
        self.kv_spans = [s for s in self.spans if s.role == ROLE.KV_TRANSFER]
        self.engine: dict[str, Span] = {}
        self.engine_basis: dict[str, str] = {}
        self.sidecar_spans = [*self.servers, *self.forwards, *self.sc_prefill, *self.sc_decode]
        # Speculative warm-up prefills (`x-speculative-prefill`): never a leg of the request.
        self.warmups: list[tuple[Span, str]] = []
        self._assign_engines(named.get(semconv.SPAN_VLLM_REQUEST, []))
        self._attr_order = [*self.sc_decode, *self.sc_prefill, *self.forwards, *self.servers]

    def _server_children(self, roots: list[Span]) -> list[Span]:
        """The EPP's SERVER spans directly under its root: the director's orchestration span
        under a name no table row knows yet (it was renamed once, after v0.10.0)."""
        ids = {(s.trace_id, s.span_id) for s in roots}
        return [
            s
            for s in self.spans
            if s.kind == SERVER_KIND
            and s.role != ROLE.GATEWAY
            and (s.trace_id, s.parent_span_id) in ids
            and is_epp(s)
        ]

    # -- legs --------------------------------------------------------------------------
    def _assign_engines(self, engines: list[Span]) -> None:
        legs = [(span, *_engine_leg(span, self.trees)) for span in engines]
        self.warmups = _warmups(legs, self.trees, self.sidecar_spans)
        warm = {id(span) for span, _ in self.warmups}
        unknown: list[Span] = []
        for span, leg, basis in legs:
            if id(span) in warm:
                continue
            if leg is not None and leg in (ROLE.PREFILL, ROLE.DECODE):
                span.role = leg  # the parent chain may know better than the span alone
                if leg not in self.engine:
                    self.engine[leg] = span
                    self.engine_basis[leg] = basis
                # Further engine spans of a leg (retries) add nothing to the facts.
            else:
                unknown.append(span)
        unknown.sort(key=lambda s: (s.end_ns - s.start_ns, s.span_id))
        if len(unknown) >= 2 and ROLE.PREFILL not in self.engine:
            span = unknown.pop(0)
            span.role = ROLE.PREFILL
            self.engine[ROLE.PREFILL] = span
            self.engine_basis[ROLE.PREFILL] = "shorter of two unlabelled llm_request spans"
        for span in unknown:
            for leg in (ROLE.DECODE, ROLE.PREFILL):
                if leg not in self.engine:
                    span.role = leg
                    self.engine[leg] = span
                    self.engine_basis[leg] = "only unlabelled llm_request"
                    break

    def sidecar_attr(self, key: str) -> tuple[Any, Span | None]:
        for span in self._attr_order:
            if key in span.attributes:
                return span.attributes[key], span
        return None, None

    def top(self) -> Span:
        for candidates in (self.gateways, self.servers, self.forwards, self.sc_prefill, self.sc_decode):
            roots = [s for s in candidates if self.trees.parent(s) is None]
            found = _first(roots) or _first(candidates)
            if found is not None:
                return found
        for leg in (ROLE.PREFILL, ROLE.DECODE):
            if leg in self.engine:
                return self.engine[leg]
        return self.spans[0]

    def sidecar_top(self) -> Span | None:
        return _first(self.servers) or _first(self.forwards)


def _engine_attr(req: _Request, leg: str, key: str) -> tuple[float | None, str]:
    span = req.engine.get(leg)
    if span is None:
        return None, ""
    value = _num(span.attributes.get(key))
    return (value, f"attr:{key}@{span.span_id}") if value is not None else (None, "")


def _sidecar_ms(req: _Request, *keys: str) -> tuple[float | None, str]:
    for key in keys:
        raw, span = req.sidecar_attr(key)
        value = _num(raw)
        if value is not None and span is not None:
            return value / 1000.0, f"attr:{key}@{span.span_id}"
    return None, ""


def _timing(req: _Request, kv: KVFacts | None, top: Span) -> tuple[_Timing, float | None, float | None]:
    t = _Timing()
    # Scheduling: the EPP's own orchestration span (one process).
    if req.orchestrations:
        t.put(
            STAGE.SCHEDULING,
            sum(s.duration_s for s in req.orchestrations),
            " + ".join(f"span:{_ref(s)}" for s in req.orchestrations),
        )
    elif req.profiles:
        t.put(
            STAGE.SCHEDULING,
            sum(s.duration_s for s in req.profiles),
            " + ".join(f"span:{_ref(s)}" for s in req.profiles),
        )

    # Prefill leg.
    p_queue, p_queue_src = _engine_attr(req, ROLE.PREFILL, semconv.VLLM_QUEUE)
    t.put(STAGE.PREFILL_QUEUE, p_queue, p_queue_src)
    p_model, p_model_src = _engine_attr(req, ROLE.PREFILL, semconv.VLLM_PREFILL)
    if p_model is None:
        p_ttft, p_ttft_src = _engine_attr(req, ROLE.PREFILL, semconv.VLLM_TTFT)
        if p_ttft is not None:
            p_model = p_ttft - (p_queue or 0.0)
            p_model_src = p_ttft_src + (f" - {p_queue_src}" if p_queue is not None else "")
    if p_model is None:
        p_model, p_model_src = _sidecar_ms(
            req, semconv.PD_PREFILL_DURATION_MS, semconv.PD_PREFILL_LEG_DURATION_MS
        )
        if p_model is None and req.sc_prefill:
            span = req.sc_prefill[0]
            p_model, p_model_src = span.duration_s, f"span:{_ref(span)}"
        if p_model is None and ROLE.PREFILL in req.engine:
            span = req.engine[ROLE.PREFILL]
            p_model, p_model_src = span.duration_s, f"span:{_ref(span)}"
        if p_model is not None and p_queue is not None:
            p_model, p_model_src = p_model - p_queue, f"{p_model_src} - {p_queue_src}"
    t.put(STAGE.PREFILL, p_model, p_model_src)

    # KV transfer: the railtrace shim's span, measured in the process that ran it.
    kv_s = kv.duration_s if kv is not None else None
    if kv is not None and kv_s is not None:
        t.put(STAGE.KV_TRANSFER, kv_s, f"span:{semconv.SPAN_KV_TRANSFER}@{kv.span_id}")

    # Decode leg. vLLM holds a P/D request in its queue while it pulls the KV cache, so the
    # transfer is taken out of decode time_in_queue rather than counted twice.
    d_queue, d_queue_src = _engine_attr(req, ROLE.DECODE, semconv.VLLM_QUEUE)
    d_raw_queue = d_queue
    if d_queue is not None and kv_s is not None:
        d_queue, d_queue_src = d_queue - kv_s, f"{d_queue_src} - span:{semconv.SPAN_KV_TRANSFER}@{kv.span_id}"  # type: ignore[union-attr]
    t.put(STAGE.DECODE_QUEUE, d_queue, d_queue_src)
    d_model, d_model_src = _engine_attr(req, ROLE.DECODE, semconv.VLLM_INFERENCE)
    if d_model is None:
        first, first_src = _engine_attr(req, ROLE.DECODE, semconv.VLLM_PREFILL)
        rest, rest_src = _engine_attr(req, ROLE.DECODE, semconv.VLLM_DECODE)
        if first is not None and rest is not None:
            d_model, d_model_src = first + rest, f"{first_src} + {rest_src}"
    if d_model is None:
        e2e, e2e_src = _engine_attr(req, ROLE.DECODE, semconv.VLLM_E2E)
        if e2e is None and ROLE.DECODE in req.engine:
            span = req.engine[ROLE.DECODE]
            e2e, e2e_src = span.duration_s, f"span:{_ref(span)}"
        if e2e is None:
            e2e, e2e_src = _sidecar_ms(req, semconv.PD_DECODE_DURATION_MS, semconv.PD_DECODE_LEG_DURATION_MS)
        if e2e is None and req.sc_decode:
            span = req.sc_decode[0]
            e2e, e2e_src = span.duration_s, f"span:{_ref(span)}"
        if e2e is not None:
            d_model, d_model_src = e2e, e2e_src
            if d_raw_queue is not None:
                d_model, d_model_src = e2e - d_raw_queue, f"{e2e_src} - {d_queue_src.split(' - ')[0]}"
    t.put(STAGE.DECODE, d_model, d_model_src)

    # End to end: the outermost hop's own span (a coordinator's phases: `_phases_e2e`).
    e2e_s = top.duration_s
    t.sources["e2e"] = f"span:{_ref(top)}"
    phases = _phases(req, top)
    if phases is not None:
        e2e_s, t.sources["e2e"] = _phases_e2e(*phases)

    ttft_s = _ttft(req, t)
    return t, ttft_s, e2e_s


def _one_process(a: Span, b: Span) -> bool:
    """Sent by one process, as far as the spans tell: same service and same resource."""
    return a.service_name == b.service_name and a.resource == b.resource


def _phases(req: _Request, top: Span) -> tuple[Span, Span] | None:
    """(prefill phase's EPP root, decode phase's EPP root) of a request llm-d's coordinator
    sent as two phases (docs/normalisation.md §10): the decode engine's nearest EPP root is
    another than `top`, the prefill phase's root (in another trace, or beside it under a
    traced client's span). None for any other request."""
    engine = req.engine.get(ROLE.DECODE)
    if engine is None or top.role != ROLE.GATEWAY:
        return None
    root = next((a for a in req.trees.ancestors(engine) if a.role == ROLE.GATEWAY), None)
    if root is None or root is top:
        return None
    return top, root


def _phases_e2e(first: Span, last: Span) -> tuple[float, str]:
    """A coordinator request's end to end from its two EPP roots: first start to last end
    when one EPP process sent both (one clock), else the sum of the phases' own durations,
    which leaves out the untraced coordinator's time between them."""
    if _one_process(first, last):
        value = max(0.0, (last.end_ns - first.start_ns) / 1e9)
        return value, f"span:{_ref(first)}..{_ref(last)} (coordinator phases, one process)"
    return (
        first.duration_s + last.duration_s,
        f"span:{_ref(first)} + span:{_ref(last)} (coordinator phases, two processes: the time "
        "between them not counted)",
    )


def _bounded_offset(outer: Span, inner: Span) -> tuple[float, str]:
    """Start of `inner` after start of `outer`, two processes apart: bounded by the
    difference of their own durations, so clock skew cannot stretch it past that."""
    raw = (inner.start_ns - outer.start_ns) / 1e9
    bound = max(0.0, outer.duration_s - inner.duration_s)
    value = min(max(raw, 0.0), bound)
    note = f"span:{_ref(outer)}..{_ref(inner)} start offset"
    if value != raw:
        note += f" (bounded from {raw:.6f} to [0, {bound:.6f}])"
    return value, note


def _ttft(req: _Request, t: _Timing) -> float | None:
    """Client-side time to first token: gateway to sidecar, sidecar to decode start (the
    sidecar's own `true_ttft_ms`), then the decode engine's own time to first token."""
    d_ttft, d_ttft_src = _engine_attr(req, ROLE.DECODE, semconv.VLLM_TTFT)
    if d_ttft is None:
        return None
    parts: list[str] = []
    total = 0.0
    sidecar = req.sidecar_top()
    next_hop = sidecar or req.engine.get(ROLE.PREFILL) or req.engine.get(ROLE.DECODE)
    gateway = _first(req.gateways)
    phases = _phases(req, gateway) if gateway is not None and sidecar is None else None
    if phases is not None:
        # A coordinator's phases: the prefill phase and the untraced coordinator's time up to
        # the decode phase measured on the EPP's clock, then into the decode engine.
        first, last = phases
        decode = req.engine[ROLE.DECODE]
        if _one_process(first, last):
            total += max(0.0, (last.start_ns - first.start_ns) / 1e9)
            parts.append(f"span:{_ref(first)}..{_ref(last)} start offset (one process)")
            offset, note = _bounded_offset(last, decode)
            total += offset
            parts.append(note)
            total += max(0.0, d_ttft)
            parts.append(d_ttft_src)
            t.sources["ttft"] = " + ".join(parts)
            return round(total, 6)
    if gateway is not None and next_hop is not None:
        offset, note = _bounded_offset(gateway, next_hop)
        total += offset
        parts.append(note)
    if sidecar is not None:
        true_ttft, src = _sidecar_ms(req, semconv.PD_TRUE_TTFT_MS)
        if true_ttft is None and req.sc_decode:
            leg = _first(req.sc_decode)
            assert leg is not None
            if leg.trace_id == sidecar.trace_id and leg.service_name == sidecar.service_name:
                true_ttft = (leg.start_ns - sidecar.start_ns) / 1e9
                src = f"span:{_ref(sidecar)}..{_ref(leg)} start offset (one process)"
        if true_ttft is None:
            true_ttft, src = _sidecar_ms(
                req, semconv.PD_PREFILL_DURATION_MS, semconv.PD_PREFILL_LEG_DURATION_MS
            )
        if true_ttft is not None:
            total += max(0.0, true_ttft)
            parts.append(src)
    elif ROLE.PREFILL in req.engine and ROLE.DECODE in req.engine:
        span = req.engine[ROLE.PREFILL]
        e2e, src = _engine_attr(req, ROLE.PREFILL, semconv.VLLM_E2E)
        if e2e is None:
            e2e, src = span.duration_s, f"span:{_ref(span)}"
        total += max(0.0, e2e)
        parts.append(src)
    total += max(0.0, d_ttft)
    parts.append(d_ttft_src)
    t.sources["ttft"] = " + ".join(parts)
    return round(total, 6)


def _kv_facts(req: _Request) -> KVFacts | None:
    spans = sorted(req.kv_spans, key=lambda s: (s.start_ns, s.span_id))
    if not spans:
        return None
    first = spans[0]

    def attr(key: str, conv: Callable[[Any], Any] = _str) -> Any:
        for span in spans:
            value = conv(span.attributes.get(key))
            if value is not None:
                return value
        return None

    transports = []
    for span in spans:
        value = _str(span.attributes.get(semconv.KV_TRANSPORT))
        value = value.lower() if value else None
        if value is not None and value in TRANSPORTS and value not in transports:
            transports.append(value)
    known = [t for t in transports if t != UNKNOWN_TRANSPORT]
    transport = TCP if TCP in known else (known[0] if known else UNKNOWN_TRANSPORT)

    devices: list[str] = []
    for span in spans:
        for device in _str_list(span.attributes.get(semconv.KV_DEVICES)):
            if device not in devices:
                devices.append(device)
    split = [v for v in _num_list(first.attributes.get(semconv.KV_SPLIT)) if v is not None]
    if len(spans) > 1:
        split = []

    byte_values = [b for b in (_int(s.attributes.get(semconv.KV_BYTES)) for s in spans) if b is not None]
    desc_values = [
        d for d in (_int(s.attributes.get(semconv.KV_DESCRIPTORS)) for s in spans) if d is not None
    ]
    same_process = len({(s.service_name, str(s.resource.get(semconv.RES_POD))) for s in spans}) == 1
    if same_process:
        duration = (max(s.end_ns for s in spans) - min(s.start_ns for s in spans)) / 1e9
    else:
        duration = max(s.duration_s for s in spans)

    error = attr(semconv.ERROR_TYPE)
    if error is None:
        failed = next((s for s in spans if s.status_code == 2), None)
        if failed is not None:
            error = failed.status_message or "error"

    resource = first.resource if isinstance(first.resource, dict) else {}
    return KVFacts(
        span_id=first.span_id,
        operation=attr(semconv.KV_OPERATION),
        connector=attr(semconv.KV_CONNECTOR),
        backend=attr(semconv.KV_BACKEND),
        bytes=_int64_sum(byte_values),
        descriptors=_int64_sum(desc_values),
        duration_s=round(max(0.0, duration), 9),
        transport=transport,
        devices=devices,
        split=split,
        local_gpu=attr(semconv.KV_LOCAL_GPU),
        remote_host=attr(semconv.KV_REMOTE_HOST),
        remote_engine_id=attr(semconv.KV_REMOTE_ENGINE_ID),
        error_type=error,
        evidence=attr(semconv.KV_EVIDENCE),
        pod=_str(resource.get(semconv.RES_POD)),
        node=_str(resource.get(semconv.RES_NODE)),
        host=_str(resource.get(semconv.RES_HOST)),
    )


def _profile_of(req: _Request, span: Span) -> str:
    for candidate in (span, *req.trees.ancestors(span)):
        for key in (semconv.ROUTER_PROFILE, semconv.EPP_PROFILE_NAME):
            value = _str(candidate.attributes.get(key))
            if value:
                return value
        if candidate.canonical_name == semconv.SPAN_RUN_SCHEDULER_PROFILE:
            break
    return ""


def _scorer_scores(raw: Any) -> dict[str, float]:
    if isinstance(raw, dict):
        parsed: Any = raw
    elif isinstance(raw, str):
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {}
    else:
        return {}
    if not isinstance(parsed, dict):
        return {}
    return {str(k): v for k, v in ((k, _num(v)) for k, v in parsed.items()) if v is not None}


def _picks(req: _Request) -> list[RouterPick]:
    picks: list[RouterPick] = []
    for span in req.pick_spans:
        attrs = span.attributes
        profile = _profile_of(req, span)
        shim_endpoints = _str_list(attrs.get(semconv.ROUTER_CANDIDATE_ENDPOINTS))
        top = _str_list(attrs.get(semconv.EPP_PICKER_TOP_ENDPOINTS))
        # Only the router shim records what was picked. llm-d's `top_endpoints` is written
        # before the pick, ranked by score then id, and the max-score picker shuffles ties
        # (docs/normalisation.md §2.8): it ranks candidates, it never names the choice. A
        # leg's pod comes from what was dispatched (`_endpoint`).
        chosen = _str(attrs.get(semconv.ROUTER_CHOSEN))
        candidates: list[Candidate] = []
        if shim_endpoints:
            scores = _num_list(attrs.get(semconv.ROUTER_CANDIDATE_SCORES))
            per_scorer = attrs.get(semconv.ROUTER_CANDIDATE_SCORER_SCORES)
            per_scorer = per_scorer if isinstance(per_scorer, list) else []
            topo = attrs.get(semconv.ROUTER_CANDIDATE_TOPOLOGY)
            topo = topo if isinstance(topo, list) else []
            pods = attrs.get(semconv.ROUTER_CANDIDATE_PODS)
            pods = pods if isinstance(pods, list) else []
            for i, endpoint in enumerate(shim_endpoints):
                candidates.append(
                    Candidate(
                        endpoint=endpoint,
                        score=scores[i] if i < len(scores) else None,
                        scorer_scores=_scorer_scores(per_scorer[i]) if i < len(per_scorer) else {},
                        topology=_str(topo[i]) if i < len(topo) else None,
                        pod=_str(pods[i]) if i < len(pods) else None,
                    )
                )
            source = "router_shim"
        else:
            scores = _num_list(attrs.get(semconv.EPP_PICKER_TOP_SCORES))
            candidates = [
                Candidate(endpoint=e, score=scores[i] if i < len(scores) else None) for i, e in enumerate(top)
            ]
            source = "epp_picker"
        picks.append(
            RouterPick(
                profile=profile, chosen=chosen, candidates=candidates, span_id=span.span_id, source=source
            )
        )
    return picks


def _pick_address(values: Iterable[str | None]) -> str | None:
    """First non-loopback `host:port`; router endpoint ids like `namespace/pod` are not addresses."""
    found = [v for v in values if v and "/" not in v]
    for value in found:
        if not value.lower().startswith(LOOPBACK_PREFIXES):
            return value
    return found[0] if found else None


def _client_target(req: _Request, leg: str) -> str | None:
    """`server.address:port` of the sidecar's outbound HTTP span under that leg."""
    for span in req.spans:
        if span.canonical_name not in ntable.HTTP_CLIENT_NAMES:
            continue
        nearest = next((a for a in req.trees.ancestors(span) if _is_sidecar_leg(a)), None)
        if nearest is None or nearest.role != leg:
            continue
        host = _str(span.attributes.get(semconv.SERVER_ADDRESS))
        port = _int(span.attributes.get(semconv.SERVER_PORT))
        if host:
            return f"{host}:{port}" if port is not None else host
    return None


def _endpoint(req: _Request, leg: str, picks: list[RouterPick]) -> Endpoint:
    addresses: list[str | None] = []
    if leg == ROLE.PREFILL:
        addresses.append(_str(req.sidecar_attr(semconv.PD_PREFILL_TARGET)[0]))
    else:
        for span in req.sc_decode:
            addresses.append(_str(span.attributes.get(semconv.PD_DECODE_TARGET)))
    addresses.append(_client_target(req, leg))
    if leg == ROLE.PREFILL:
        for span in req.prepares:
            host = _str(span.attributes.get(semconv.EPP_PD_PREFILL_ADDRESS))
            port = span.attributes.get(semconv.EPP_PD_PREFILL_PORT)
            if host:
                addresses.append(f"{host}:{port}" if isinstance(port, str | int) and port != "" else host)
    addresses.extend(p.chosen for p in picks if p.profile == leg)
    endpoint = Endpoint(address=_pick_address(addresses))
    engine = req.engine.get(leg)
    if engine is not None:
        resource = engine.resource if isinstance(engine.resource, dict) else {}
        pod, pod_ip, claimed_pod, peer, vouched = _claimed_identity(resource)
        endpoint.pod, endpoint.pod_ip, endpoint.claimed_pod, endpoint.peer = pod, pod_ip, claimed_pod, peer
        if vouched:  # a sender's own node and host names are claims like its pod's: not read
            endpoint.node = _str(resource.get(semconv.RES_NODE))
            endpoint.host = _str(resource.get(semconv.RES_HOST))
        endpoint.service = engine.service_name or None
        endpoint.span_id = engine.span_id
        if endpoint.pod:
            endpoint.identity = IDENTITY.K8S_RESOURCE
    if endpoint.pod is None:
        # The EPP's chosen endpoint for this leg, `<namespace>/<pod>-rank-<i>`; a weaker
        # source than the engine's own address, which identity resolution tries first.
        for pick in picks:
            if pick.profile == leg and pick.chosen:
                pod = ntable.endpoint_pod(pick.chosen)
                if pod:
                    endpoint.pod, endpoint.identity = pod, IDENTITY.EPP_PICK
                    break
    if leg == ROLE.DECODE:
        # nixlv2: the sidecar runs in the decode pod, so its pod (when the collector named it)
        # and its sender address are the decode pod's.
        for span in req.sidecar_spans:
            resource = span.resource if isinstance(span.resource, dict) else {}
            pod, pod_ip, _claimed, peer, _vouched = _claimed_identity(resource)
            if endpoint.pod is None and pod:
                endpoint.pod, endpoint.identity = pod, IDENTITY.SIDECAR_POD
            endpoint.sidecar_peer = endpoint.sidecar_peer or pod_ip or peer
    return endpoint


def _claimed_identity(
    resource: dict[str, Any],
) -> tuple[str | None, str | None, str | None, str | None, bool]:
    """(pod name, pod IP, claimed pod name, sender address, vouched) of a resource as far as they are
    believed (docs/reliability.md section 11): a trusted collector's `k8s.pod.name` and
    `k8s.pod.ip`, or -- when the sender vouches for itself (`railtrace.otlp.claims=sender`) --
    its `k8s.pod.ip` only where it is the sender's address, and its `k8s.pod.name` only as a
    claim that identity resolution checks against the topology (the third value); `vouched`
    is False then, and its node and host names are not read either. Resources without the
    stamp (not received by the service's receivers) are read as they are."""
    pod = _str(resource.get(semconv.RES_POD))
    pod_ip = _str(resource.get(semconv.RES_POD_IP))
    peer = _str(resource.get(semconv.RES_OTLP_PEER))
    if resource.get(semconv.RES_OTLP_CLAIMS) == semconv.CLAIMS_SENDER:
        return None, (pod_ip if pod_ip == peer else None), pod, peer, False
    return pod, pod_ip, None, peer, True


def _kv_source(req: _Request) -> dict[str, str] | None:
    """The pod the sidecar had the KV cache pulled from, as `coverage.kv_source` ({address,
    span_id}): `llm_d.pd_proxy.kv_cache_source`, set on its `forward_request` span from
    `x-kv-cache-source-host-port` once the connector can pull P2P and the value is an allowed
    host:port (llm-d-router pkg/sidecar/proxy/dispatch.go; docs/normalisation.md, "P2P KV
    sources"). The verdicts judge the transfer against it (`verdicts.judge`)."""
    raw, span = req.sidecar_attr(semconv.PD_KV_CACHE_SOURCE)
    address = _str(raw)
    if address is None or span is None or not address.strip():
        return None
    return {"address": address.strip()[:256], "span_id": span.span_id}


def _join_evidence(req: _Request, primary: str) -> tuple[str, str | None] | None:
    """Which spans of other traces were joined to the primary trace, and on which key."""
    others = sorted({s.trace_id for s in req.spans} - {primary})
    if not others:
        return None
    primary_keys: set[str] = set()
    for span in req.spans:
        if span.trace_id == primary:
            primary_keys.update(span_request_keys(span))
    notes: list[str] = []
    first_span: str | None = None
    for trace_id in others:
        spans = [s for s in req.spans if s.trace_id == trace_id]
        root = next((s for s in spans if req.trees.parent(s) is None), spans[0])
        how = "shared request id"
        for span in spans:
            for attr in ntable.KEY_ATTRIBUTES:
                raw = span.attributes.get(attr)
                values = raw if isinstance(raw, list) else [raw]
                engine_form = attr in ntable.ENGINE_ID_ATTRIBUTES
                if any(normalize_request_id(v, engine_form) in primary_keys for v in values):
                    shown = next(v for v in values if normalize_request_id(v, engine_form) in primary_keys)
                    how = f"{_ref(span)} {attr}={shown}"
                    break
            else:
                continue
            break
        first_span = first_span or root.span_id
        notes.append(f"trace {trace_id} (root {_ref(root)}) joined by {how}")
    return (
        f"hops of this request arrived in {len(others) + 1} traces: " + "; ".join(notes),
        first_span,
    )


def coverage_of(req: _Request) -> dict[str, Any]:
    """Which hops of the request were traced (`semconv.Hop`) and the tracing recipe that
    explains them (`semconv.Recipe`). An untraced hop is the deployment's choice (llm-d's
    guide traces the decode engine only; the sidecar's tracing is off by default), not a
    broken trace."""
    hops = {
        HOP.EPP: any(s.role in (ROLE.GATEWAY, ROLE.SCHEDULING) for s in req.spans),
        HOP.SIDECAR: bool(req.sidecar_spans) or any(s.role == ROLE.PROXY for s in req.spans),
        HOP.PREFILL_ENGINE: ROLE.PREFILL in req.engine,
        HOP.DECODE_ENGINE: ROLE.DECODE in req.engine,
        HOP.KV_TRANSFER: bool(req.kv_spans),
    }
    seen = [hop for hop, present in hops.items() if present]
    engines = hops[HOP.PREFILL_ENGINE], hops[HOP.DECODE_ENGINE]
    if hops[HOP.EPP] and hops[HOP.SIDECAR] and all(engines):
        recipe = RECIPE.FULL
    elif engines == (False, True) and not hops[HOP.EPP] and not hops[HOP.SIDECAR]:
        recipe = RECIPE.DECODE_ONLY
    elif hops[HOP.EPP] and not hops[HOP.SIDECAR] and not any(engines) and not hops[HOP.KV_TRANSFER]:
        recipe = RECIPE.EPP_ONLY
    elif all(engines) and not hops[HOP.SIDECAR]:
        recipe = RECIPE.ENGINES
    else:
        recipe = RECIPE.PARTIAL
    return {
        "hops": seen,
        "missing": [hop for hop, present in hops.items() if not present and hop != HOP.KV_TRANSFER],
        "recipe": recipe,
        "traces": len({s.trace_id for s in req.spans}),
    }


def _missing_hops(req: _Request) -> list[tuple[str, str | None]]:
    """Traced hops that lost their link. Hops the deployment does not trace are not here:
    they are in `coverage`. The cases: a prefill engine span whose decode engine span -- traced
    wherever prefill is, in every recipe -- is missing; a KV-transfer span that joined no engine or
    sidecar span although it carries the request's id."""
    missing: list[tuple[str, str | None]] = []
    engines = req.engine
    if ROLE.PREFILL in engines and ROLE.DECODE not in engines and not _decode_leg_failed(req):
        span = engines[ROLE.PREFILL]
        missing.append(
            (
                f"prefill leg {_ref(span)} has no decode vLLM {semconv.SPAN_VLLM_REQUEST} in any trace",
                span.span_id,
            )
        )
    router_only = all(s.role in ROUTER_ONLY_ROLES for s in req.spans)
    if not req.sidecar_spans and not engines and not router_only and req.kv_spans:
        span = req.kv_spans[0]
        missing.append((f"{_ref(span)} has no sidecar or vLLM span in any trace", span.span_id))
    return missing


def _decode_leg_failed(req: _Request) -> bool:
    """The sidecar's decode leg ended in error. The sidecar then drops the connection, vLLM
    aborts the request, and `OutputProcessor.abort_requests` ends it without `do_tracing`
    (vllm/v1/engine/output_processor.py l.471-530 and l.688-707, vLLM 0.21.0): no decode
    `llm_request` is written, so its absence is no lost span."""
    return any(s.status_code == 2 for s in req.sc_decode)


def _request_id(req: _Request) -> str | None:
    raw, _ = req.sidecar_attr(semconv.PD_REQUEST_ID)
    key = normalize_request_id(raw)
    if key:
        return key
    ordered = [req.engine.get(ROLE.DECODE), req.engine.get(ROLE.PREFILL), *req.kv_spans, *req.spans]
    for span in ordered:
        if span is not None:
            keys = span_request_keys(span)
            if keys:
                return keys[0]
    return None


def _model(req: _Request) -> str | None:
    for key in (semconv.GEN_AI_REQUEST_MODEL, semconv.TARGET_MODEL, semconv.GEN_AI_RESPONSE_MODEL):
        for span in req.spans:
            value = _str(span.attributes.get(key))
            if value:
                return value
    return None


def build(spans: Sequence[Span], notes: JoinNotes | None = None) -> RequestFacts | None:
    """Facts of one request, or None when the group is not a request (e.g. `index_evict`).

    `notes`: what the join rules rejected or could not verify (`railtrace.assembly.joins`),
    kept in `coverage` as `rejected` and `unverified`."""
    if not any(s.role in REQUEST_ROLE_VALUES for s in spans):
        return None
    req = _Request(spans)
    top = req.top()
    primary = top.trace_id
    kv = _kv_facts(req)
    timing, ttft_s, e2e_s = _timing(req, kv, top)
    picks = _picks(req)
    flags: list[Flag] = []
    evidence: list[str] = []
    flag_span: str | None = None
    coverage = coverage_of(req)
    joined = _join_evidence(req, primary)
    if joined is not None:
        coverage["joined"] = joined[0]  # the release's propagation gap, closed by the ids
    if notes is not None:
        if notes.rejected:
            coverage["rejected"] = list(notes.rejected)
        if notes.unverified:
            coverage["unverified"] = list(notes.unverified)
        if notes.dropped:
            coverage["notes_dropped"] = notes.dropped
    source = _kv_source(req)
    if source is not None:
        coverage[KV_SOURCE] = source
    if req.warmups:
        coverage["speculative_prefill"] = [
            f"{_ref(span)} ({span.service_name}) is a speculative warm-up prefill, not this "
            f"request's prefill: {proof}"
            for span, proof in req.warmups
        ]
    missing = _missing_hops(req)
    for note, span_id in missing:
        evidence.append(note)
        flag_span = flag_span or span_id
    if evidence:
        flags.append(Flag(name=BROKEN_TRACE, evidence="; ".join(evidence), span_id=flag_span))
    for leg, basis in sorted(req.engine_basis.items()):
        timing.sources[f"{leg}_leg"] = basis
    # The outermost traced hop has no parent among the spans: the gateway or sidecar root, or,
    # when neither is traced (llm-d's decode-only recipe), the engine's own span.
    rooted = req.trees.parent(top) is None
    return RequestFacts(
        trace_id=primary,
        trace_ids=[primary, *sorted({s.trace_id for s in req.spans} - {primary})],
        request_id=_request_id(req),
        model=_model(req),
        start_ns=top.start_ns,
        end_ns=max(top.end_ns, top.start_ns, *(p.end_ns for p in _phases(req, top) or ())),
        ttft_s=ttft_s,
        e2e_s=round(e2e_s, 6) if e2e_s is not None else None,
        breakdown_s=timing.stages,
        prefill=_endpoint(req, ROLE.PREFILL, picks),
        decode=_endpoint(req, ROLE.DECODE, picks),
        kv=kv,
        picks=picks,
        flags=flags,
        span_count=len(req.spans),
        complete=rooted and not missing,
        timing_sources=timing.sources,
        coverage=coverage,
    )
