"""The one registry of names: span names, attribute keys, flag names, metric names.

Everything in railtrace imports its names from here -- the shims, the correlator service,
the dashboards, the alert rules' tests, the collector-config tests and the generated
`docs/conventions.md` -- so a name lives in exactly one place. Names that llm-d, vLLM or
OpenTelemetry already define are listed too (with their origin), because railtrace reads
them and must spell them the way the real stack does.

This module must stay importable with the standard library alone: it is loaded inside
users' vLLM and gateway processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from types import SimpleNamespace

# ---------------------------------------------------------------------------------------
# Value sets
# ---------------------------------------------------------------------------------------


class Transport(StrEnum):
    """What physically carried the KV bytes (`llm_d.kv_transfer.transport`)."""

    RDMA = "rdma"
    TCP = "tcp"
    NVLINK = "nvlink"
    SHM = "shm"
    UNKNOWN = "unknown"


class PathClass(StrEnum):
    """The path a KV transfer took, judged against the topology."""

    NVLINK = "nvlink"
    SHM = "shm"
    RDMA_SAME_RAIL = "rdma_same_rail"
    RDMA_CROSS_RAIL = "rdma_cross_rail"
    TCP = "tcp"
    UNKNOWN = "unknown"


class FlagName(StrEnum):
    """Verdict flags attached to a request summary."""

    TCP_FALLBACK = "tcp_fallback"
    CROSS_RAIL = "cross_rail"
    GPU_NIC_MISMATCH = "gpu_nic_mismatch"
    TOPOLOGY_BLIND_PAIRING = "topology_blind_pairing"
    BROKEN_TRACE = "broken_trace"
    KV_TRANSFER_FAILED = "kv_transfer_failed"
    SLOW_KV_TRANSFER = "slow_kv_transfer"


FLAG_DESCRIPTIONS: dict[FlagName, str] = {
    FlagName.TCP_FALLBACK: "The KV transfer ran over TCP although both ends have an RDMA path.",
    FlagName.CROSS_RAIL: "The KV transfer used a NIC on another rail than the one its GPU is paired with.",
    FlagName.GPU_NIC_MISMATCH: "The NIC used (or allocated) is not the one paired with the GPU.",
    FlagName.TOPOLOGY_BLIND_PAIRING: (
        "The router passed over a topologically closer decode candidate with a comparable score."
    ),
    FlagName.BROKEN_TRACE: "Hops of one request arrived in separate traces, or are missing.",
    FlagName.KV_TRANSFER_FAILED: "The KV transfer ended in error.",
    FlagName.SLOW_KV_TRANSFER: "The KV transfer ran far below the bandwidth its path class should give.",
}


class Role(StrEnum):
    """The part a span plays in one P/D request, after normalisation."""

    GATEWAY = "gateway"
    SCHEDULING = "scheduling"
    PROXY = "proxy"
    PREFILL = "prefill"
    DECODE = "decode"
    KV_TRANSFER = "kv_transfer"
    EC_TRANSFER = "ec_transfer"  # encoder-cache transfer (E/P/D): never a request, never a KV verdict
    KV_CACHE = "kv_cache"
    OTHER = "other"


ENGINE_ROLES: tuple[str, ...] = (Role.PREFILL.value, Role.DECODE.value)
"""The two engine roles of P/D serving: the legs of a request and the values of `llm_d.role`."""


class Stage(StrEnum):
    """Keys of `breakdown_s` in the request summary."""

    SCHEDULING = "scheduling"
    PREFILL_QUEUE = "prefill_queue"
    PREFILL = "prefill"
    KV_TRANSFER = "kv_transfer"
    DECODE_QUEUE = "decode_queue"
    DECODE = "decode"


class TopologyLevel(StrEnum):
    """Distance between two GPUs' hosts, nearest first (used for pairing verdicts)."""

    SAME_HOST = "same_host"
    NVLINK_DOMAIN = "nvlink_domain"
    SUBBLOCK = "subblock"
    BLOCK = "block"
    ZONE = "zone"
    FAR = "far"
    UNKNOWN = "unknown"


TOPOLOGY_LEVEL_ORDER: tuple[TopologyLevel, ...] = (
    TopologyLevel.SAME_HOST,
    TopologyLevel.NVLINK_DOMAIN,
    TopologyLevel.SUBBLOCK,
    TopologyLevel.BLOCK,
    TopologyLevel.ZONE,
    TopologyLevel.FAR,
)


class Obligation(StrEnum):
    """The four obligations of the topology contract (`railtrace contract`, label `obligation`)."""

    DISCOVERED = "discovered"
    PRESERVED = "preserved"
    VERIFIED = "verified"
    CONSUMED = "consumed"


class ContractStatus(StrEnum):
    """Status of one obligation (label `status` of the contract gauge)."""

    OK = "ok"
    BROKEN = "broken"
    UNKNOWN = "unknown"


def plain_values(enum: type[StrEnum]) -> SimpleNamespace:
    """`enum`'s member values as plain `str` attributes by member name, for code that reads
    them for every span or request: an enum member's `.value` costs about 20 times a
    namespace attribute, and a plain `str` is what JSON, SQL and metric labels get anyway."""
    return SimpleNamespace(**{member.name: member.value for member in enum})


class Identity(StrEnum):
    """How a leg's pod was found, strongest first (docs/normalisation.md, "Identity")."""

    K8S_RESOURCE = "k8s_resource"  # k8s.pod.name on the engine's resource (chart, k8sattributes)
    POD_IP = "pod_ip"  # k8s.pod.ip on the resource, matched to a Pod of the topology
    OTLP_PEER = "otlp_peer"  # the OTLP sender's address (or trusted proxy's client) = a pod IP
    EPP_PICK = "epp_pick"  # the EPP's chosen endpoint `<ns>/<pod>-rank-<i>`
    PD_ADDRESS = "pd_address"  # the sidecar's / EPP's prefill or decode host:port
    SIDECAR_POD = "sidecar_pod"  # the sidecar's own pod (= the decode pod in the nixlv2 layout)
    KV_PEER = "kv_peer"  # the KV transfer's remote engine id or host (the other leg, seen from one)
    NONE = "none"


class Hop(StrEnum):
    """A hop of a P/D request that a deployment may or may not trace (`coverage`)."""

    EPP = "epp"
    SIDECAR = "sidecar"
    PREFILL_ENGINE = "prefill_engine"
    DECODE_ENGINE = "decode_engine"
    KV_TRANSFER = "kv_transfer"


class Recipe(StrEnum):
    """Which tracing a deployment runs, read from the hops present (`coverage.recipe`)."""

    FULL = "full"  # EPP, sidecar and both engines
    DECODE_ONLY = "decode_only"  # llm-d's shipped guide: the decode engine only
    EPP_ONLY = "epp_only"  # the router chart's tracing alone
    ENGINES = "engines"  # both engines, no sidecar (its tracing is off by default)
    PARTIAL = "partial"  # any other mix


ROLE = plain_values(Role)
STAGE = plain_values(Stage)
TRANSPORT = plain_values(Transport)
PATH_CLASS = plain_values(PathClass)
FLAG = plain_values(FlagName)
IDENTITY = plain_values(Identity)
HOP = plain_values(Hop)
RECIPE = plain_values(Recipe)


# ---------------------------------------------------------------------------------------
# Attribute registry
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attribute:
    """One attribute key with its type and, where closed, its allowed values."""

    key: str
    type: str  # "string" | "int" | "double" | "boolean" | "string[]" | "double[]"
    description: str
    origin: str = "railtrace"  # railtrace | llm-d | vllm | otel
    allowed: tuple[str, ...] = ()
    content: bool = False  # prompt/completion text: dropped at ingest, never stored
    unit: str = ""


_ATTRIBUTES: list[Attribute] = []


def _attr(key: str, type_: str, description: str, **kw: object) -> str:
    _ATTRIBUTES.append(Attribute(key, type_, description, **kw))  # type: ignore[arg-type]
    return key


# -- railtrace's KV-transfer span (PRODUCT.md contract) ----------------------------------
SPAN_KV_TRANSFER = "llm_d.kv_transfer"
# An encoder-cache transfer of encode/prefill/decode disaggregation (vLLM's EC connector over
# NIXL): its own span name, so that a service that does not know it leaves it unclassified
# instead of judging it as a KV transfer. It carries the KV span's `llm_d.kv_transfer.*`
# transport and peer attributes (the same topology facts, encode pod -> prefill pod).
SPAN_EC_TRANSFER = "llm_d.ec_transfer"

KV_REQUEST_ID = _attr("llm_d.kv_transfer.request_id", "string", "Request id the transfer serves.")
KV_OPERATION = _attr("llm_d.kv_transfer.operation", "string", "NIXL operation.", allowed=("read", "write"))
KV_CONNECTOR = _attr("llm_d.kv_transfer.connector", "string", "KV connector, e.g. `nixl`.")
KV_BACKEND = _attr("llm_d.kv_transfer.backend", "string", "Connector backend, e.g. `UCX`.")
KV_BYTES = _attr("llm_d.kv_transfer.bytes", "int", "Bytes moved.", unit="By")
KV_DESCRIPTORS = _attr("llm_d.kv_transfer.descriptors", "int", "Number of transfer descriptors.")
KV_TRANSPORT = _attr(
    "llm_d.kv_transfer.transport",
    "string",
    "Transport UCX actually used, from its own logs; `unknown` without evidence.",
    allowed=tuple(t.value for t in Transport),
)
KV_DEVICES = _attr(
    "llm_d.kv_transfer.devices",
    "string[]",
    "Local `transport/device` lanes actually used, e.g. `rc_mlx5/mlx5_3:1`.",
)
KV_LOCAL_GPU = _attr("llm_d.kv_transfer.local.gpu", "string", "Local GPU whose memory was registered.")
KV_REMOTE_HOST = _attr("llm_d.kv_transfer.remote.host", "string", "Peer host (from kv_transfer_params).")
KV_REMOTE_ENGINE_ID = _attr(
    "llm_d.kv_transfer.remote.engine_id", "string", "Peer engine id (from kv_transfer_params)."
)
KV_EVIDENCE = _attr(
    "llm_d.kv_transfer.evidence",
    "string",
    "Where the transport came from, e.g. `ucx proto_info cfg#1 ucp_get*`.",
)
KV_SPLIT = _attr(
    "llm_d.kv_transfer.split",
    "double[]",
    "Share of bytes per entry of `.devices` when UCX split across rails (0..1).",
)
KV_POST_DURATION_S = _attr(
    "llm_d.kv_transfer.post_duration_s", "double", "NIXL post time (telemetry).", unit="s"
)
KV_WARNINGS = _attr("llm_d.kv_transfer.warnings", "string[]", "UCX/NIXL warnings seen for this endpoint.")
KV_PROTOCOL = _attr(
    "llm_d.kv_transfer.protocol",
    "string",
    "UCX protocol of the data-path row, e.g. `zero-copy`, `software emulation`.",
)
KV_XFER_DURATION_S = _attr(
    "llm_d.kv_transfer.xfer_duration_s", "double", "NIXL transfer time (telemetry).", unit="s"
)
KV_VLLM_REQUEST_ID = _attr(
    "llm_d.kv_transfer.vllm.request_id",
    "string",
    "vLLM's internal request id in the engine (`<public id>-<8 hex>` from vLLM 0.14); "
    "`.request_id` is the public id of the OpenAI response and vLLM's logs.",
)
KV_REMOTE_REQUEST_ID = _attr(
    "llm_d.kv_transfer.remote.request_id",
    "string",
    "The peer engine's request id for the same request (vLLM `remote_request_id`).",
)
KV_REMOTE_AGENT = _attr("llm_d.kv_transfer.remote.agent", "string", "NIXL agent name of the peer.")
KV_EVIDENCE_SCOPE = _attr(
    "llm_d.kv_transfer.evidence_scope",
    "string",
    "What `.transport` describes: `peer` (the UCX endpoint to this transfer's peer) or `process` "
    "(only the process's UCX configuration is known; not a per-transfer fact).",
    allowed=("peer", "process"),
)
KV_MODE = _attr(
    "llm_d.kv_transfer.mode",
    "string",
    "vLLM NIXL connector mode: `pull` (decode reads) or `push` (prefill writes).",
    allowed=("pull", "push"),
)
# Keys of vLLM's per-request `kv_transfer_params` (llm-d P/D contract) the shims read.
KV_PARAM_REMOTE_ENGINE_ID = "remote_engine_id"
KV_PARAM_REMOTE_HOST = "remote_host"
KV_PARAM_REMOTE_PORT = "remote_port"
KV_PARAM_TRACE_HEADERS = "trace_headers"  # railtrace extension: W3C headers of the request
KV_PARAM_REMOTE_REQUEST_ID = "remote_request_id"

# -- Router scoring shim: the full candidate list ----------------------------------------
ROUTER_PROFILE = _attr(
    "llm_d.router.profile", "string", "Scheduling profile the pick served.", allowed=("prefill", "decode")
)
ROUTER_CHOSEN = _attr("llm_d.router.chosen_endpoint", "string", "Endpoint (`host:port`) picked.")
ROUTER_CANDIDATE_ENDPOINTS = _attr(
    "llm_d.router.candidate.endpoints", "string[]", "Every endpoint scored, in order."
)
ROUTER_CANDIDATE_SCORES = _attr(
    "llm_d.router.candidate.scores", "double[]", "Weighted total score per candidate."
)
ROUTER_CANDIDATE_SCORER_SCORES = _attr(
    "llm_d.router.candidate.scorer_scores",
    "string[]",
    "Per candidate, a JSON object of scorer name to score.",
)
ROUTER_CANDIDATE_TOPOLOGY = _attr(
    "llm_d.router.candidate.topology",
    "string[]",
    "Per candidate, its topology key `zone/block/subblock/host` (empty parts unknown).",
)
ROUTER_CANDIDATE_PODS = _attr("llm_d.router.candidate.pods", "string[]", "Per candidate, its pod name.")

# -- Engine shim role -------------------------------------------------------------------
LLM_D_ROLE = _attr("llm_d.role", "string", "Role of an engine process.", allowed=ENGINE_ROLES)

# -- llm-d EPP / router (read, not emitted by railtrace except through the shims) ---------
EPP_PROFILE_NAME = _attr("llm_d.epp.scheduling.profile.name", "string", "Scheduling profile.", origin="llm-d")
EPP_DECISION = _attr("llm_d.epp.profile_handler.decision", "string", "P/D decision.", origin="llm-d")
EPP_DECISION_LEGACY = _attr(
    "llm_d.profile_handler.decision", "string", "P/D decision (<= v0.8.0).", origin="llm-d"
)
EPP_PICKER_TOP_ENDPOINTS = _attr(
    "llm_d.epp.picker.top_endpoints", "string[]", "Top endpoints of the picker.", origin="llm-d"
)
EPP_PICKER_TOP_SCORES = _attr("llm_d.epp.picker.top_scores", "double[]", "Their scores.", origin="llm-d")
EPP_PICKER_CANDIDATES = _attr(
    "llm_d.epp.picker.candidate_endpoints", "int", "Candidates at the picker.", origin="llm-d"
)
EPP_FILTER_CANDIDATES = _attr(
    "llm_d.epp.filter.candidate_endpoints", "int", "Candidates before filtering.", origin="llm-d"
)
EPP_FILTER_FILTERED = _attr(
    "llm_d.epp.filter.filtered_endpoints", "int", "Candidates after filtering.", origin="llm-d"
)
EPP_SCORER_TYPE = _attr("llm_d.epp.scorer.type", "string", "Scorer type.", origin="llm-d")
EPP_SCORER_NAME = _attr("llm_d.epp.scorer.name", "string", "Scorer name.", origin="llm-d")
EPP_SCORER_WEIGHT = _attr("llm_d.epp.scorer.weight", "double", "Scorer weight.", origin="llm-d")
EPP_SCORER_SCORE_MAX = _attr("llm_d.epp.scorer.score.max", "double", "Max score.", origin="llm-d")
EPP_SCORER_SCORE_AVG = _attr("llm_d.epp.scorer.score.avg", "double", "Mean score.", origin="llm-d")
EPP_SCORER_COUNT = _attr("llm_d.epp.scorer.count", "int", "Scorers of the profile.", origin="llm-d")
EPP_SCORING_CANDIDATES = _attr(
    "llm_d.epp.scoring.candidate_endpoints", "int", "Candidates entering scoring.", origin="llm-d"
)
EPP_SCORER_CANDIDATES = _attr(
    "llm_d.epp.scorer.candidate_endpoints", "int", "Candidates one scorer saw.", origin="llm-d"
)
EPP_SCORER_ENDPOINTS_SCORED = _attr(
    "llm_d.epp.scorer.endpoints_scored", "int", "Endpoints one scorer scored.", origin="llm-d"
)
EPP_PD_PREFILL_ADDRESS = _attr(
    "llm_d.epp.pd.prefill_pod_address", "string", "Prefill pod address.", origin="llm-d"
)
EPP_PD_PREFILL_PORT = _attr("llm_d.epp.pd.prefill_pod_port", "string", "Prefill pod port.", origin="llm-d")
EPP_PD_DISAGG_USED = _attr(
    "llm_d.epp.pd.disaggregation_used", "boolean", "Whether P/D was used.", origin="llm-d"
)
GEN_AI_REQUEST_MODEL = _attr("gen_ai.request.model", "string", "Requested model.", origin="otel")
GEN_AI_RESPONSE_MODEL = _attr("gen_ai.response.model", "string", "Model that answered.", origin="otel")
GEN_AI_REQUEST_ID = _attr(
    "gen_ai.request.id", "string", "Request id (vLLM: prefixed OpenAI id).", origin="vllm"
)
TARGET_MODEL = _attr("target_model", "string", "Target model (orchestration span).", origin="llm-d")

# -- llm-d P/D sidecar ------------------------------------------------------------------
PD_REQUEST_ID = _attr(
    "llm_d.pd_proxy.request_id", "string", "UUID sent as x-request-id to both legs.", origin="llm-d"
)
PD_CONNECTOR = _attr("llm_d.pd_proxy.connector", "string", "P/D connector, e.g. `nixlv2`.", origin="llm-d")
PD_PREFILL_TARGET = _attr("llm_d.pd_proxy.prefill_target", "string", "Prefill host:port.", origin="llm-d")
PD_DECODE_TARGET = _attr("llm_d.pd_proxy.decode.target", "string", "Decode host:port.", origin="llm-d")
PD_PREFILL_DURATION_MS = _attr(
    "llm_d.pd_proxy.prefill_duration_ms", "double", "Prefill leg duration.", origin="llm-d", unit="ms"
)
PD_DECODE_DURATION_MS = _attr(
    "llm_d.pd_proxy.decode_duration_ms", "double", "Decode leg duration.", origin="llm-d", unit="ms"
)
PD_PREFILL_LEG_DURATION_MS = _attr(
    "llm_d.pd_proxy.prefill.duration_ms", "double", "Prefill span duration.", origin="llm-d", unit="ms"
)
PD_DECODE_LEG_DURATION_MS = _attr(
    "llm_d.pd_proxy.decode.duration_ms", "double", "Decode span duration.", origin="llm-d", unit="ms"
)
PD_TOTAL_DURATION_MS = _attr(
    "llm_d.pd_proxy.total_duration_ms", "double", "Sidecar total.", origin="llm-d", unit="ms"
)
PD_TRUE_TTFT_MS = _attr(
    "llm_d.pd_proxy.true_ttft_ms", "double", "Sidecar start to decode start.", origin="llm-d", unit="ms"
)
PD_COORDINATOR_OVERHEAD_MS = _attr(
    "llm_d.pd_proxy.coordinator_overhead_ms", "double", "Sidecar overhead.", origin="llm-d", unit="ms"
)
PD_PREFILL_STATUS = _attr("llm_d.pd_proxy.prefill.status_code", "int", "Prefill HTTP status.", origin="llm-d")
PD_DECODE_STREAMING = _attr("llm_d.pd_proxy.decode.streaming", "boolean", "Streaming.", origin="llm-d")
PD_KV_CONNECTOR = _attr("llm_d.pd_proxy.kv_connector", "string", "KV connector.", origin="llm-d")
PD_REQUEST_PATH = _attr("llm_d.pd_proxy.request_path", "string", "Proxied request path.", origin="llm-d")
PD_DISAGG_USED = _attr(
    "llm_d.pd_proxy.disaggregation_used", "boolean", "Whether the proxy ran P/D.", origin="llm-d"
)
PD_KV_CACHE_SOURCE = _attr(
    "llm_d.pd_proxy.kv_cache_source",
    "string",
    "host:port of the pod the KV cache is pulled from over the P2P connector "
    "(`x-kv-cache-source-host-port`).",
    origin="llm-d",
)

# -- vLLM llm_request --------------------------------------------------------------------
VLLM_TTFT = _attr("gen_ai.latency.time_to_first_token", "double", "Engine TTFT.", origin="vllm", unit="s")
VLLM_E2E = _attr("gen_ai.latency.e2e", "double", "Engine end to end.", origin="vllm", unit="s")
VLLM_QUEUE = _attr("gen_ai.latency.time_in_queue", "double", "Queued time.", origin="vllm", unit="s")
VLLM_PREFILL = _attr(
    "gen_ai.latency.time_in_model_prefill", "double", "Model prefill time.", origin="vllm", unit="s"
)
VLLM_DECODE = _attr(
    "gen_ai.latency.time_in_model_decode", "double", "Model decode time.", origin="vllm", unit="s"
)
VLLM_INFERENCE = _attr(
    "gen_ai.latency.time_in_model_inference", "double", "Model inference time.", origin="vllm", unit="s"
)
VLLM_PROMPT_TOKENS = _attr("gen_ai.usage.prompt_tokens", "int", "Prompt tokens (old name).", origin="vllm")
VLLM_COMPLETION_TOKENS = _attr(
    "gen_ai.usage.completion_tokens", "int", "Completion tokens (old name).", origin="vllm"
)
GEN_AI_INPUT_TOKENS = _attr("gen_ai.usage.input_tokens", "int", "Input tokens.", origin="otel")
GEN_AI_OUTPUT_TOKENS = _attr("gen_ai.usage.output_tokens", "int", "Output tokens.", origin="otel")
GEN_AI_MAX_TOKENS = _attr("gen_ai.request.max_tokens", "int", "max_tokens.", origin="otel")
GEN_AI_TOP_P = _attr("gen_ai.request.top_p", "double", "top_p, when the request sets it.", origin="vllm")
GEN_AI_TEMPERATURE = _attr(
    "gen_ai.request.temperature", "double", "temperature, when set and non-zero.", origin="vllm"
)
GEN_AI_N = _attr("gen_ai.request.n", "int", "Number of sequences asked for.", origin="vllm")

# -- Generic OpenTelemetry keys railtrace reads or writes -----------------------------------
ERROR_TYPE = _attr("error.type", "string", "Error class on failure.", origin="otel")
HTTP_REQUEST_ID_HEADER = _attr(
    "http.request.header.x-request-id", "string[]", "x-request-id request header.", origin="otel"
)
# A gateway or proxy that records request headers (OTel HTTP semconv `http.request.header.<key>`)
# shows the llm-d coordinator's phase header, `EPP-Profile` (llm-d-router
# pkg/coordinator/gateway/paths.go @ ebab687927f5 l.26-32); the EPP itself records none.
HTTP_EPP_PROFILE_HEADER = _attr(
    "http.request.header.epp-profile",
    "string[]",
    "EPP-Profile request header (coordinator phase).",
    origin="otel",
)
SERVER_ADDRESS = _attr("server.address", "string", "Server host.", origin="otel")
SERVER_PORT = _attr("server.port", "int", "Server port.", origin="otel")
HTTP_REQUEST_METHOD = _attr("http.request.method", "string", "HTTP method.", origin="otel")
HTTP_RESPONSE_STATUS = _attr("http.response.status_code", "int", "HTTP status.", origin="otel")
HTTP_ROUTE = _attr("http.route", "string", "Matched route.", origin="otel")
URL_PATH = _attr("url.path", "string", "Request path.", origin="otel")
URL_SCHEME = _attr("url.scheme", "string", "Request scheme.", origin="otel")
CLIENT_ADDRESS = _attr("client.address", "string", "Client address.", origin="otel")
USER_AGENT = _attr("user_agent.original", "string", "User-Agent header.", origin="otel")
NETWORK_PROTOCOL_VERSION = _attr("network.protocol.version", "string", "HTTP version.", origin="otel")

# -- Set by railtrace's tier-2 Collector (collector_config/tier2-sampler.yaml) --------------
SAMPLING_KEEP = _attr(
    "llm_d.sampling.keep",
    "string",
    "Why the tier-2 collector keeps this span's trace whatever the baseline ratio.",
    allowed=("kv_transport_tcp", "kv_transfer_error", "slow_kv_transfer", "slow_prefill"),
)
COLLECTOR_REPLICA = _attr(
    "llm_d.tracing.collector.replica",
    "string",
    "Tier-2 collector replica that computed a span-metrics point (keeps replicas' series apart).",
)

# -- railtrace's verdict on a request, set on the root span of the traces railtrace serves through
# its Tempo-compatible query API (Grafana's trace view); never expected from senders ---------
VERDICT_FLAGS = _attr("railtrace.verdict.flags", "string[]", "Flags railtrace raised on the request.")
VERDICT_EVIDENCE = _attr(
    "railtrace.verdict.evidence", "string[]", "Each flag with its evidence, `<flag>: <evidence>`."
)
VERDICT_PATH_CLASS = _attr(
    "railtrace.verdict.path_class",
    "string",
    "Path class of the request's KV transfer.",
    allowed=("nvlink", "shm", "rdma_same_rail", "rdma_cross_rail", "tcp", "unknown"),
)
VERDICT_PAIRING_LEVEL = _attr(
    "railtrace.verdict.pairing_level", "string", "Closest topology level the prefill and decode nodes share."
)
VERDICT_NODE = _attr("railtrace.verdict.node", "string[]", "Prefill node, decode node.")
VERDICT_POD = _attr("railtrace.verdict.pod", "string[]", "Prefill pod, decode pod.")
VERDICT_TTFT = _attr("railtrace.verdict.ttft", "double", "Time to first token.", unit="s")
VERDICT_KV_DURATION = _attr("railtrace.verdict.kv_transfer.duration", "double", "KV transfer time.", unit="s")
VERDICT_REQUEST_ID = _attr("railtrace.verdict.request_id", "string", "The request's id.")
VERDICT_URL = _attr("railtrace.verdict.url", "string", "The request's page in railtrace's web UI.")

# -- Resource attributes ----------------------------------------------------------------
RES_SERVICE_NAME = _attr("service.name", "string", "Service name.", origin="otel")
RES_SERVICE_VERSION = _attr(
    "service.version", "string", "Service version (the llm-d router: its build ref).", origin="otel"
)
RES_POD = _attr("k8s.pod.name", "string", "Pod name.", origin="otel")
RES_NODE = _attr("k8s.node.name", "string", "Node name.", origin="otel")
RES_NAMESPACE = _attr("k8s.namespace.name", "string", "Namespace.", origin="otel")
RES_HOST = _attr("host.name", "string", "Host name.", origin="otel")
RES_POD_IP = _attr("k8s.pod.ip", "string", "Pod IP.", origin="otel")
RES_OTLP_PEER = _attr(
    "railtrace.otlp.peer",
    "string",
    "Address railtrace received this resource's spans from: the OTLP sender, or the client a "
    "trusted proxy forwarded for (X-Forwarded-For). Set at ingest, never by a sender; loopback "
    "senders are not recorded.",
)
# Values of `railtrace.otlp.claims`.
CLAIMS_COLLECTOR = "collector"
CLAIMS_SENDER = "sender"
RES_OTLP_CLAIMS = _attr(
    "railtrace.otlp.claims",
    "string",
    "Who vouches for this resource's k8s.pod.name and k8s.pod.ip: `collector` (a trusted collector "
    "sent it; its k8sattributes are believed) or `sender` (the sender's own word: counts only where "
    "it agrees with railtrace.otlp.peer). Set at ingest, never by a sender.",
    allowed=(CLAIMS_COLLECTOR, CLAIMS_SENDER),
)
RES_VLLM_MODULE = _attr("vllm.instrumenting_module_name", "string", "vLLM tracer module.", origin="vllm")

# -- Content: never stored ----------------------------------------------------------------
CONTENT_ATTRIBUTES: tuple[str, ...] = tuple(
    _attr(key, "string", "Prompt or completion content; dropped at ingest.", origin="otel", content=True)
    for key in (
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.prompt",
        "gen_ai.completion",
        "llm.prompts",
        "llm.input_messages",
        "llm.output_messages",
        "input.value",
        "output.value",
    )
)
# Prefixes of content keys, matched by a trailing `*`: OpenLLMetry and OpenInference flatten
# messages into indexed keys such as `gen_ai.prompt.0.content` and
# `llm.input_messages.0.message.content`. Dropped at ingest by default with CONTENT_ATTRIBUTES.
CONTENT_ATTRIBUTE_PATTERNS: tuple[str, ...] = (
    "gen_ai.prompt.*",
    "gen_ai.completion.*",
    "llm.prompts.*",
    "llm.input_messages.*",
    "llm.output_messages.*",
    "gen_ai.content.*",
)

ATTRIBUTES: tuple[Attribute, ...] = tuple(_ATTRIBUTES)
ATTRIBUTES_BY_KEY: dict[str, Attribute] = {a.key: a for a in ATTRIBUTES}

# Span names railtrace's shims emit (compatible with the llm-d names they imitate).
SPAN_GATEWAY_REQUEST = "gateway.request"
SPAN_PICK_ENDPOINTS = "pick_endpoints"
SPAN_RUN_SCHEDULER_PROFILE = "run_scheduler_profile"
SPAN_PD_FORWARD = "forward_request"
SPAN_PD_PREFILL = "prefill"
SPAN_PD_DECODE = "decode"
SPAN_VLLM_REQUEST = "llm_request"
SPAN_FILTER_ENDPOINTS = "filter_endpoints"
SPAN_EPP_SCORING = "llm_d.epp.scoring"
SPAN_EPP_SCORER_PREFIX = "llm_d.epp.scorer."  # + scorer type, one span per scorer
SPAN_PD_SERVER_PREFIX = "llm_d.pd_proxy."  # + "<METHOD> <path>", the sidecar's inbound server span
# Further llm-d span names, current and older generations (reference llm-d-telemetry.md §4-§5);
# the simulator emits them so that normalisation is exercised on every generation.
SPAN_GATEWAY_ORCHESTRATION = "gateway.request_orchestration"
SPAN_PICK_DISAGG_PROFILE = "pick_disagg_profile"
SPAN_PREPARE_DISAGGREGATION = "prepare_disaggregation"
SPAN_SCORE_PREFIX_CACHE = "score_prefix_cache"  # v0.9 prefix scorer
SPAN_HTTP_CLIENT_POST = "HTTP POST"  # otelhttp transport CLIENT span of the sidecar
SPAN_V08_PD_REQUEST = "llm_d.pd_proxy.request"  # sidecar root <= v0.8
SPAN_V08_PD_PREFILL = "llm_d.pd_proxy.prefill"  # nixlv2 stages <= v0.8
SPAN_V08_PD_DECODE = "llm_d.pd_proxy.decode"
SPAN_V08_DISAGG_PICK = "llm_d.epp.disagg.profile_handler.pick"
SPAN_V08_PREREQUEST_DISAGG = "llm_d.epp.prerequest.disaggregation"
SPAN_V08_PREFIX_SCORER = "llm_d.epp.scorer.prefix_cache"
# llm-d-router main after v0.10.0: the `gateway.`/`llm_d.epp.` prefixes dropped (cited in
# docs/normalisation.md section 9); the simulator's `post-v0.10` generation emits them.
SPAN_POST_V010_REQUEST = "request"
SPAN_POST_V010_ORCHESTRATION = "request_orchestration"
SPAN_POST_V010_SCORING = "scoring"
SPAN_POST_V010_SCORER_PREFIX = "scorer."  # + scorer type

SPAN_NAMES: dict[str, str] = {
    SPAN_KV_TRANSFER: "One KV-cache transfer of vLLM's NIXL KV connector (railtrace shim).",
    SPAN_EC_TRANSFER: (
        "One encoder-cache transfer of vLLM's EC connector, encode pod to prefill pod (railtrace shim); "
        "carries the `llm_d.kv_transfer.*` transport and peer attributes; never a request of its own."
    ),
    SPAN_GATEWAY_REQUEST: "Gateway server span (llm-d EPP name; railtrace ASGI shim).",
    SPAN_RUN_SCHEDULER_PROFILE: "One scheduling profile run (llm-d EPP; router shim).",
    SPAN_PICK_ENDPOINTS: "Endpoint pick with candidates (llm-d EPP; router shim adds the full list).",
    SPAN_PD_FORWARD: "P/D proxy request (llm-d sidecar; P/D shim).",
    SPAN_PD_PREFILL: "Prefill leg (llm-d sidecar; P/D shim).",
    SPAN_PD_DECODE: "Decode leg, child of prefill (llm-d sidecar; P/D shim).",
    SPAN_VLLM_REQUEST: "Engine request span (vLLM; engine shim).",
    SPAN_FILTER_ENDPOINTS: "Endpoint filtering of a profile (llm-d EPP; router shim).",
    SPAN_EPP_SCORING: "All scorers of a profile (llm-d EPP; router shim).",
    SPAN_EPP_SCORER_PREFIX + "<type>": "One scorer (llm-d EPP; router shim).",
    SPAN_PD_SERVER_PREFIX + "<METHOD> <path>": "P/D proxy inbound server span (llm-d sidecar; P/D shim).",
}


# ---------------------------------------------------------------------------------------
# Metric registry (Prometheus names exposed on the service's /metrics)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Metric:
    """A Prometheus metric family of the service. `name` is the exposed family name."""

    name: str
    type: str  # counter | gauge | histogram
    description: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = field(default=())


_METRICS: list[Metric] = []


def _metric(name: str, type_: str, description: str, labels: tuple[str, ...] = (), **kw: object) -> str:
    _METRICS.append(Metric(name, type_, description, labels, **kw))  # type: ignore[arg-type]
    return name


METRIC_PREFIX = "llm_d_tracing_"

# Verdicts (counted once per assembled request; late updates count the change only).
M_REQUESTS = _metric(
    "llm_d_tracing_requests_total", "counter", "Requests assembled, by path class.", ("path_class", "model")
)
M_FLAGS = _metric("llm_d_tracing_flags_total", "counter", "Flags raised on requests.", ("flag", "path_class"))
M_LEG_RESOLUTION = _metric(
    "llm_d_tracing_leg_resolution_total",
    "counter",
    "Requests assembled, by tracing recipe (`coverage.recipe`) and how both legs reached node, GPU "
    "and NIC (`<prefill identity>+<decode identity>`, or `unresolved`); counted at first assembly.",
    ("recipe", "resolution"),
)
M_KV_TRANSFERS = _metric(
    "llm_d_tracing_kv_transfers_total", "counter", "KV transfers seen.", ("transport", "path_class")
)
M_KV_DURATION = _metric(
    "llm_d_tracing_kv_transfer_duration_seconds",
    "histogram",
    "KV-transfer duration by path class.",
    ("path_class",),
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
M_KV_BANDWIDTH = _metric(
    "llm_d_tracing_kv_transfer_bandwidth_bytes_per_second",
    "histogram",
    "Effective KV-transfer bandwidth by path class.",
    ("path_class",),
    buckets=(1e7, 1e8, 5e8, 1e9, 2.5e9, 5e9, 1e10, 2.5e10, 5e10, 1e11, 2e11),
)
M_KV_NODE_BYTES = _metric(
    "llm_d_tracing_kv_transfer_bytes_total",
    "counter",
    "KV bytes by the node and NIC that ran the transfer.",
    ("node", "nic", "path_class"),
)
M_KV_NODE_SECONDS = _metric(
    "llm_d_tracing_kv_transfer_seconds_total",
    "counter",
    "KV-transfer seconds by node and NIC (bytes_total / seconds_total = bandwidth).",
    ("node", "nic", "path_class"),
)
M_TTFT = _metric(
    "llm_d_tracing_ttft_seconds",
    "histogram",
    "Time to first token by path class.",
    ("path_class",),
    buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0),
)
M_STAGE = _metric(
    "llm_d_tracing_stage_duration_seconds",
    "histogram",
    "Per-stage seconds of the TTFT breakdown.",
    ("stage", "path_class"),
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
M_PAIRINGS = _metric(
    "llm_d_tracing_pairings_total",
    "counter",
    "Prefill/decode node pairings and their topology level.",
    ("prefill_node", "decode_node", "level"),
)
M_SECONDS_LOST = _metric(
    "llm_d_tracing_seconds_lost_total",
    "counter",
    "TTFT seconds requests lost against their aligned KV path (`cost.ttft_s_lost`), by the request's"
    " primary cause: its first flag in incident order (`railtrace.incidents.group.PRIMARY`), `none`"
    " for seconds lost with no flag. Sums over causes count a second once.",
    ("cause",),
)
# `cause` of M_SECONDS_LOST for a request that lost seconds but carries no flag.
CAUSE_NONE = "none"

# What re-assemblies withdrew from the verdict counters above: a request re-assembled after late
# spans (or stitched into another) whose flags, path class, pairing, resolution or seconds lost changed is
# counted under its new labels in the family and under its old ones here, so that
# `<family>_total - <family>_retracted_total` counts the verdicts stored now (what the API and
# the UI show) while every counter stays monotonic (docs/ui.md, "Counts that agree").
VERDICT_COUNTERS = (M_REQUESTS, M_FLAGS, M_LEG_RESOLUTION, M_KV_TRANSFERS, M_PAIRINGS, M_SECONDS_LOST)
RETRACTED: dict[str, str] = {}
for _m in list(_METRICS):
    if _m.name in VERDICT_COUNTERS:
        RETRACTED[_m.name] = _metric(
            _m.name.removesuffix("_total") + "_retracted_total",
            "counter",
            f"Counts of {_m.name} withdrawn by a later re-assembly of the request (under the labels"
            " they were counted with); subtract for the verdicts stored now.",
            _m.labels,
        )
del _m
M_REQUESTS_RETRACTED = RETRACTED[M_REQUESTS]
M_FLAGS_RETRACTED = RETRACTED[M_FLAGS]
M_SECONDS_LOST_RETRACTED = RETRACTED[M_SECONDS_LOST]
# Ingest and assembly health.
M_SPANS_RECEIVED = _metric(
    "llm_d_tracing_spans_received_total", "counter", "Spans committed, by receiver.", ("protocol",)
)
M_SPANS_REJECTED = _metric(
    "llm_d_tracing_spans_rejected_total", "counter", "Spans rejected, by reason.", ("reason",)
)
M_EXPORTS = _metric(
    "llm_d_tracing_export_requests_total",
    "counter",
    "OTLP export calls, by receiver and outcome.",
    ("protocol", "outcome"),
)
M_TRACE_SPAN_LIMIT_DROPPED = _metric(
    "llm_d_tracing_trace_span_limit_dropped_spans_total",
    "counter",
    "Spans dropped because their trace id already held `max_spans_per_trace` spans.",
)
M_DUPLICATE_SPANS = _metric(
    "llm_d_tracing_duplicate_spans_total", "counter", "Spans received again (exporter retries)."
)
M_LATE_SPANS = _metric(
    "llm_d_tracing_late_spans_total", "counter", "Spans that reopened an assembled request."
)
M_STITCHED = _metric(
    "llm_d_tracing_stitched_requests_total", "counter", "Requests joined from several traces."
)
# `reason` of M_SPANS_REJECTED for spans dropped by the per-trace cap.
REJECT_TRACE_SPAN_LIMIT = "trace_span_limit"
M_REDONE = _metric(
    "llm_d_tracing_assembly_redone_total",
    "counter",
    "Requests assembled ahead of the end of their quiet period and dropped because a span arrived"
    " meanwhile; assembled again later (work `assembly_lookahead_s` wasted).",
)
M_INGEST_QUEUE = _metric(
    "llm_d_tracing_ingest_queue_depth", "gauge", "Spans accepted by receivers, waiting for commit."
)
M_PENDING = _metric(
    "llm_d_tracing_pending_requests", "gauge", "Traces waiting for their quiet period to assemble."
)
M_ASSEMBLY_LAG = _metric(
    "llm_d_tracing_assembly_lag_seconds",
    "histogram",
    "From a request's last span arriving to its verdict being stored.",
    # Fine steps just above the default 2 s quiet period, where a keeping-up service sits.
    buckets=(0.1, 0.25, 0.5, 1.0, 2.0, 2.1, 2.25, 2.5, 3.0, 5.0, 10.0, 30.0, 60.0),
)
M_THROTTLED = _metric(
    "llm_d_tracing_throttled_exports_total",
    "counter",
    "Exports answered 429/503 (backpressure).",
    ("protocol",),
)
M_CONTRACT = _metric(
    "llm_d_tracing_contract_obligations",
    "gauge",
    "Pods per topology-contract obligation and status.",
    ("obligation", "status"),
)
M_ASSEMBLY_FAILURES = _metric(
    "llm_d_tracing_assembly_failures_total",
    "counter",
    "Assembly steps that raised and were skipped, by step (`AssemblyStage`) and exception type: a"
    " request (or a span's join keys) left out instead of the round failing. Logged once per kind.",
    ("stage", "error"),
)

M_TRACED_SHARE = _metric(
    "llm_d_tracing_traced_share",
    "gauge",
    "Estimated share of the served requests that railtrace received traces of, over the last"
    " `sampling_window_s`, by how it was estimated (`prometheus`: requests assembled / requests the"
    " EPP or vLLM counted; `tracestate`: from the samplers' `ot=th:` thresholds). NaN: unknown. Below"
    " 1, counts are of the traced requests only.",
    ("source",),
)


class AssemblyStage(StrEnum):
    """Where an assembly failure happened (`stage` of M_ASSEMBLY_FAILURES)."""

    REQUEST_KEYS = "request_keys"  # a span's join keys (the span then joins by trace id only)
    GROUP = "group"  # dedupe and stitching of a page's spans into requests (the page yields none)
    BUILD = "build"  # one request's facts (that request yields no summary)
    JUDGE = "judge"  # one request's verdicts (that request yields no summary)
    ASSEMBLE = "assemble"  # a whole group, when the assembly function itself raised


# Labels whose values are not from a fixed set: a sender chooses its model name and the nodes and
# NICs its spans claim (and `error` is an exception type's name), each with the set of values it
# draws from. The service bounds each set (railtrace.metrics.LabelBound):
# values listed in the settings or known to the topology, then the first
# `metrics_label_values` others seen, get series of their own; the rest are counted under
# LABEL_OTHER. Every other label takes values from the code's own fixed sets.
BOUNDED_LABELS: dict[str, str] = {
    "model": "model",
    "node": "node",
    "prefill_node": "node",
    "decode_node": "node",
    "nic": "nic",
    "error": "error",
}
LABEL_OTHER = "other"

METRICS: tuple[Metric, ...] = tuple(_METRICS)
METRICS_BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}

# Exemplar label carrying the trace id on the service's histograms; Grafana's
# `exemplarTraceIdDestinations` link it to Tempo/Jaeger and to /api/v1/traces/{id}.
EXEMPLAR_TRACE_ID_LABEL = "trace_id"

# Metric families of llm-d and vLLM that railtrace's dashboards place beside its own
# (read only; scraped from the EPP and the model servers, never exposed by railtrace).
EXTERNAL_METRICS: dict[str, str] = {
    "llm_d_epp_disagg_decision_total": "llm-d EPP: P/D disaggregation decisions by decision_type.",
    "llm_d_epp_request_ttft_seconds": "llm-d EPP: time to first token seen by the gateway.",
    "vllm:time_to_first_token_seconds": "vLLM: engine time to first token.",
    "vllm:nixl_xfer_time_seconds": "vLLM NixlConnector: transfer time per rank-level transfer.",
    "vllm:nixl_bytes_transferred": "vLLM NixlConnector: bytes per rank-level transfer.",
    "vllm:nixl_num_failed_transfers": "vLLM NixlConnector: failed transfers.",
    # vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py, vLLM 0.34.0 l.266 and l.276
    # (the first since 0.19.1 at least, in 0.21.0 l.231): counters, exposed with `_total`.
    "vllm:nixl_num_kv_expired_reqs": (
        "vLLM NixlConnector (prefill side): requests whose KV lease expired before decode read it."
    ),
    "vllm:nixl_num_notifications_after_expiry": (
        "vLLM NixlConnector: completion notifications for requests no longer tracked (KV blocks "
        "possibly reused before the transfer finished); in vLLM 0.34.0, not in 0.24.0."
    ),
}


# ---------------------------------------------------------------------------------------
# Environment variables read by the shims (zero-code enablement)
# ---------------------------------------------------------------------------------------

ENV_ENABLE = "RAILTRACE_SHIMS"  # comma list: nixl,gateway,router,pd or "all"; empty = off
ENV_UCX_LOG = "RAILTRACE_UCX_LOG"  # where the shim routes UCX's log (file the shim owns)
ENV_UCX_CAPTURE = "RAILTRACE_UCX_CAPTURE"  # "0" leaves UCX_LOG_* alone (evidence then `unknown`)
ENV_OTEL_SETUP = "RAILTRACE_OTEL_SETUP"  # "0": never build a tracer provider from OTEL_* variables
ENV_KV_HOT_PATH = "RAILTRACE_KV_HOT_PATH"  # "python": the KV shim's Python patches, not the C ones
# Shim names that switch the KV-transfer shim on (the vLLM plugin and opentelemetry-instrument).
KV_SHIM_NAMES = frozenset({"nixl", "kv", "kv_transfer", "vllm"})
ENV_VARS: dict[str, str] = {
    ENV_ENABLE: "Which shims `opentelemetry-instrument` turns on (`all`, or a comma list). Off when unset.",
    ENV_UCX_LOG: "Path of the UCX log file the KV shim reads evidence from (default: a private temp file).",
    ENV_UCX_CAPTURE: "`0` stops the KV shim from setting UCX_LOG_LEVEL/UCX_PROTO_INFO/UCX_LOG_FILE.",
    ENV_OTEL_SETUP: "`0`: the KV shim never builds a tracer provider from the standard `OTEL_*` variables.",
    ENV_KV_HOT_PATH: "`python`: the KV shim's Python patches of NIXL, even where its C hot path is built.",
}
