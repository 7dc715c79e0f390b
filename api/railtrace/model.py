"""The core data shapes that flow between the parts of the correlator.

    OTLP bytes --decode--> Span --normalise--> Span(role, request_key)
      --store--> rows --assemble--> RequestFacts --judge(topology)--> RequestSummary

Each arrow is a separate package (`otlp`, `normalize`, `store`, `assembly`, `verdicts`);
these types are the contracts between them, so they live here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

AttrValue = str | bool | int | float | list[Any] | dict[str, Any] | None
# (request key, trace id, the trace's first arrival in ns or None): a trace holding a key.
KeyHolder = tuple[str, str, int | None]


@dataclass(slots=True)
class Span:
    """One span as received, with hex ids and plain Python attribute values.

    `role`, `canonical_name`, `generation` and `request_key` are filled by normalisation;
    everything else is what the sender sent (minus content attributes, dropped at ingest).
    """

    trace_id: str  # 32 lowercase hex
    span_id: str  # 16 lowercase hex
    parent_span_id: str | None
    name: str
    kind: int  # OTLP SpanKind number (0 unspecified, 1 internal, 2 server, 3 client, ...)
    start_ns: int
    end_ns: int
    status_code: int = 0  # 0 unset, 1 ok, 2 error
    status_message: str = ""
    service_name: str = ""
    scope_name: str = ""
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    resource: dict[str, AttrValue] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    # Filled by normalisation.
    role: str = "other"
    canonical_name: str = ""
    generation: str = ""
    request_key: str | None = None
    # Memo of `normalize.span_request_keys` (assembly asks for a span's keys several times).
    join_keys: list[str] | None = field(default=None, repr=False, compare=False)

    @property
    def duration_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9


@dataclass(slots=True)
class Endpoint:
    """Where one leg of a request ran, as far as the spans say; topology fills the rest."""

    pod: str | None = None
    node: str | None = None
    gpu: str | None = None
    nic: str | None = None
    rail: str | None = None
    address: str | None = None  # host:port the router or sidecar named
    host: str | None = None  # host.name resource attribute
    service: str | None = None
    span_id: str | None = None
    # Identity evidence (docs/normalisation.md, "Identity"): how `pod` was found, the engine's
    # own pod IP and OTLP sender address, and the sidecar's sender (its pod is the decode pod).
    identity: str | None = None
    pod_ip: str | None = None
    peer: str | None = None
    sidecar_peer: str | None = None
    # A `k8s.pod.name` the sender claimed for itself with no trusted collector vouching: believed
    # only where the topology gives that pod the sender's address (`peer`).
    claimed_pod: str | None = None

    def copy(self) -> Endpoint:
        """A shallow copy; positional, several times cheaper than `dataclasses.replace`."""
        return Endpoint(
            self.pod,
            self.node,
            self.gpu,
            self.nic,
            self.rail,
            self.address,
            self.host,
            self.service,
            self.span_id,
            self.identity,
            self.pod_ip,
            self.peer,
            self.sidecar_peer,
            self.claimed_pod,
        )


@dataclass(slots=True)
class Candidate:
    """One endpoint the router scored."""

    endpoint: str
    score: float | None = None
    scorer_scores: dict[str, float] = field(default_factory=dict)
    topology: str | None = None  # zone/block/subblock/host when the router shim recorded it
    pod: str | None = None


@dataclass(slots=True)
class RouterPick:
    """One pick of the router: which profile, what it chose, and among what."""

    profile: str  # prefill | decode | "" when unknown
    chosen: str | None
    candidates: list[Candidate]
    span_id: str
    source: str  # "router_shim" | "epp_picker"


@dataclass(slots=True)
class KVFacts:
    """What the KV-transfer span (or, lacking one, inference) says about the transfer."""

    span_id: str | None = None
    operation: str | None = None
    connector: str | None = None
    backend: str | None = None
    bytes: int | None = None
    descriptors: int | None = None
    duration_s: float | None = None
    transport: str = "unknown"
    devices: list[str] = field(default_factory=list)
    split: list[float] = field(default_factory=list)
    local_gpu: str | None = None
    remote_host: str | None = None
    remote_engine_id: str | None = None
    error_type: str | None = None
    evidence: str | None = None
    # Where the transfer ran (resource attributes of the emitting process).
    pod: str | None = None
    node: str | None = None
    host: str | None = None


@dataclass(slots=True)
class Flag:
    name: str
    evidence: str
    span_id: str | None = None


@dataclass(slots=True)
class RequestFacts:
    """Everything assembly learnt about one request from its spans, before topology.

    The verdicts turn this plus the topology model into the request summary.
    """

    trace_id: str  # the primary trace (the one holding the gateway or sidecar root)
    trace_ids: list[str]
    request_id: str | None
    model: str | None
    start_ns: int
    end_ns: int
    ttft_s: float | None
    e2e_s: float | None
    breakdown_s: dict[str, float]
    prefill: Endpoint
    decode: Endpoint
    kv: KVFacts | None
    picks: list[RouterPick]
    flags: list[Flag]  # flags assembly can decide alone (broken_trace)
    span_count: int
    complete: bool  # root ended; False while hops are still missing
    timing_sources: dict[str, str] = field(default_factory=dict)  # stage -> attribute/span used
    # Which hops were traced and how the request's traces were joined ("Coverage").
    coverage: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class KVSummary:
    transport: str = "unknown"
    path_class: str = "unknown"
    bytes: int | None = None
    duration_s: float | None = None
    devices: list[str] = field(default_factory=list)
    evidence: str | None = None
    # The P2P source the transfer was judged against instead of the prefill pod (five leg
    # keys); the summary has the key only when there is one.
    source: dict[str, str | None] | None = None


@dataclass(slots=True)
class RequestSummary:
    """The request summary of PRODUCT.md (keys fixed; extensions after `flags`)."""

    trace_id: str
    request_id: str | None
    model: str | None
    start: str  # RFC 3339 UTC
    ttft_s: float | None
    e2e_s: float | None
    breakdown_s: dict[str, float]
    prefill: dict[str, str | None]
    decode: dict[str, str | None]
    kv_transfer: KVSummary | None
    flags: list[Flag]
    # Extensions.
    trace_ids: list[str] = field(default_factory=list)
    span_count: int = 0
    complete: bool = True
    pairing_level: str | None = None
    # How each leg's pod was found (`semconv.Identity`) and whether both legs reached node,
    # GPU and NIC; which hops the deployment traces (docs/normalisation.md, "Coverage").
    identity: dict[str, str | None] = field(default_factory=dict)
    resolved: bool = False
    coverage: dict[str, Any] = field(default_factory=dict)
    # What the KV path cost against the aligned path (`verdicts.cost`); None without a transfer.
    cost: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready dicts, like `dataclasses.asdict` but without its deep
        copies (it ran once per assembled request and was a tenth of assembly's time)."""
        kv = self.kv_transfer
        return {
            "trace_id": self.trace_id,
            "request_id": self.request_id,
            "model": self.model,
            "start": self.start,
            "ttft_s": self.ttft_s,
            "e2e_s": self.e2e_s,
            "breakdown_s": dict(self.breakdown_s),
            "prefill": dict(self.prefill),
            "decode": dict(self.decode),
            "kv_transfer": None
            if kv is None
            else {
                "transport": kv.transport,
                "path_class": kv.path_class,
                "bytes": kv.bytes,
                "duration_s": kv.duration_s,
                "devices": list(kv.devices),
                "evidence": kv.evidence,
                **({} if kv.source is None else {"source": dict(kv.source)}),
            },
            "flags": [{"name": f.name, "evidence": f.evidence, "span_id": f.span_id} for f in self.flags],
            "trace_ids": list(self.trace_ids),
            "span_count": self.span_count,
            "complete": self.complete,
            "pairing_level": self.pairing_level,
            "identity": dict(self.identity),
            "resolved": self.resolved,
            "coverage": dict(self.coverage),
            "cost": None if self.cost is None else dict(self.cost),
        }


LEG_KEYS = ("pod", "node", "gpu", "nic", "rail")
# `coverage` key of the P2P KV source a sidecar named ({address, span_id}): set by assembly,
# read by the verdicts, which judge the KV transfer against it.
KV_SOURCE = "kv_source"
UNRESOLVED = "unresolved"


def resolution_label(resolved: bool, identity: dict[str, str | None]) -> str:
    """How both legs reached node, GPU and NIC: `<prefill identity>+<decode identity>` (the
    evidence that decided each pod, `semconv.Identity`), or `unresolved` (stats and metrics)."""
    if not resolved:
        return UNRESOLVED
    return f"{identity.get('prefill') or 'none'}+{identity.get('decode') or 'none'}"[:64]


def leg_dict(endpoint: Endpoint) -> dict[str, str | None]:
    """The five public keys of a leg (`prefill`/`decode`) in the summary."""
    return {k: getattr(endpoint, k) for k in LEG_KEYS}


def rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat().replace("+00:00", "Z")
