"""The one normalisation table: every span name llm-d, vLLM and railtrace have emitted.

llm-d renamed its spans twice in 2026 (router v0.9.0, then the KV-indexer renames after
v0.10.0), the legacy gateway-api-inference-extension EPP used yet other scopes and service
names, and the P/D sidecar's span shapes differ by connector. Ingest must read all of them,
so each name maps here to the current llm-d name (`canonical`), the part it plays in a P/D
request (`role`) and the generation that emits it. Nothing else in railtrace may hold a
copy of these names; docs/normalisation.md documents this table and a test keeps the two
in step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from railtrace_tracing import semconv
from railtrace_tracing.semconv import ROLE

# Generation labels (docs/interfaces.md).
CURRENT = "current"
V0_10 = "v0.10"
V0_9 = "v0.9"
V0_8 = "v0.8"
GIE = "gie"
VLLM = "vllm"
RAILTRACE = "railtrace"
# No generation can be told (an unlisted name, or a service name shared by releases): left
# empty, as stored, so it is never mistaken for a generation called "unknown".
NO_GENERATION = ""


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the table. `pattern` is an exact span name unless `regex` is set."""

    pattern: str
    canonical: str | None  # None keeps the received name (e.g. `llm_d.epp.scorer.<type>`)
    role: str  # a `semconv.ROLE` value, as set on the span
    generation: str
    component: str  # epp | kv_indexer | sidecar | vllm | railtrace
    note: str = ""
    regex: bool = False


# `generation` is the newest generation whose names the span matches: a name llm-d still
# emits is `current` (even if v0.9 introduced it); a renamed one carries the last generation
# that used it. Service and scope hints below move a span to `v0.8` or `gie`.
RULES: tuple[Rule, ...] = (
    # -- EPP / router, current (HEAD) and v0.9/v0.10 --------------------------------------
    Rule("gateway.request", None, ROLE.GATEWAY, CURRENT, "epp", "EPP server span; GIE and <= v0.8 too"),
    Rule("gateway.request_orchestration", None, ROLE.SCHEDULING, CURRENT, "epp", "director"),
    Rule("run_scheduler_profile", None, ROLE.SCHEDULING, CURRENT, "epp", "one profile (prefill/decode)"),
    Rule("filter_endpoints", None, ROLE.SCHEDULING, CURRENT, "epp"),
    Rule("llm_d.epp.scoring", None, ROLE.SCHEDULING, CURRENT, "epp", "scoring subtree, PR #1834"),
    Rule("pick_endpoints", None, ROLE.SCHEDULING, CURRENT, "epp", "picker; router shim adds candidates"),
    Rule("pick_disagg_profile", None, ROLE.SCHEDULING, CURRENT, "epp", "P/D decision"),
    Rule("pick_pd_profile", None, ROLE.SCHEDULING, CURRENT, "epp", "deprecated pd-profile-handler"),
    Rule("prepare_disaggregation", None, ROLE.SCHEDULING, CURRENT, "epp", "carries prefill pod address"),
    Rule("score_prefix_cache", None, ROLE.SCHEDULING, CURRENT, "epp", "prefix scorer"),
    Rule("produce_precise_prefix_cache", None, ROLE.SCHEDULING, CURRENT, "epp"),
    # -- EPP / router, <= v0.8.0 -----------------------------------------------------------
    Rule("llm_d.epp.pd.profile_handler.pick", "pick_pd_profile", ROLE.SCHEDULING, V0_8, "epp"),
    Rule("llm_d.epp.disagg.profile_handler.pick", "pick_disagg_profile", ROLE.SCHEDULING, V0_8, "epp"),
    Rule("llm_d.epp.prerequest.disaggregation", "prepare_disaggregation", ROLE.SCHEDULING, V0_8, "epp"),
    Rule("llm_d.epp.prerequest.pd_disaggregation", "prepare_disaggregation", ROLE.SCHEDULING, V0_8, "epp"),
    Rule("llm_d.epp.scorer.prefix_cache", "score_prefix_cache", ROLE.SCHEDULING, V0_8, "epp"),
    # -- KV-cache indexer (inside the EPP process) -----------------------------------------
    Rule("score_tokens", None, ROLE.KV_CACHE, CURRENT, "kv_indexer"),
    Rule("index_lookup", None, ROLE.KV_CACHE, CURRENT, "kv_indexer"),
    Rule("index_add", None, ROLE.KV_CACHE, CURRENT, "kv_indexer"),
    Rule("index_evict", None, ROLE.KV_CACHE, CURRENT, "kv_indexer", "own single-span trace, never a request"),
    Rule("compute_scores", None, ROLE.KV_CACHE, CURRENT, "kv_indexer"),
    Rule(
        "llm_d.kv_cache.score_tokens",
        "score_tokens",
        ROLE.KV_CACHE,
        V0_10,
        "kv_indexer",
        "v0.10 in-tree; v0.8/v0.9 through llm-d-kv-cache",
    ),
    Rule(
        "llm_d.kv_cache.get_scores",
        "score_tokens",
        ROLE.KV_CACHE,
        V0_8,
        "kv_indexer",
        "llm-d-kv-cache <= v0.6.1 (router <= v0.6)",
    ),
    Rule("llm_d.kv_cache.index", "index_lookup", ROLE.KV_CACHE, V0_10, "kv_indexer", "also <= v0.9"),
    Rule("llm_d.kv_cache.index.add", "index_add", ROLE.KV_CACHE, V0_10, "kv_indexer"),
    Rule("llm_d.kv_cache.index.evict", "index_evict", ROLE.KV_CACHE, V0_10, "kv_indexer"),
    Rule(
        "llm_d.kv_cache.scorer.compute", "compute_scores", ROLE.KV_CACHE, V0_10, "kv_indexer", "also <= v0.9"
    ),
    # -- P/D sidecar -------------------------------------------------------------------------
    Rule("forward_request", None, ROLE.PROXY, CURRENT, "sidecar", "sidecar root since v0.9"),
    Rule("llm_d.pd_proxy.request", "forward_request", ROLE.PROXY, V0_8, "sidecar", "sidecar root <= v0.8"),
    Rule("prefill", None, ROLE.PREFILL, CURRENT, "sidecar", "nixlv2 serial path and sglang"),
    Rule("decode", None, ROLE.DECODE, CURRENT, "sidecar", "nixlv2: child of `prefill`; sglang"),
    Rule(
        "llm_d.pd_proxy.prefill",
        "prefill",
        ROLE.PREFILL,
        CURRENT,
        "sidecar",
        "p2p, mooncake, nixlv2 parallel dispatch; nixlv2 <= v0.8",
    ),
    Rule(
        "llm_d.pd_proxy.decode",
        "decode",
        ROLE.DECODE,
        CURRENT,
        "sidecar",
        "p2p, mooncake, nixlv2 parallel dispatch; nixlv2 <= v0.8",
    ),
    Rule("chunked_decode", None, ROLE.DECODE, CURRENT, "sidecar", "chunked decode under the decode leg"),
    # -- vLLM --------------------------------------------------------------------------------
    Rule(semconv.SPAN_VLLM_REQUEST, None, ROLE.DECODE, VLLM, "vllm", "leg decided per span, see below"),
    # -- railtrace shims ----------------------------------------------------------------------
    Rule(semconv.SPAN_KV_TRANSFER, None, ROLE.KV_TRANSFER, RAILTRACE, "railtrace", "KV-transfer shim"),
    Rule(
        semconv.SPAN_EC_TRANSFER,
        None,
        ROLE.EC_TRANSFER,
        RAILTRACE,
        "railtrace",
        "encoder-cache transfer (E/P/D); never a request, never a KV verdict",
    ),
    # -- Patterns ------------------------------------------------------------------------------
    Rule(
        r"llm_d\.epp\.scorer\.[A-Za-z0-9]+(?:-[A-Za-z0-9]+)+",
        None,
        ROLE.SCHEDULING,
        CURRENT,
        "epp",
        "`llm_d.epp.scorer.<type>`, e.g. active-request-scorer",
        regex=True,
    ),
    Rule(
        r"llm_d\.pd_proxy\.(?:GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) /.*",
        None,
        ROLE.PROXY,
        CURRENT,
        "sidecar",
        "otelhttp server span `llm_d.pd_proxy.<METHOD> <path>`",
        regex=True,
    ),
    Rule(r"tokenize_render .*", None, ROLE.SCHEDULING, CURRENT, "epp", "EPP calls vLLM render", regex=True),
)

EXACT: dict[str, Rule] = {r.pattern: r for r in RULES if not r.regex}
PATTERNS: tuple[tuple[re.Pattern[str], Rule], ...] = tuple(
    (re.compile(r.pattern), r) for r in RULES if r.regex
)

# `service.name` values by role and generation (reference §2.1). A llm-d span from a
# service named here is moved to that generation when its name alone cannot tell.
EPP_SERVICES: dict[str, str] = {
    "llm-d-router/epp": NO_GENERATION,
    "llm-d-epp": NO_GENERATION,
    "llm-d-router": NO_GENERATION,
    "llm-d-inference-scheduler": V0_8,
    "gateway-api-inference-extension/epp": GIE,
}
SIDECAR_SERVICES: frozenset[str] = frozenset({"llm-d-disagg-sidecar", "pd-sidecar", "routing-proxy"})
SIDECAR_SCOPE = "llm-d-router/pkg/sidecar/proxy"
OTELHTTP_SCOPE_PREFIX = "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
GIE_SCOPE_PREFIX = "gateway-api-inference-extension"
# GIE's body-based router (BBR) also names its ext_proc span `gateway.request`
# (gateway-api-inference-extension v1.5.0 pkg/bbr/handlers/server.go, scope
# `gateway-api-inference-extension/bbr/extproc`, service `gateway-api-inference-extension/bbr`
# from cmd/bbr/runner/runner.go). It is not the EPP's and never anchors a request.
BBR_SCOPE_PREFIX = "gateway-api-inference-extension/bbr"
BBR_SERVICES: frozenset[str] = frozenset({"gateway-api-inference-extension/bbr"})
RAILTRACE_SCOPE_PREFIX = "railtrace"
# Attributes only railtrace's router shim writes: a span carrying one is railtrace-instrumented.
ROUTER_SHIM_PREFIX = semconv.ROUTER_PROFILE.rsplit(".", 1)[0] + "."

# Outbound client spans of the sidecar (one per leg); their leg comes from the parent.
HTTP_CLIENT_NAMES: frozenset[str] = frozenset({"HTTP POST", "POST"})

# vLLM service names by the llm-d guide convention (OTEL_SERVICE_NAME).
VLLM_PREFILL_SERVICE_HINT = "prefill"
VLLM_DECODE_SERVICE_HINT = "decode"

# Connectors whose stage spans are named `llm_d.pd_proxy.prefill|decode` at HEAD.
PREFIXED_STAGE_CONNECTORS: frozenset[str] = frozenset({"p2p", "mooncake"})
PARALLEL_DISPATCH_ATTRS: tuple[str, ...] = (
    "llm_d.pd_proxy.parallel_dispatch",
    "llm_d.pd_proxy.parallel_window_ms",
    "llm_d.pd_proxy.concurrent_pd",
)

# Join keys, strongest first (docs/normalisation.md, "Stitching").
KEY_ATTRIBUTES: tuple[str, ...] = (
    semconv.PD_REQUEST_ID,
    semconv.KV_REQUEST_ID,
    semconv.HTTP_REQUEST_ID_HEADER,
    semconv.GEN_AI_REQUEST_ID,
)
# The id forms of one request (docs/normalisation.md, "Request id forms"), each reduced to the
# bare id the EPP and the client's x-request-id carry:
# - vLLM's OpenAI front end prefixes the id taken from the first `X-Request-Id` header:
#   `chatcmpl-<id>` (chat), `cmpl-<id>` then `cmpl-<id>-<n>` per prompt (completions)
#   (vllm/entrypoints/openai/chat_completion/serving.py, completion/serving.py,
#   serve/engine/serving.py `_base_request_id`; vLLM 0.34.0);
# - inside the engine (a KV connector's `req_id`) vLLM appends `-<8 hex>` to that external id
#   (vllm/v1/engine/input_processor.py `assign_request_id`, vLLM PR #27987), so only the
#   attributes that carry the engine's id are stripped of it; an external id ending in
#   `-<8 hex>` (a client's own x-request-id) stays whole everywhere else.
REQUEST_ID_PREFIXES: tuple[str, ...] = ("chatcmpl-", "cmpl-")
REQUEST_ID_SUFFIXED_PREFIXES: tuple[str, ...] = ("cmpl-",)
REQUEST_ID_INDEX_SUFFIX = re.compile(r"-\d{1,3}$")
REQUEST_ID_ENGINE_SUFFIX = re.compile(r"-[0-9a-f]{8}$")
# Attributes that carry vLLM's engine-internal request id (with the random suffix).
ENGINE_ID_ATTRIBUTES: frozenset[str] = frozenset({semconv.KV_REQUEST_ID})
MIN_KEY_CHARS = 4


def lookup(name: str) -> Rule | None:
    """The rule for a span name, or None for a name no generation emits."""
    rule = EXACT.get(name)
    if rule is not None:
        return rule
    for pattern, candidate in PATTERNS:
        if pattern.fullmatch(name):
            return candidate
    return None


# EPP endpoint ids: `<namespace>/<pod>-rank-<i>`, one per data-parallel rank of a Pod
# (llm-d-router pkg/epp/datastore/datastore.go `pod.Name + "-rank-" + strconv.Itoa(idx)`,
# v0.9.0 and later; gateway-api-inference-extension v1.5.0 the same). The Pod is the id
# without namespace and suffix.
ENDPOINT_RANK_SUFFIX = re.compile(r"-rank-\d+$")


def endpoint_pod(endpoint_id: str) -> str | None:
    """The Pod name an EPP endpoint id stands for (`ns/pod-rank-0` -> `pod`); None for a
    `host:port` address or an empty name."""
    if not endpoint_id or endpoint_id.count("/") != 1 or ":" in endpoint_id:
        return None
    pod = ENDPOINT_RANK_SUFFIX.sub("", endpoint_id.split("/", 1)[1])
    return pod or None
