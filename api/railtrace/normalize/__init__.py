"""Normalisation: give every received span a role, its current llm-d name, its generation
and its request join key, so that assembly reads one vocabulary whatever version of llm-d,
the legacy GIE EPP, vLLM or railtrace's shims sent it. The names live in `table.py` only.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import repeat
from typing import Any

from railtrace.model import Span
from railtrace.normalize import table
from railtrace.normalize.table import Rule, lookup
from railtrace_tracing import semconv
from railtrace_tracing.semconv import ROLE

__all__ = [
    "engine_leg_hint",
    "is_epp",
    "normalize_request_id",
    "normalize_span",
    "request_id_forms",
    "span_request_keys",
]


def normalize_request_id(value: Any, engine_form: bool = False) -> str | None:
    """One request id in its joinable form: lower case, vLLM's `chatcmpl-`/`cmpl-` prefix and
    `-N` suffix removed, so the sidecar's UUID, `x-request-id` and vLLM's id meet.

    `engine_form`: the value is vLLM's engine-internal id (a KV connector's `req_id`), which
    carries a random `-<8 hex>` suffix after the public id; it is removed too.
    """
    if not isinstance(value, str):
        return None
    return _normalize_id(value, engine_form)


def request_id_forms(value: str) -> list[str]:
    """Every joinable key an id an operator holds may stand for, most likely first: the id
    read as a public id, then read as vLLM's engine-internal id (docs/normalisation.md)."""
    forms: list[str] = []
    for engine_form in (False, True):
        key = _normalize_id(value, engine_form) if isinstance(value, str) else None
        if key and key not in forms:
            forms.append(key)
    return forms


@lru_cache(maxsize=8192)  # a request's spans repeat its ids; assembly reads them all together
def _normalize_id(value: str, engine_form: bool = False) -> str | None:
    if "\x00" in value:  # no id of the stack's; PostgreSQL's text could not hold it as a key
        return None
    key = value.strip().lower()
    if engine_form:
        key = table.REQUEST_ID_ENGINE_SUFFIX.sub("", key)
    for prefix in table.REQUEST_ID_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix) :]
            if prefix in table.REQUEST_ID_SUFFIXED_PREFIXES:
                key = table.REQUEST_ID_INDEX_SUFFIX.sub("", key)
            break
    return key if len(key) >= table.MIN_KEY_CHARS else None


def span_request_keys(span: Span) -> list[str]:
    """Normalised join keys of one span, strongest first, without duplicates.

    Worked out once per span and kept on it (`Span.join_keys`); callers must not change the
    list. The attributes of a received span do not change after decoding.
    """
    keys = span.join_keys
    if keys is not None:
        return keys
    keys = []
    attrs = span.attributes
    get = attrs.get if isinstance(attrs, dict) else {}.get
    for attr in table.KEY_ATTRIBUTES:  # most spans hold none or one of these
        raw = get(attr)
        if raw is None:
            continue
        engine_form = attr in table.ENGINE_ID_ATTRIBUTES
        for value in raw if isinstance(raw, list) else (raw,):
            if isinstance(value, str):
                key = _normalize_id(value, engine_form)
                if key and key not in keys:
                    keys.append(key)
    span.join_keys = keys
    return keys


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def engine_leg_hint(span: Span) -> tuple[str | None, str]:
    """Which leg a vLLM `llm_request` served, from the span alone, and the evidence used.

    Order: railtrace's engine shim `llm_d.role`; the llm-d guide's service names
    `vllm-prefill`/`vllm-decode`; the sidecar's prefill request shape (`max_tokens=1`, one
    completion token). Assembly overrides this with the parent chain when it has one.
    """
    attrs = span.attributes if isinstance(span.attributes, dict) else {}
    role = attrs.get(semconv.LLM_D_ROLE)
    if role in (ROLE.PREFILL, ROLE.DECODE):
        return str(role), semconv.LLM_D_ROLE
    service = span.service_name.lower() if isinstance(span.service_name, str) else ""
    if table.VLLM_PREFILL_SERVICE_HINT in service:
        return ROLE.PREFILL, "service.name"
    if table.VLLM_DECODE_SERVICE_HINT in service:
        return ROLE.DECODE, "service.name"
    out = _int(attrs.get(semconv.VLLM_COMPLETION_TOKENS))
    if out is None:
        out = _int(attrs.get(semconv.GEN_AI_OUTPUT_TOKENS))
    max_tokens = _int(attrs.get(semconv.GEN_AI_MAX_TOKENS))
    if max_tokens == 1 and out in (1, None):
        return ROLE.PREFILL, "gen_ai.request.max_tokens=1"
    if out is not None and out > 1:
        return ROLE.DECODE, "gen_ai.usage.completion_tokens>1"
    return None, ""


def _is_bbr(span: Span) -> bool:
    scope = span.scope_name or ""
    return scope.startswith(table.BBR_SCOPE_PREFIX) or span.service_name in table.BBR_SERVICES


def is_epp(span: Span) -> bool:
    """Whether the EPP sent this span, by what survives a rename: its tracer's scope
    (`llm-d-router/pkg/epp/...`) or an EPP service name; never the body-based router."""
    scope = span.scope_name if isinstance(span.scope_name, str) else ""
    if scope.startswith(table.BBR_SCOPE_PREFIX):
        return False
    return scope.startswith(table.EPP_SCOPE_PREFIXES) or span.service_name in table.EPP_SERVICES


def _is_sidecar(span: Span) -> bool:
    scope = span.scope_name or ""
    return (
        span.service_name in table.SIDECAR_SERVICES
        or scope == table.SIDECAR_SCOPE
        or scope.startswith(table.OTELHTTP_SCOPE_PREFIX)
    )


# Whether a set of attribute names (in the order a sender writes them) holds a router-shim
# name. Spans of one kind from one sender share their names, so a service sees few sets, and
# a lookup costs a quarter of testing every name. Bounded: sets of short names only, cleared
# when full (hostile input).
_ROUTER_NAME_SETS: dict[tuple[str, ...], bool] = {}
MAX_NAME_SETS = 256  # with at most 256 names a span (decoding) and 4,096 characters: < 5 MB
MAX_NAME_SET_CHARS = 4096


def _has_router_shim_key(attrs: dict[str, Any]) -> bool:
    """Whether any attribute name starts with the router shim's prefix (runs for every span)."""
    names = tuple(attrs)
    found = _ROUTER_NAME_SETS.get(names)
    if found is None:
        found = any(map(str.startswith, names, repeat(table.ROUTER_SHIM_PREFIX)))
        if sum(map(len, names)) <= MAX_NAME_SET_CHARS:
            if len(_ROUTER_NAME_SETS) >= MAX_NAME_SETS:
                _ROUTER_NAME_SETS.clear()
            _ROUTER_NAME_SETS[names] = found
    return found


def _generation(span: Span, rule: Rule) -> str:
    scope = span.scope_name or ""
    attrs = span.attributes
    if scope.startswith(table.RAILTRACE_SCOPE_PREFIX) or _has_router_shim_key(attrs):
        return table.RAILTRACE
    if rule.component in ("epp", "kv_indexer"):
        if scope.startswith(table.GIE_SCOPE_PREFIX):
            return table.EPP_SERVICES.get(span.service_name) or table.GIE
        hinted = table.EPP_SERVICES.get(span.service_name)
        if hinted:
            return hinted
    if rule.component == "sidecar" and rule.pattern in ("llm_d.pd_proxy.prefill", "llm_d.pd_proxy.decode"):
        connector = attrs.get(semconv.PD_CONNECTOR)
        parallel = any(k in attrs for k in table.PARALLEL_DISPATCH_ATTRS)
        if connector in table.PREFIXED_STAGE_CONNECTORS or parallel:
            return table.CURRENT
        return table.V0_8
    return rule.generation


def normalize_span(span: Span) -> Span:
    """Fill `role`, `canonical_name`, `generation` and `request_key` in place; never raises.

    Unknown names keep their name as canonical name, role `other`, generation "".
    """
    try:
        if not isinstance(span.attributes, dict):
            span.attributes = {}
        name = span.name if isinstance(span.name, str) else str(span.name)
        rule = lookup(name)
        if rule is not None and rule.epp_only and not is_epp(span):
            rule = None  # a generic name (`request`) from anyone but the EPP
        if rule is None:
            span.canonical_name = name
            if name in table.HTTP_CLIENT_NAMES and _is_sidecar(span):
                span.role = ROLE.PROXY
                span.generation = table.CURRENT
            else:
                span.role = ROLE.OTHER
                span.generation = table.NO_GENERATION
        else:
            span.canonical_name = rule.canonical or name
            span.role = rule.role
            span.generation = _generation(span, rule)
            if name == semconv.SPAN_VLLM_REQUEST:
                leg, _ = engine_leg_hint(span)
                span.role = leg or ROLE.DECODE
            elif rule.role == ROLE.GATEWAY and _is_bbr(span):
                span.role = ROLE.OTHER  # the body-based router's span, not the EPP's
                span.generation = table.GIE
        keys = span_request_keys(span)
        span.request_key = keys[0] if keys else None
    except Exception:  # odd input must never stop ingest
        span.role = ROLE.OTHER
        span.canonical_name = span.name if isinstance(span.name, str) else ""
        span.generation = table.NO_GENERATION
        span.request_key = None
    return span
