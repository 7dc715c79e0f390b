"""The one settings object. Every option reads from a `RAILTRACE_*` environment variable."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# More assembly children than this would only queue for the same database.
MAX_ASSEMBLY_PROCESSES = 32
# A sender on the service's own host or pod: its collector, or the operator (docs/reliability.md §11).
LOOPBACK_COLLECTORS = ("127.0.0.0/8", "::1/128")


def default_db_url() -> str:
    return f"sqlite:///{Path.cwd() / 'railtrace.db'}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RAILTRACE_", env_ignore_empty=True, extra="ignore")

    db: str = Field(default_factory=default_db_url, description="SQLAlchemy URL of the store.")
    topology: list[str] = Field(default_factory=list, description="Topology files or folders.")
    host: str = "127.0.0.1"
    port: int = 4318
    grpc_port: int = 4317

    # Ingest.
    max_body_bytes: int = Field(16 * 1024 * 1024, description="Limit before and after decompression.")
    max_drain_bytes: int = Field(
        64 * 1024 * 1024,
        description="A body over max_body_bytes is read and discarded up to this many bytes before the"
        " 413 is sent, so ordinary clients read the 413 instead of a reset connection; beyond it the"
        " 413 is sent at once and the connection closed.",
    )
    max_pending_spans: int = Field(200_000, description="Accepted-but-uncommitted spans before 429/503.")
    write_batch_spans: int = 4096
    max_spans_per_trace: int = Field(
        10_000,
        ge=0,
        description="Spans one trace id may hold; an export call's spans of a trace that would take it"
        " past this are dropped and answered as partial success (0: no cap).",
    )
    parse_inline_max_bytes: int = Field(
        1024 * 1024,
        description="Protobuf exports up to this size (after decompression) are parsed on the event loop,"
        " not in a worker thread (0: always a worker thread).",
    )
    retry_after_s: int = 1
    write_retry_max_s: float = Field(
        5.0,
        gt=0,
        description="While database writes fail, the writer retries the database itself, backing off"
        " from 0.1 s up to this; exports are refused (503) until a write commits.",
    )
    write_failure_restart_s: float = Field(
        300.0,
        ge=0,
        description="Database writes failing for this long make the liveness probe (/healthz) answer 503,"
        " so the orchestrator restarts the process; 0: never.",
    )

    # Assembly.
    quiet_period_s: float = Field(2.0, description="A request is assembled this long after its last span.")
    assembly_interval_s: float = Field(
        0.2,
        gt=0,
        description=(
            "Longest time between two looks for requests ready to assemble. With a lookahead the"
            " assembler looks at least twice per lookahead, so requests are claimed before their"
            " quiet period ends; without one a request may wait this long past it."
        ),
    )
    assembly_lookahead_s: float = Field(
        1.0,
        ge=0,
        description=(
            "Assemble a request up to this long (at most half the quiet period) before its quiet"
            " period ends, and store it as soon as it has ended unless a span arrived meanwhile."
        ),
    )
    assembly_processes: Annotated[int, Field(ge=0, le=MAX_ASSEMBLY_PROCESSES)] | Literal["auto"] = Field(
        "auto",
        description=(
            "Assemble in this many child processes (other cores) instead of a thread; 0 = a thread;"
            " auto = 2 where the service may use at least 2 CPUs (affinity and container CPU quota),"
            " else a thread."
        ),
    )
    max_trace_wait_s: float = Field(300.0, description="Assemble even without an ended root after this.")
    # Well above the 32 traces one request id stitches: a group of a request and the junk traces
    # sent later with its ids must stay whole, so that the join rules (not a cut by trace id)
    # decide which hops are the request's. max_group_spans bounds memory.
    max_group_traces: int = Field(
        1000,
        ge=1,
        description="Traces assembled as one stitched request at most; a group of traces linked by request"
        " ids that holds more is split into parts of consecutive trace ids, each noted in its coverage.",
    )
    max_group_spans: int = Field(
        100_000,
        ge=1,
        description="Spans assembled as one stitched request at most (a single trace is never cut); a"
        " larger group is split as for max_group_traces.",
    )

    # Verdicts.
    score_tolerance: float = Field(0.05, description="Router scores this close count as comparable.")
    slow_fraction: float = Field(0.25, description="Below this share of expected bandwidth is slow.")

    # Access (docs/reliability.md).
    ingest_token: str | None = Field(None, description="Bearer token OTLP exporters must send; unset: open.")
    api_token: str | None = Field(None, description="Bearer token for /api/...; unset: open.")
    tls_cert: str | None = Field(None, description="PEM certificate (chain) for TLS on HTTP and gRPC.")
    tls_key: str | None = Field(None, description="PEM private key of tls_cert.")
    cors_origins: list[str] = Field(default_factory=list, description="CORS allow-list; empty: CORS off.")
    api_docs: bool = Field(
        False,
        description="Serve FastAPI's /docs (Swagger UI) and /redoc. They load scripts from a public"
        " CDN (cdn.jsdelivr.net) without integrity checks; /openapi.json is served either way.",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Addresses/CIDRs of proxies (e.g. an OTel collector) whose X-Forwarded-For header "
        "or gRPC metadata names the real OTLP sender; from anyone else it is ignored.",
    )
    trusted_collectors: list[str] = Field(
        default_factory=lambda: list(LOOPBACK_COLLECTORS),
        description="Addresses/CIDRs of OTel collectors whose k8s.pod.name and k8s.pod.ip (their "
        "k8sattributes) are believed. From any other sender those claims count only where they agree "
        "with its address (the peer, or X-Forwarded-For from a trusted proxy). Default: loopback (a "
        "collector in the service's own pod or host); listing any replaces it.",
    )
    max_connections: int = Field(
        1000,
        description="Open HTTP connections. At the limit a new connection closes the one that has waited"
        " longest for a request head (idle or slow); only if every one has a request in progress is the"
        " new one answered 503.",
    )
    max_request_line_bytes: int = Field(8192, description="Longest request URL (HTTP 414 beyond it).")
    max_headers: int = Field(100, description="Most headers in a request (HTTP 431 beyond it).")
    max_head_bytes: int = Field(
        64 * 1024,
        description="Most bytes of a request head, request line and headers (HTTP 431 beyond it); also"
        " gRPC's limit on a call's metadata.",
    )
    head_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A request head must be complete this long after its first byte, else the"
        " connection is closed; also the gRPC connection handshake's deadline.",
    )
    idle_timeout_s: float = Field(
        30.0, gt=0, description="An HTTP or gRPC connection with no request in progress is closed after this."
    )
    body_timeout_s: float = Field(30.0, description="An export's body must arrive within this, else 408.")

    # Metrics (docs/deploy.md, "Metrics").
    metrics_token: str | None = Field(
        None, description="Bearer token Prometheus must send for /metrics; unset: /metrics is open."
    )
    metrics_label_values: int = Field(
        50,
        ge=0,
        description="Per bounded label set (models, nodes, NICs): how many values not listed and not in"
        " the topology get series of their own, first seen first; later ones are counted as `other`.",
    )
    metrics_models: list[str] = Field(
        default_factory=list,
        description="Model names that always get series of their own (JSON list), beyond"
        " metrics_label_values.",
    )
    metrics_max_series: int = Field(
        400,
        ge=1,
        description="Most series of one metric family; past it, new label sets count their"
        " sender-chosen values (model, node, NIC) as `other`.",
    )

    # Traced share (railtrace.server.sampling; docs/deploy.md, "Sampling").
    prometheus_url: str | None = Field(
        None,
        description="Prometheus that scrapes the EPP and vLLM: railtrace compares the requests they"
        " counted with the requests it assembled over the same window (the traced share); unset:"
        " the share comes from sampling thresholds in tracestate, or is unknown.",
    )
    prometheus_request_counters: list[str] = Field(
        default_factory=lambda: [
            "llm_d_epp_request_total",
            "inference_objective_request_total",
            "vllm:request_success_total",
        ],
        description="Counter selectors of served requests, tried in order; the first with series in"
        " the window counts the traffic (a selector may carry labels, e.g. decode pods only).",
    )
    sampling_window_s: float = Field(
        300.0, gt=0, description="Window over which the traced share is estimated."
    )
    sampling_lag_s: float = Field(
        60.0,
        ge=0,
        description="The window ends this long ago, so that its requests have been assembled"
        " (keep it above quiet_period_s).",
    )
    sampling_refresh_s: float = Field(
        30.0, gt=0, description="How often the traced share is estimated again from Prometheus."
    )

    # Query API reads (railtrace.server.read_gate): bounded so that readers cannot starve ingest.
    read_concurrency: int = Field(
        4,
        ge=1,
        description="API reads (GET /api/...) answered at once; more wait their turn. Ingest, probes"
        " and /metrics never wait for it.",
    )
    read_concurrency_ingesting: int = Field(
        1,
        ge=1,
        description="API reads answered at once while ingest is busy (an export in progress or spans"
        " waiting for their commit); at most read_concurrency.",
    )
    read_share_ingesting: float = Field(
        0.25,
        gt=0,
        le=1,
        description="While ingest is busy, the share of the time each read turn may be in use: after a"
        " read the turn rests for (1 - share) / share times as long as it took (at most 1 s); 1: no rest.",
    )
    read_queue: int = Field(
        1000,
        ge=0,
        description="API reads that may wait for a turn; one more is answered 503 with Retry-After.",
    )
    read_wait_s: float = Field(
        20.0,
        gt=0,
        description="An API read that has not had its turn after this is answered 503 with Retry-After.",
    )

    # Privacy.
    drop_attributes: list[str] | None = Field(
        None,
        description="Attribute keys dropped at ingest (`prefix.*` matches by prefix); unset: prompt and "
        "completion content (railtrace.otlp.content.DEFAULT_DROP_ATTRIBUTES). The registry's content "
        "attributes are always dropped.",
    )

    # Queries (searches and trace reads: the Tempo API, /api/v1/traces, /api/v1/requests).
    query_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Time budget of one search or trace read, waiting for its turn included. A scan"
        " that reaches it answers with what it found, marked partial; one that found nothing it can"
        " answer with, or a database call still running 2 s past it, is answered 503.",
    )
    query_concurrency: int = Field(
        4,
        ge=1,
        description="Searches and trace reads that run at once, each on a thread of its own; more wait"
        " for a turn within their time budget, then get 503 with Retry-After.",
    )
    grafana_url: str = Field(
        "",
        max_length=2000,
        description="Base URL of a Grafana that has railtrace as a Tempo data source, as a browser"
        " reaches it (e.g. https://grafana.example.com); the UI's request page then links to the"
        " trace in Grafana's Explore. Empty: no link.",
    )
    grafana_datasource_uid: str = Field(
        "railtrace",
        max_length=200,
        description="uid of that data source (the provisioned one's is `railtrace`).",
    )
    search_max_requests: int = Field(
        2000, ge=1, description="Requests one Tempo search inspects at most; beyond it the answer is partial."
    )
    search_max_spans: int = Field(
        200_000,
        ge=1,
        description="Spans one Tempo search (or tag-values lookup) reads at most; beyond it the answer is"
        " partial.",
    )
    trace_max_spans: int = Field(
        10_000,
        ge=1,
        description="Spans one trace read answers with at most: a Tempo trace by id beyond it is cut"
        " short and marked partial; a page of /api/v1/traces ends there with a cursor to the rest.",
    )

    # Storage.
    retention_hours: float = Field(0.0, description="Delete requests older than this; 0 keeps all.")

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("TLS needs both a certificate and its key (tls_cert and tls_key)")
        return self

    @field_validator("trusted_proxies", "trusted_collectors")
    @classmethod
    def _networks(cls, value: list[str], info: ValidationInfo) -> list[str]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{info.field_name}: {item!r} is not an IP address or CIDR") from None
        return value

    @field_validator("db")
    @classmethod
    def _normalise_db(cls, value: str) -> str:
        if value.startswith("postgresql://") or value.startswith("postgres://"):
            return "postgresql+psycopg://" + value.split("://", 1)[1]
        return value
