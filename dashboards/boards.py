"""The six railtrace dashboards, each answering one question an SRE asks of a P/D fleet.

Panels querying llm-d's or vLLM's own series (`semconv.EXTERNAL_METRICS`) sit in a collapsed
row at the bottom, so a cluster without them still reads cleanly.
"""

from __future__ import annotations

from collections.abc import Callable

from grafana_foundation_sdk.builders.dashboard import Dashboard, DashboardLink, Row
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries

from dashboards.common import (
    LLMD_MODEL_LABEL,
    R_CONTRACT,
    R_CROSS_RAIL_RATIO,
    R_FLAGS,
    R_KV_DURATION_BUCKETS,
    R_KV_TRANSFERS,
    R_LEG_RESOLUTION,
    R_LEGS_RESOLVED_RATIO,
    R_REQUESTS,
    R_TCP_FALLBACK_RATIO,
    R_TTFT_BUCKETS,
    RAILTRACE,
    RANGE,
    RATE,
    TTFT_OBJECTIVE_LE,
    V_MODEL,
    V_NODE,
    dashboard,
    eq,
    instant_table,
    matrix_table,
    prom,
    re,
    request_links,
    sel,
    stat,
    suffix,
    table,
    timeseries,
    traces_table,
)
from railtrace_tracing import semconv
from railtrace_tracing.semconv import ContractStatus, FlagName, PathClass, TopologyLevel, Transport

MODEL = re("model", f"${V_MODEL}")
NODE = re("node", f"${V_NODE}")


def _ratio(numerator: str, denominator: str) -> str:
    """numerator / denominator that reads 0, not "no data", when the numerator has no series."""
    return f"(sum({numerator}) or 0 * sum({denominator})) / sum({denominator})"


def _quantile(q: float, bucket_expr: str, by: str) -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) ({bucket_expr}))"


def _rate(series: str) -> str:
    return f"rate({series}[{RATE}])"


LLMD_MODEL = re(LLMD_MODEL_LABEL, "$" + V_MODEL)


def _epp_decisions() -> Timeseries:
    """llm-d EPP's own P/D decisions, to hold beside the requests railtrace assembled."""
    decisions = _rate(sel("llm_d_epp_disagg_decision_total", LLMD_MODEL))
    return timeseries(
        "P/D decisions (llm-d EPP)",
        "decode-only versus prefill-decode decisions of the EPP.",
        [prom(f"sum by (decision_type) ({decisions})", "{{decision_type}}")],
        unit="reqps",
        width=24,
    )


def _contract_board_link() -> list[DashboardLink]:
    return [DashboardLink("Topology contract").url("/d/llm-d-tracing-contract").target_blank(False)]


def _seconds_lost_by_cause() -> str:
    """Seconds lost per second by cause, less re-assemblies' withdrawals (0 where none exist)."""
    lost = f"sum by (cause) ({_rate(sel(semconv.M_SECONDS_LOST))})"
    retracted = f"sum by (cause) ({_rate(sel(semconv.M_SECONDS_LOST_RETRACTED))})"
    return f"{lost} - ({retracted} or {lost} * 0)"


# -- overview -------------------------------------------------------------------------------


def overview() -> Dashboard:
    tcp_ratio = _ratio(sel(R_FLAGS, eq("flag", FlagName.TCP_FALLBACK)), sel(R_REQUESTS))
    cross_ratio = _ratio(
        sel(R_KV_TRANSFERS, eq("path_class", PathClass.RDMA_CROSS_RAIL)), sel(R_KV_TRANSFERS)
    )
    return (
        dashboard(
            "llm-d tracing / Overview",
            "llm-d-tracing-overview",
            "Did KV caches take the path the hardware promised? TCP fallback, cross-rail transfers, "
            "verdict flags and requests by path class, from railtrace's per-request verdicts.",
        )
        .with_row(Row("KV-cache path at a glance"))
        .with_panel(
            stat(
                "TCP-fallback ratio",
                "Share of requests whose KV cache went over TCP although both ends have RDMA (5m).",
                prom(tcp_ratio),
                unit="percentunit",
                red_at=0.001,
                links=request_links(flag=FlagName.TCP_FALLBACK),
            )
        )
        .with_panel(
            stat(
                "Cross-rail ratio",
                "Share of KV transfers that ran over RDMA on another rail than the GPU's (5m).",
                prom(cross_ratio),
                unit="percentunit",
                red_at=0.10,
                links=request_links(flag=FlagName.CROSS_RAIL),
            )
        )
        .with_panel(
            stat(
                "Requests assembled",
                "Requests railtrace assembled and judged, per second (5m).",
                prom(f"sum({sel(R_REQUESTS, MODEL)})"),
                unit="reqps",
            )
        )
        .with_panel(
            stat(
                "Pods breaking the topology contract",
                "Pods with at least one obligation judged broken on evidence.",
                prom(f"sum({sel(semconv.M_CONTRACT, eq('status', ContractStatus.BROKEN))})"),
                red_at=1,
                links=_contract_board_link(),
            )
        )
        .with_row(Row("Over time"))
        .with_panel(
            timeseries(
                "TCP-fallback and cross-rail ratio",
                "Per namespace, from the recording rules the alerts share.",
                [
                    prom(sel(R_TCP_FALLBACK_RATIO), "tcp fallback {{namespace}}", ref="A"),
                    prom(sel(R_CROSS_RAIL_RATIO), "cross rail {{namespace}}", ref="B"),
                ],
                unit="percentunit",
            )
        )
        .with_panel(
            timeseries(
                "Flags over time",
                "Verdict flags raised per second; click a series for those requests in railtrace.",
                [prom(f"sum by (flag) ({_rate(sel(semconv.M_FLAGS))})", "{{flag}}", exemplar=True)],
                unit="reqps",
                links=[
                    DashboardLink("railtrace: requests with this flag")
                    .url(f"{RAILTRACE}/requests?flag=${{__field.labels.flag}}")
                    .target_blank(True)
                ],
            )
        )
        .with_panel(
            timeseries(
                "Seconds lost by cause",
                "TTFT seconds lost per second against the KV path the topology promised, each request "
                "under its primary cause (`none`: off its aligned path without a flag), net of what "
                "re-assemblies withdrew (docs/incidents.md). Exemplars open a costly request.",
                [prom(_seconds_lost_by_cause(), "{{cause}}", exemplar=True)],
                unit="s",
                stacked=True,
                width=24,
                links=[
                    DashboardLink("railtrace: requests with this flag")
                    .url(f"{RAILTRACE}/requests?flag=${{__field.labels.cause}}")
                    .target_blank(True)
                ],
            )
        )
        .with_panel(
            timeseries(
                "Requests by path class",
                "Assembled requests per second by the path their KV cache took.",
                [
                    prom(
                        f"sum by (path_class) ({_rate(sel(semconv.M_REQUESTS, MODEL))})",
                        "{{path_class}}",
                        exemplar=True,
                    )
                ],
                unit="reqps",
                stacked=True,
                width=24,
                links=request_links(),
            )
        )
        .with_row(Row("Resolution and tracing coverage"))
        .with_panel(
            timeseries(
                "Both legs resolved to node, GPU and NIC",
                "Share of requests with both engines traced whose prefill and decode legs both reached "
                "node, GPU and NIC (the LLMDTracingLegResolutionLow alert's series).",
                [prom(sel(R_LEGS_RESOLVED_RATIO), "{{namespace}}")],
                unit="percentunit",
            )
        )
        .with_panel(
            timeseries(
                "Requests by tracing recipe and resolution method",
                "Which hops the deployment traces (full, decode_only, epp_only, engines, partial) and "
                "which evidence placed both legs (k8s_resource, pod_ip, otlp_peer, epp_pick, "
                "pd_address, sidecar_pod), or unresolved.",
                [prom(f"sum by (recipe, resolution) ({sel(R_LEG_RESOLUTION)})", "{{recipe}} {{resolution}}")],
                unit="reqps",
                stacked=True,
            )
        )
        .with_row(Row("Traces"))
        .with_panel(
            traces_table(
                "Recent KV transfers over TCP (trace store)",
                "Spans whose transport was TCP; the trace id opens railtrace's verdict on that request.",
                f'{{ span.{semconv.KV_TRANSPORT} = "{Transport.TCP}" }}',
            )
        )
        .with_row(
            Row("llm-d beside railtrace")
            .collapsed(True)
            .with_panel(
                _epp_decisions(),
            )
        )
    )


# -- KV transfer ------------------------------------------------------------------------------


def kv_transfer() -> Dashboard:
    duration = suffix(semconv.M_KV_DURATION, "bucket")
    bandwidth = suffix(semconv.M_KV_BANDWIDTH, "bucket")
    node_bytes = sel(semconv.M_KV_NODE_BYTES, NODE)
    node_seconds = sel(semconv.M_KV_NODE_SECONDS, NODE)
    return (
        dashboard(
            "llm-d tracing / KV transfer",
            "llm-d-tracing-kv-transfer",
            "KV-cache transfer duration and bandwidth by path class, per node and NIC, with exemplars "
            "linking to the request's trace.",
        )
        .with_row(Row("By path class"))
        .with_panel(
            timeseries(
                "KV-transfer duration p50 / p99 by path class",
                "Exemplars link each point to its trace (Tempo/Jaeger) and to railtrace's verdict.",
                [
                    prom(
                        _quantile(0.5, _rate(sel(duration)), "path_class"),
                        "p50 {{path_class}}",
                        ref="A",
                        exemplar=True,
                    ),
                    prom(
                        _quantile(0.99, _rate(sel(duration)), "path_class"),
                        "p99 {{path_class}}",
                        ref="B",
                        exemplar=True,
                    ),
                ],
                unit="s",
            )
        )
        .with_panel(
            timeseries(
                "KV-transfer bandwidth p10 / p50 by path class",
                "Effective bytes per second of each transfer; a TCP fallback sits orders of magnitude "
                "below RDMA.",
                [
                    prom(
                        _quantile(0.1, _rate(sel(bandwidth)), "path_class"),
                        "p10 {{path_class}}",
                        ref="A",
                        exemplar=True,
                    ),
                    prom(
                        _quantile(0.5, _rate(sel(bandwidth)), "path_class"),
                        "p50 {{path_class}}",
                        ref="B",
                        exemplar=True,
                    ),
                ],
                unit="Bps",
            )
        )
        .with_panel(
            timeseries(
                "KV transfers by transport and path class",
                "Transfers per second, by the transport UCX actually used and the judged path class.",
                [
                    prom(
                        f"sum by (transport, path_class) ({sel(R_KV_TRANSFERS)})",
                        "{{transport}} / {{path_class}}",
                    )
                ],
                unit="ops",
                stacked=True,
                links=request_links(),
            )
        )
        .with_panel(
            timeseries(
                "KV-transfer p99 by namespace",
                "From the recorded bucket rates, for comparing pools.",
                [prom(_quantile(0.99, sel(R_KV_DURATION_BUCKETS), "namespace"), "{{namespace}}")],
                unit="s",
            )
        )
        .with_row(Row("By node and NIC"))
        .with_panel(
            timeseries(
                "KV throughput per node and NIC",
                "Bytes per second moved through each NIC (decode side, which runs the NIXL read).",
                [prom(f"sum by (node, nic) ({_rate(node_bytes)})", "{{node}} {{nic}}")],
                unit="Bps",
            )
        )
        .with_panel(
            timeseries(
                "Effective bandwidth per node and NIC",
                "Bytes over transfer seconds; one NIC far below its peers is the one to check.",
                [
                    prom(
                        f"sum by (node, nic) ({_rate(node_bytes)})"
                        f" / sum by (node, nic) ({_rate(node_seconds)})",
                        "{{node}} {{nic}}",
                    )
                ],
                unit="Bps",
            )
        )
        .with_panel(
            table(
                "Bytes by node, NIC and path class (time range)",
                "Which NICs carried which path classes over the dashboard's time range.",
                instant_table(f"sum by (node, nic, path_class) (increase({node_bytes}[{RANGE}]))"),
                unit="bytes",
                width=24,
            )
        )
        .with_row(
            Row("llm-d beside railtrace")
            .collapsed(True)
            .with_panel(
                timeseries(
                    "vLLM NIXL effective bandwidth per pod",
                    "vLLM's NixlConnector histograms (rank-level, not per request).",
                    [
                        prom(
                            f"sum by (pod) ({_rate(sel('vllm:nixl_bytes_transferred_sum'))})"
                            f" / sum by (pod) ({_rate(sel('vllm:nixl_xfer_time_seconds_sum'))})",
                            "{{pod}}",
                        )
                    ],
                    unit="Bps",
                )
            )
            .with_panel(
                timeseries(
                    "vLLM NIXL failed transfers per pod",
                    "vLLM's own failure counter, beside railtrace's kv_transfer_failed flag.",
                    [prom(f"sum by (pod) ({_rate(sel('vllm:nixl_num_failed_transfers_total'))})", "{{pod}}")],
                    unit="ops",
                )
            )
            .with_panel(
                timeseries(
                    "vLLM NIXL KV lease expiry beside kv_transfer_failed",
                    "vLLM's counters of requests whose KV lease expired on the prefill side before "
                    "decode read it, and of completion notifications that arrived after expiry (the "
                    "blocks may have been reused), per pod; railtrace's kv_transfer_failed flag rate "
                    "beside them. No failed span does not mean no expiry: vLLM frees expired blocks "
                    "without a transfer.",
                    [
                        prom(
                            f"sum by (pod) ({_rate(sel('vllm:nixl_num_kv_expired_reqs_total'))})",
                            "{{pod}} expired KV leases",
                        ),
                        prom(
                            f"sum by (pod) ({_rate(sel('vllm:nixl_num_notifications_after_expiry_total'))})",
                            "{{pod}} notifications after expiry",
                            ref="B",
                        ),
                        prom(
                            f"sum({_rate(sel(semconv.M_FLAGS, eq('flag', FlagName.KV_TRANSFER_FAILED)))})",
                            "railtrace kv_transfer_failed",
                            ref="C",
                        ),
                    ],
                    unit="ops",
                )
            )
        )
    )


# -- TTFT breakdown -----------------------------------------------------------------------------


def ttft() -> Dashboard:
    ttft_bucket = suffix(semconv.M_TTFT, "bucket")
    stage_sum, stage_count = suffix(semconv.M_STAGE, "sum"), suffix(semconv.M_STAGE, "count")
    return (
        dashboard(
            "llm-d tracing / TTFT breakdown",
            "llm-d-tracing-ttft",
            "Where the time to first token went: scheduling, prefill queue, prefill, KV transfer, "
            "decode queue and decode, by the path the KV cache took.",
        )
        .with_row(Row("Time to first token"))
        .with_panel(
            stat(
                "Requests within the TTFT objective",
                f"Share of requests with TTFT at or under {TTFT_OBJECTIVE_LE} s (objective: 90%).",
                prom(
                    f"sum({_rate(sel(ttft_bucket, eq('le', TTFT_OBJECTIVE_LE)))})"
                    f" / sum({_rate(sel(suffix(semconv.M_TTFT, 'count')))})"
                ),
                unit="percentunit",
                no_value="-",
                width=6,
                height=8,
            )
        )
        .with_panel(
            timeseries(
                "TTFT p50 / p90 / p99 by path class",
                "Exemplars link each point to its trace and to railtrace's verdict.",
                [
                    prom(
                        _quantile(0.5, _rate(sel(ttft_bucket)), "path_class"),
                        "p50 {{path_class}}",
                        ref="A",
                        exemplar=True,
                    ),
                    prom(
                        _quantile(0.9, _rate(sel(ttft_bucket)), "path_class"),
                        "p90 {{path_class}}",
                        ref="B",
                        exemplar=True,
                    ),
                    prom(
                        _quantile(0.99, _rate(sel(ttft_bucket)), "path_class"),
                        "p99 {{path_class}}",
                        ref="C",
                        exemplar=True,
                    ),
                ],
                unit="s",
                width=18,
                links=request_links(),
            )
        )
        .with_row(Row("Breakdown by stage"))
        .with_panel(
            timeseries(
                "Mean seconds per stage",
                "Stacked, the stages add up to the mean TTFT of requests with a complete breakdown.",
                [
                    prom(
                        f"sum by (stage) ({_rate(sel(stage_sum))})"
                        f" / sum by (stage) ({_rate(sel(stage_count))})",
                        "{{stage}}",
                    )
                ],
                unit="s",
                stacked=True,
            )
        )
        .with_panel(
            timeseries(
                "Stage p90 by path class",
                "A KV-transfer stage that grows only on one path class points at that path.",
                [
                    prom(
                        _quantile(0.9, _rate(sel(suffix(semconv.M_STAGE, "bucket"))), "stage, path_class"),
                        "{{stage}} / {{path_class}}",
                        exemplar=True,
                    )
                ],
                unit="s",
            )
        )
        .with_panel(
            matrix_table(
                "Mean stage seconds: path class x stage (time range)",
                "Each row a path class, each column a stage of the TTFT breakdown.",
                instant_table(
                    f"sum by (path_class, stage) (increase({sel(stage_sum)}[{RANGE}]))"
                    f" / sum by (path_class, stage) (increase({sel(stage_count)}[{RANGE}]))"
                ),
                rows="path_class",
                columns="stage",
                unit="s",
            )
        )
        .with_panel(
            timeseries(
                "TTFT p90 by namespace",
                "From the recorded bucket rates, for comparing pools.",
                [prom(_quantile(0.9, sel(R_TTFT_BUCKETS), "namespace"), "{{namespace}}")],
                unit="s",
            )
        )
        .with_row(
            Row("llm-d beside railtrace")
            .collapsed(True)
            .with_panel(
                timeseries(
                    "TTFT p90 seen by the gateway (llm-d EPP) and the engine (vLLM)",
                    "The EPP measures from the gateway, vLLM from the decode engine; railtrace joins both.",
                    [
                        prom(
                            _quantile(
                                0.9,
                                _rate(
                                    sel(
                                        "llm_d_epp_request_ttft_seconds_bucket",
                                        LLMD_MODEL,
                                    )
                                ),
                                LLMD_MODEL_LABEL,
                            ),
                            "EPP {{model_name}}",
                            ref="A",
                        ),
                        prom(
                            _quantile(
                                0.9,
                                _rate(
                                    sel(
                                        "vllm:time_to_first_token_seconds_bucket",
                                        LLMD_MODEL,
                                    )
                                ),
                                LLMD_MODEL_LABEL,
                            ),
                            "vLLM {{model_name}}",
                            ref="B",
                        ),
                    ],
                    unit="s",
                    width=24,
                )
            )
        )
    )


# -- P/D pairing ----------------------------------------------------------------------------------


def pairing() -> Dashboard:
    far_levels = "|".join((TopologyLevel.BLOCK, TopologyLevel.ZONE, TopologyLevel.FAR))
    pairings = sel(semconv.M_PAIRINGS, re("prefill_node", f"${V_NODE}"))
    blind_ratio = _ratio(sel(R_FLAGS, eq("flag", FlagName.TOPOLOGY_BLIND_PAIRING)), sel(R_REQUESTS))
    return (
        dashboard(
            "llm-d tracing / P/D pairing",
            "llm-d-tracing-pairing",
            "Which prefill node handed its KV cache to which decode node, how far apart they were, "
            "and how often the router passed over a closer decode worker.",
        )
        .with_row(Row("Pairings"))
        .with_panel(
            matrix_table(
                "Prefill node x decode node (time range)",
                "Requests per pairing; the node variable filters prefill nodes.",
                instant_table(f"sum by (prefill_node, decode_node) (increase({pairings}[{RANGE}]))"),
                rows="prefill_node",
                columns="decode_node",
                width=16,
            )
        )
        .with_panel(
            stat(
                "Topology-blind pairing rate",
                "Share of requests where a topologically closer decode candidate with a comparable "
                "router score was passed over (5m).",
                prom(blind_ratio),
                unit="percentunit",
                red_at=0.20,
                width=8,
                height=9,
                links=request_links(flag=FlagName.TOPOLOGY_BLIND_PAIRING),
            )
        )
        .with_panel(
            timeseries(
                "Pairings by topology level",
                "Nearest first: same host, NVLink domain, subblock, block, zone, far.",
                [prom(f"sum by (level) ({_rate(pairings)})", "{{level}}", exemplar=True)],
                unit="reqps",
                stacked=True,
            )
        )
        .with_panel(
            timeseries(
                "Topology-blind pairings",
                "Requests flagged topology_blind_pairing per second.",
                [
                    prom(
                        f"sum({_rate(sel(semconv.M_FLAGS, eq('flag', FlagName.TOPOLOGY_BLIND_PAIRING)))})",
                        "topology-blind",
                        exemplar=True,
                    )
                ],
                unit="reqps",
                links=request_links(flag=FlagName.TOPOLOGY_BLIND_PAIRING),
            )
        )
        .with_panel(
            table(
                "Far pairings by node pair (time range)",
                f"Pairings at level {far_levels}: the pairs whose KV cache left the block.",
                instant_table(
                    f"sum by (prefill_node, decode_node, level) "
                    f"(increase({sel(semconv.M_PAIRINGS, re('level', far_levels))}[{RANGE}]))"
                ),
                width=24,
            )
        )
        .with_row(
            Row("llm-d beside railtrace")
            .collapsed(True)
            .with_panel(
                _epp_decisions(),
            )
        )
    )


# -- railtrace health --------------------------------------------------------------------------------


def health() -> Dashboard:
    lag_bucket = suffix(semconv.M_ASSEMBLY_LAG, "bucket")
    return (
        dashboard(
            "llm-d tracing / railtrace health",
            "llm-d-tracing-health",
            "Is railtrace keeping up? Ingest rate, backpressure and throttling, rejected spans, "
            "queue depth, pending traces and assembly lag.",
        )
        .with_row(Row("Ingest"))
        .with_panel(
            timeseries(
                "Spans committed by receiver",
                "Spans written to the store per second, OTLP/HTTP versus OTLP/gRPC.",
                [prom(f"sum by (protocol) ({_rate(sel(semconv.M_SPANS_RECEIVED))})", "{{protocol}}")],
                unit="ops",
            )
        )
        .with_panel(
            timeseries(
                "OTLP export calls by outcome",
                "Export calls per second by receiver and outcome.",
                [
                    prom(
                        f"sum by (protocol, outcome) ({_rate(sel(semconv.M_EXPORTS))})",
                        "{{protocol}} {{outcome}}",
                    )
                ],
                unit="reqps",
            )
        )
        .with_panel(
            timeseries(
                "Backpressure: exports answered 429/503",
                "Throttled export calls per second; the collector retries them, sustained it drops spans.",
                [prom(f"sum by (protocol) ({_rate(sel(semconv.M_THROTTLED))})", "{{protocol}}")],
                unit="reqps",
            )
        )
        .with_panel(
            timeseries(
                "Rejected spans by reason",
                "Spans refused at ingest (malformed or invalid), per second.",
                [prom(f"sum by (reason) ({_rate(sel(semconv.M_SPANS_REJECTED))})", "{{reason}}")],
                unit="ops",
            )
        )
        .with_row(Row("Assembly"))
        .with_panel(
            timeseries(
                "Ingest queue depth and pending traces",
                "Spans accepted but not yet committed, and traces waiting for their quiet period.",
                [
                    prom(f"max by (instance) ({sel(semconv.M_INGEST_QUEUE)})", "queue {{instance}}", ref="A"),
                    prom(f"max by (instance) ({sel(semconv.M_PENDING)})", "pending {{instance}}", ref="B"),
                ],
            )
        )
        .with_panel(
            timeseries(
                "Assembly lag p50 / p99",
                "From a request's last span arriving to its verdict being stored.",
                [
                    prom(_quantile(0.5, _rate(sel(lag_bucket)), "instance"), "p50 {{instance}}", ref="A"),
                    prom(_quantile(0.99, _rate(sel(lag_bucket)), "instance"), "p99 {{instance}}", ref="B"),
                ],
                unit="s",
            )
        )
        .with_panel(
            timeseries(
                "Duplicate and late spans, stitched and re-assembled requests",
                "Exporter retries, spans that reopened an assembled request, requests joined from "
                "several traces, requests assembled ahead of their quiet period and dropped for a "
                "span that arrived meanwhile (many: lower assembly_lookahead_s).",
                [
                    prom(f"sum({_rate(sel(semconv.M_DUPLICATE_SPANS))})", "duplicate spans", ref="A"),
                    prom(f"sum({_rate(sel(semconv.M_LATE_SPANS))})", "late spans", ref="B"),
                    prom(f"sum({_rate(sel(semconv.M_STITCHED))})", "stitched requests", ref="C"),
                    prom(f"sum({_rate(sel(semconv.M_REDONE))})", "re-assembled requests", ref="D"),
                ],
                unit="ops",
                width=24,
            )
        )
    )


# -- topology contract ---------------------------------------------------------------------------------


def contract() -> Dashboard:
    return (
        dashboard(
            "llm-d tracing / Topology contract",
            "llm-d-tracing-contract",
            "Topology is an end-to-end contract: discovered by the platform, preserved by allocation, "
            "verified at runtime, consumed by the router. Pods per obligation and status.",
        )
        .with_row(Row("Fleet at a glance"))
        .with_panel(
            stat(
                "Pods breaking each obligation",
                "Broken is judged on evidence; `railtrace contract` and /api/v1/contract list it.",
                prom(
                    f"sum by (obligation) ({sel(R_CONTRACT, eq('status', ContractStatus.BROKEN))})",
                    "{{obligation}}",
                ),
                red_at=1,
                width=12,
                height=6,
                links=[
                    DashboardLink("railtrace: contract with evidence")
                    .url(f"{RAILTRACE}/topology")
                    .target_blank(True)
                ],
            )
        )
        .with_panel(
            matrix_table(
                "Obligation x status (pods)",
                "ok, broken, or unknown (no recent evidence, never read as ok).",
                instant_table(f"sum by (obligation, status) ({sel(semconv.M_CONTRACT)})"),
                rows="obligation",
                columns="status",
                height=6,
            )
        )
        .with_row(Row("Over time"))
        .with_panel(
            timeseries(
                "Broken pods by obligation",
                "A step up right after a rollout points at the change that broke the contract.",
                [
                    prom(
                        f"sum by (obligation) ({sel(R_CONTRACT, eq('status', ContractStatus.BROKEN))})",
                        "{{obligation}}",
                    )
                ],
            )
        )
        .with_panel(
            timeseries(
                "Pods without evidence (unknown) by obligation",
                "Verified stays unknown until a pod's KV transfers have been seen.",
                [
                    prom(
                        f"sum by (obligation) ({sel(R_CONTRACT, eq('status', ContractStatus.UNKNOWN))})",
                        "{{obligation}}",
                    )
                ],
            )
        )
    )


# File stem (dashboards/generated/<stem>.json) -> builder.
DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "llm-d-tracing-overview": overview,
    "llm-d-tracing-kv-transfer": kv_transfer,
    "llm-d-tracing-ttft": ttft,
    "llm-d-tracing-pairing": pairing,
    "llm-d-tracing-health": health,
    "llm-d-tracing-contract": contract,
}
