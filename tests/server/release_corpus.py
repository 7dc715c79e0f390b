"""What each llm-d release emits for one request, sent through the official OpenTelemetry SDK:
the releases, their span names and attributes, and the processes that export them. Used by
`test_release_corpus.py` and by the forged-join tests of tests/reliability/."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from railtrace.simulator.fleet import NAMESPACE, Fleet, Pod, build_fleet
from railtrace.simulator.scenarios import resolve

MS = 1_000_000
T0 = 1_790_100_000 * 10**9


@dataclass(frozen=True)
class Release:
    """What one router release emits (llm-d-router at the tag; reference §5 rename map)."""

    name: str
    epp_service: str
    epp_scope: str
    sidecar_root: str
    prefill: str
    decode: str
    pick: str
    prepare: str
    pick_endpoints: bool  # the scheduling subtree (pick_endpoints with endpoint ids), v0.10+
    sidecar_injects: bool  # sidecar's otelhttp transport injects into vLLM (PR #1667, v0.10.0)
    # The sidecar's own spans' scope: `llm-d-inference-scheduler` <= v0.8.0
    # (pkg/telemetry/tracing.go `instrumentationName`, seen from the v0.7.1 binary in tests/llmd/),
    # `llm-d-router/pkg/sidecar/proxy` from v0.9.0 (pkg/sidecar/proxy/constants.go `tracerScope`).
    sidecar_scope: str = "llm-d-router/pkg/sidecar/proxy"
    # The EPP's root and the director's span: `gateway.` prefix dropped on router main after
    # v0.10.0 (pkg/epp/handlers/server.go, pkg/epp/requestcontrol/director.go; cited in
    # docs/normalisation.md section 7).
    root: str = "gateway.request"
    orchestration: str = "gateway.request_orchestration"


RELEASES = [
    Release(
        "v0.8.0",
        "llm-d-inference-scheduler",
        "gateway-api-inference-extension/epp/extproc",
        "llm_d.pd_proxy.request",
        "llm_d.pd_proxy.prefill",
        "llm_d.pd_proxy.decode",
        "llm_d.epp.disagg.profile_handler.pick",
        "llm_d.epp.prerequest.disaggregation",
        False,
        False,
        "llm-d-inference-scheduler",
    ),
    Release(
        "v0.9.0",
        "llm-d-router/epp",
        "llm-d-router/pkg/epp/handlers",
        "forward_request",
        "prefill",
        "decode",
        "pick_disagg_profile",
        "prepare_disaggregation",
        False,
        False,
    ),
    *(
        Release(
            tag,
            "llm-d-router/epp",
            "llm-d-router/pkg/epp/handlers",
            "forward_request",
            "prefill",
            "decode",
            "pick_disagg_profile",
            "prepare_disaggregation",
            True,
            True,
            **renamed,
        )
        for tag, renamed in (
            ("v0.10.0", {}),
            ("HEAD", {}),
            # Router main after v0.10.0: the same hops, the EPP's roots without `gateway.`.
            ("post-v0.10.0", {"root": "request", "orchestration": "request_orchestration"}),
        )
    ),
]
RECIPES = ("full", "decode_only")
# The sidecar's server span, from otelhttp.NewHandler (pkg/sidecar/proxy/proxy_helpers.go, v0.8.0
# to HEAD): `llm_d.pd_proxy.<METHOD> <path>`, the parent of its root span.
OTELHTTP_SCOPE = "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
SIDECAR_SERVER_SPAN = "llm_d.pd_proxy.POST /v1/chat/completions"


@dataclass(frozen=True)
class Endpoints:
    http: str
    grpc: str


class Process:
    """One emitting process: its own provider, resource and exporter, sent as if forwarded
    by a collector for the pod's address. The Go components (EPP, sidecar) export OTLP/gRPC
    only (pkg/common/observability/tracing/telemetry.go); vLLM here OTLP/HTTP."""

    def __init__(
        self, to: Endpoints, resource: dict[str, Any], scope: str, sender: str | None, grpc: bool = False
    ) -> None:
        headers = {"x-forwarded-for": sender} if sender else {}
        self.provider = TracerProvider(resource=Resource.create(resource))
        exporter = (
            GrpcExporter(endpoint=to.grpc, insecure=True, headers=headers)
            if grpc
            else OTLPSpanExporter(endpoint=to.http + "/v1/traces", headers=headers)
        )
        self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer(scope)

    def span(
        self,
        name: str,
        start_ms: float,
        end_ms: float,
        attrs: dict[str, Any],
        parent: Any = None,
        kind: Any = None,
        scope: str | None = None,
    ) -> Any:
        ctx = trace.set_span_in_context(parent) if parent is not None else None
        tracer = self.provider.get_tracer(scope) if scope else self.tracer
        span = tracer.start_span(
            name,
            context=ctx,
            kind=kind or trace.SpanKind.INTERNAL,
            attributes=attrs,
            start_time=T0 + int(start_ms * MS),
        )
        span.end(end_time=T0 + int(end_ms * MS))
        return span

    def close(self) -> None:
        self.provider.shutdown()


def vllm_resource(service: str) -> dict[str, Any]:
    # vllm/tracing/otel.py init_otel_tracer (vLLM 0.16.0 to 0.34.0): the process id is a string.
    return {
        "service.name": service,
        "vllm.instrumenting_module_name": "vllm.llm_engine",
        "vllm.process_id": "4242",
    }


def llm_request(
    max_tokens: int, completion: int, ttft: float, queue: float, e2e: float, rid: str
) -> dict[str, Any]:
    return {
        "gen_ai.request.id": rid,
        "gen_ai.request.max_tokens": max_tokens,
        "gen_ai.usage.prompt_tokens": 812,
        "gen_ai.usage.completion_tokens": completion,
        "gen_ai.latency.time_to_first_token": ttft,
        "gen_ai.latency.time_in_queue": queue,
        "gen_ai.latency.time_in_model_prefill": ttft - queue,
        "gen_ai.latency.e2e": e2e,
    }


def k8s_resource(pod: Pod) -> dict[str, Any]:
    """What a collector's k8sattributes adds to a pod's process: its name, namespace and node,
    and `k8s.pod.ip` from the connection it associated the pod by."""
    return {
        "k8s.pod.name": pod.name,
        "k8s.namespace.name": NAMESPACE,
        "k8s.node.name": pod.node.name,
        "k8s.pod.ip": pod.ip,
    }


def emit(
    url: Endpoints,
    rel: Release,
    recipe: str,
    prefill: Pod,
    decode: Pod,
    *,
    collector: str | None = None,
    transport: str = "rdma",
    client: Any = None,
    root: str | None = None,
    top_endpoints: list[str] | None = None,
) -> dict[str, Any]:
    """Send one request as `rel` traces it; returns its ids.

    `collector`: every process exports through an OTel collector at this address, whose
    k8sattributes adds `k8s_resource` of the pod (collector-shaped resources); without it each
    process is forwarded for its own pod's address (emitter-shaped). `transport`: what the
    KV shim reports for the transfer. `client`: a load generator's span the EPP root is a child
    of (several requests then share its trace); `root`: another name for the EPP's root (a
    rename railtrace has not seen); `top_endpoints`: the decode pick's ranking as llm-d writes it
    (score, then id), by default the decode pod alone."""

    def shaped(resource: dict[str, Any], pod: Pod | None) -> dict[str, Any]:
        return {**resource, **k8s_resource(pod)} if collector and pod is not None else resource

    def via(pod: Pod | None) -> str | None:
        return collector or (pod.ip if pod is not None else None)

    epp_id = str(uuid.uuid4())  # Envoy's / the EPP's x-request-id
    sidecar_id = str(uuid.uuid4())  # the nixlv2 sidecar's own UUID, a second x-request-id
    public = f"chatcmpl-{epp_id}"  # vLLM keeps the first x-request-id
    engine_id = f"{public}-99ae74c8"  # vLLM's engine-internal id (PR #27987)
    ids: dict[str, Any] = {"epp_id": epp_id, "sidecar_id": sidecar_id, "public": public, "engine": engine_id}
    decode_vllm = Process(url, shaped(vllm_resource("vllm-decode"), decode), "vllm.tracing.otel", via(decode))
    processes = [decode_vllm]
    if recipe == "decode_only":
        # llm-d's guide: the decode Deployment alone is patched; nothing upstream is traced.
        root = decode_vllm.span(
            "llm_request",
            53,
            2999,
            llm_request(512, 200, 0.343, 0.322, 2.946, public),
            kind=trace.SpanKind.SERVER,
        )
        ids["traces"] = [format(root.context.trace_id, "032x")]
        for p in processes:
            p.close()
        return ids
    # The router chart adds k8s.* to the EPP only (config/charts/routerlib/templates/_deployment.yaml).
    epp = Process(
        url,
        {
            "service.name": rel.epp_service,
            "k8s.namespace.name": "llm-d",
            "k8s.pod.name": "llm-d-router-epp-7c9f8d6b5-abcde",
            "k8s.node.name": "cpu-node-1",
        },
        rel.epp_scope,
        via(None),
        grpc=True,
    )
    sidecar = Process(
        url,
        shaped({"service.name": "routing-proxy"}, decode),
        rel.sidecar_scope,
        via(decode),
        grpc=True,
    )
    prefill_vllm = Process(
        url, shaped(vllm_resource("vllm-prefill"), prefill), "vllm.tracing.otel", via(prefill)
    )
    worker = Process(
        url,
        shaped(
            {
                **vllm_resource("vllm-decode"),
                "vllm.instrumenting_module_name": "vllm.worker",
                "vllm.process_kind": "worker",
                "vllm.process_name": "Worker_0",
            },
            decode,
        ),
        "railtrace.kv_transfer",
        via(decode),
    )
    processes += [epp, sidecar, prefill_vllm, worker]
    # GIE v1.5.0's body-based router, in front of the EPP, starts its own root `gateway.request`
    # (pkg/bbr/handlers/server.go): not the EPP's, never a request of its own.
    bbr = Process(
        url,
        {"service.name": "gateway-api-inference-extension/bbr"},
        "gateway-api-inference-extension/bbr/extproc",
        via(None),
    )
    processes.append(bbr)
    bbr.span("gateway.request", -0.5, 0.0, {}, kind=trace.SpanKind.SERVER)
    rid = {"gen_ai.request.id": epp_id}
    gateway = epp.tracer.start_span(
        root or rel.root,
        context=trace.set_span_in_context(client) if client is not None else None,
        kind=trace.SpanKind.SERVER,
        start_time=T0,
    )
    director = (
        epp.provider.get_tracer("llm-d-router/pkg/epp/requestcontrol")
        if rel.epp_scope.startswith("llm-d-router/")
        else epp.tracer
    )
    orch = director.start_span(
        rel.orchestration,
        context=trace.set_span_in_context(gateway),
        kind=trace.SpanKind.SERVER,
        attributes=rid,
        start_time=T0 + int(0.1 * MS),
    )
    orch.end(end_time=T0 + int(0.4 * MS))
    epp.span(rel.pick, 0.12, 0.35, {**rid, "llm_d.epp.profile_handler.decision": "run_decode"}, orch)
    if rel.pick_endpoints:
        profile = epp.span(
            "run_scheduler_profile", 0.13, 0.2, {"llm_d.epp.scheduling.profile.name": "decode"}, orch
        )
        epp.span(
            "pick_endpoints",
            0.15,
            0.19,
            {
                **rid,
                "llm_d.epp.picker.top_endpoints": top_endpoints or [f"llm-d/{decode.name}-rank-0"],
                "llm_d.epp.picker.top_scores": [1.0] * len(top_endpoints or [0]),
            },
            profile,
        )
    epp.span(
        rel.prepare,
        0.36,
        0.39,
        {**rid, "llm_d.epp.pd.prefill_pod_address": prefill.ip, "llm_d.epp.pd.prefill_pod_port": "8000"},
        orch,
    )
    # Envoy forwards the EPP's injected traceparent to the sidecar: its spans join the EPP's trace.
    server = sidecar.span(
        SIDECAR_SERVER_SPAN,
        2,
        3000,
        {"http.request.method": "POST", "url.path": "/v1/chat/completions", "http.response.status_code": 200},
        gateway,
        trace.SpanKind.SERVER,
        scope=OTELHTTP_SCOPE,
    )
    root = sidecar.span(
        rel.sidecar_root, 2, 3000, {"llm_d.pd_proxy.connector": "nixlv2"}, server, trace.SpanKind.SERVER
    )
    common = {"llm_d.pd_proxy.request_id": sidecar_id, "llm_d.pd_proxy.connector": "nixlv2"}
    pre = sidecar.span(
        rel.prefill, 2, 52, {**common, "llm_d.pd_proxy.prefill_target": f"{prefill.ip}:8000"}, root
    )
    dec = sidecar.span(
        rel.decode,
        52,
        3000,
        {
            **common,
            "llm_d.pd_proxy.decode.target": "localhost:8200",  # always loopback (options.go)
            "llm_d.pd_proxy.true_ttft_ms": 50.0,
            "llm_d.pd_proxy.prefill_duration_ms": 49.0,
            "llm_d.pd_proxy.decode_duration_ms": 2947.0,
        },
        pre,  # nixlv2: decode is a child of prefill
    )
    gateway.end(end_time=T0 + 3001 * MS)
    if recipe == "no_engines":
        # The router's and the sidecar's tracing only (vLLM's is off): each leg's pod must come
        # from what was dispatched, the sidecar's targets and its own address.
        ids["traces"] = [format(gateway.context.trace_id, "032x")]
        for p in processes:
            p.close()
        return ids
    # A sidecar that does not inject forwards the headers it received, the EPP's traceparent
    # included (the nixlv2 connector clones the request): vLLM's spans are the EPP span's
    # children, not roots of their own (seen from the v0.7.1 binary in tests/llmd/).
    p_parent, d_parent = (pre, dec) if rel.sidecar_injects else (gateway, gateway)
    p_span = prefill_vllm.span(
        "llm_request", 3, 50, llm_request(1, 1, 0.045, 0.001, 0.047, public), p_parent, trace.SpanKind.SERVER
    )
    d_span = decode_vllm.span(
        "llm_request",
        53,
        2999,
        llm_request(512, 200, 0.343, 0.322, 2.946, public),
        d_parent,
        trace.SpanKind.SERVER,
    )
    # The KV connector runs in the worker process, which gets no trace headers: a root span
    # that carries the engine's own id.
    kv = worker.span(
        "llm_d.kv_transfer",
        60,
        300,
        {
            "llm_d.kv_transfer.request_id": engine_id,
            "llm_d.kv_transfer.transport": transport,
            "llm_d.kv_transfer.operation": "read",
        },
    )
    ids["kv_trace"] = format(kv.context.trace_id, "032x")
    ids["traces"] = sorted(
        {format(s.context.trace_id, "032x") for s in (gateway, server, root, p_span, d_span, kv)},
        key=lambda t: t != format(gateway.context.trace_id, "032x"),
    )
    for p in processes:
        p.close()
    return ids


def live_cluster(folder: Path, scenarios: tuple[str, ...] = ("topology-aware",)) -> Fleet:
    """An a3-ultra fleet (the topology-aware scenario's pods by default) written to `folder` as
    the live cluster's objects only (Nodes, Pods, ResourceSlices, ResourceClaims): no railtrace
    topology file beside them."""
    fleet = build_fleet("a3-ultra", resolve(list(scenarios)), seed=7)
    for path in fleet.write(folder):
        if path.name == "railtrace-topology.yaml":
            path.unlink()
    return fleet


def emit_p2p(
    url: Endpoints,
    decode: Pod,
    source: Pod,
    *,
    speculative: bool = False,
    vllm_service: str = "vllm-decode",
) -> dict[str, Any]:
    """One request of router HEAD with a P2P KV source and no prefill target: decode pulls the
    cached prefix from `source`; returns its ids.

    Shapes (llm-d-router, read at the commits docs/normalisation.md "P2P KV sources" cites):
    the sidecar's otelhttp server span `llm_d.pd_proxy.<METHOD> <path>` (proxy_helpers.go),
    under it the SERVER span `forward_request` with `llm_d.pd_proxy.kv_cache_source` and
    `disaggregation_used=false` (dispatch.go), whose otelhttp transport (proxy.go
    `newProxyTransport`) carries the context into the decode engine's `llm_request`
    (`decodeWithP2PSource`, connector_p2p.go). The KV shim's span on the decode worker names
    the source as its peer. `speculative`: after the response, the sidecar's detached warm-up
    (speculative_prefill.go `sendToDecoder`, no prefill target) sends a single-token request
    to the decoder through the same transport: one more `llm_request`, after decode.
    `vllm_service`: the engine's `service.name`; a name without the role leaves the legs to
    the request's shape."""
    epp_id = str(uuid.uuid4())
    public = f"chatcmpl-{epp_id}"
    engine_id = f"{public}-5c1e0a77"
    ids: dict[str, Any] = {"epp_id": epp_id, "public": public, "engine": engine_id}
    epp = Process(
        url,
        {"service.name": "llm-d-router/epp", "k8s.namespace.name": "llm-d"},
        "llm-d-router/pkg/epp/handlers",
        None,
        grpc=True,
    )
    sidecar = Process(
        url, {"service.name": "routing-proxy"}, "llm-d-router/pkg/sidecar/proxy", decode.ip, True
    )
    otelhttp = Process(
        url,
        {"service.name": "routing-proxy"},
        "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp",
        decode.ip,
        True,
    )
    engine = Process(url, vllm_resource(vllm_service), "vllm.tracing.otel", decode.ip)
    worker = Process(
        url,
        {**vllm_resource(vllm_service), "vllm.process_kind": "worker", "vllm.process_name": "Worker_0"},
        "railtrace.kv_transfer",
        decode.ip,
    )
    rid = {"gen_ai.request.id": epp_id}
    gateway = epp.tracer.start_span("gateway.request", kind=trace.SpanKind.SERVER, start_time=T0)
    orch = epp.span("gateway.request_orchestration", 0.1, 0.4, rid, gateway, trace.SpanKind.SERVER)
    profile = epp.span(
        "run_scheduler_profile", 0.13, 0.2, {"llm_d.epp.scheduling.profile.name": "decode"}, orch
    )
    epp.span(
        "pick_endpoints",
        0.15,
        0.19,
        {
            **rid,
            "llm_d.epp.picker.top_endpoints": [f"llm-d/{decode.name}-rank-0"],
            "llm_d.epp.picker.top_scores": [1.0],
        },
        profile,
    )
    inbound = otelhttp.span(
        "llm_d.pd_proxy.POST /v1/chat/completions", 2, 3000, {}, gateway, trace.SpanKind.SERVER
    )
    forward = sidecar.span(
        "forward_request",
        2,
        2999,
        {
            "llm_d.pd_proxy.connector": "nixlv2",
            "llm_d.pd_proxy.kv_connector": "nixlv2",
            "llm_d.pd_proxy.request_path": "/v1/chat/completions",
            "llm_d.pd_proxy.disaggregation_used": False,
            "llm_d.pd_proxy.reason": "no_prefill_header",
            "llm_d.pd_proxy.kv_cache_source": f"{source.ip}:8000",
        },
        inbound,
        trace.SpanKind.SERVER,
    )
    client = otelhttp.span(
        "HTTP POST",
        3,
        2998,
        {"server.address": "localhost", "server.port": 8200},
        forward,
        trace.SpanKind.CLIENT,
    )
    engine.span(
        "llm_request",
        4,
        2997,
        llm_request(512, 200, 0.343, 0.322, 2.946, public),
        client,
        trace.SpanKind.SERVER,
    )
    kv = worker.span(
        "llm_d.kv_transfer",
        10,
        300,
        {
            "llm_d.kv_transfer.request_id": engine_id,
            "llm_d.kv_transfer.transport": "rdma",
            "llm_d.kv_transfer.operation": "read",
            "llm_d.kv_transfer.bytes": 268_435_456,
            "llm_d.kv_transfer.remote.host": source.ip,
        },
    )
    gateway.end(end_time=T0 + 3001 * MS)
    if speculative:
        warm = otelhttp.span(
            "HTTP POST",
            3002,
            3060,
            {"server.address": "localhost", "server.port": 8200},
            inbound,
            trace.SpanKind.CLIENT,
        )
        span = engine.span(
            "llm_request",
            3003,
            3058,
            llm_request(1, 1, 0.05, 0.002, 0.054, f"chatcmpl-{uuid.uuid4()}"),
            warm,
            trace.SpanKind.SERVER,
        )
        ids["warmup_span"] = format(span.context.span_id, "016x")
    ids["traces"] = sorted(
        {format(s.context.trace_id, "032x") for s in (gateway, kv)},
        key=lambda t: t != format(gateway.context.trace_id, "032x"),
    )
    for p in (epp, sidecar, otelhttp, engine, worker):
        p.close()
    return ids


def emit_coordinator(
    url: Endpoints,
    prefill: Pod,
    decode: Pod,
    *,
    rid: str | None = None,
    phases: tuple[str, ...] = ("prefill", "decode"),
    start_ms: float = 0.0,
    decode_sender: str | None = None,
    kv: bool = True,
    transport: str = "rdma",
    decode_candidates: list[Pod] | None = None,
) -> dict[str, Any]:
    """One request of llm-d's coordinator at router HEAD `ebab687927f5` for an untraced client:
    each phase its own trace, sharing only `x-request-id`; returns its ids.

    What upstream sends (llm-d-router @ ebab687927f5; docs/normalisation.md §10): the
    coordinator emits no span (no file of pkg/coordinator or cmd/coordinator imports
    OpenTelemetry); it keeps the client's `x-request-id` or makes a UUID
    (pkg/coordinator/server/handlers.go l.44, l.72-77) and sends each phase back through the
    gateway with it and `EPP-Profile: prefill|decode` (steps/prefill.go l.100-102,
    steps/decode_proxy.go l.68-72, gateway/paths.go l.26-32). The EPP runs once per phase:
    its root `gateway.request` (pkg/epp/handlers/server.go l.459-460) with the profile the
    header names (`run_scheduler_profile`, pkg/epp/scheduling/scheduler.go l.153-155;
    headerprofile/header_profile_handler.go l.41) and injects its context into the headers
    Envoy forwards (pkg/epp/handlers/request.go l.127-130), so each engine's `llm_request` is
    the root's child. No sidecar: the coordinator replaces it (docs/coordinator_architecture.md
    l.419). The prefill phase asks for one token (steps/prefill.go l.181); decode pulls the KV
    cache with the `kv_transfer_params` prefill returned (l.124), so the KV shim's span on the
    decode worker names the prefill pod as its peer.

    `phases`: which phases to send now (a late phase is sent by a second call with the same
    `rid`); `start_ms`: when the first one sent starts; `decode_sender`: the decode engine's
    and its worker's sender address instead of the decode pod's (a forger's); `kv`: send the
    decode worker's KV span; `decode_candidates`: the decode pick's ranking (equal scores), by
    default the decode pod alone."""
    rid = rid or str(uuid.uuid4())
    public = f"chatcmpl-{rid}"  # vLLM keeps the first x-request-id
    ids: dict[str, Any] = {"epp_id": rid, "public": public, "traces": []}
    epp = Process(
        url,
        {"service.name": "llm-d-router/epp", "k8s.namespace.name": "llm-d"},
        "llm-d-router/pkg/epp/handlers",
        None,
        grpc=True,
    )
    director = epp.provider.get_tracer("llm-d-router/pkg/epp/requestcontrol")
    scheduler = "llm-d-router/pkg/epp/scheduling"
    processes = [epp]
    at = start_ms
    for phase in phases:
        pod = prefill if phase == "prefill" else decode
        sender = decode_sender if phase == "decode" and decode_sender else pod.ip
        engine = Process(url, vllm_resource(f"vllm-{phase}"), "vllm.tracing.otel", sender)
        processes.append(engine)
        length = 50.0 if phase == "prefill" else 3000.0
        attrs = {"gen_ai.request.id": rid}
        ranked = (decode_candidates if phase == "decode" else None) or [pod]
        root = epp.tracer.start_span(
            "gateway.request", kind=trace.SpanKind.SERVER, start_time=T0 + int(at * MS)
        )
        orch = director.start_span(
            "gateway.request_orchestration",
            context=trace.set_span_in_context(root),
            kind=trace.SpanKind.SERVER,
            attributes=attrs,
            start_time=T0 + int((at + 0.1) * MS),
        )
        profile = epp.span(
            "run_scheduler_profile",
            at + 0.13,
            at + 0.2,
            {"llm_d.epp.scheduling.profile.name": phase},
            orch,
            scope=scheduler,
        )
        epp.span(
            "pick_endpoints",
            at + 0.15,
            at + 0.19,
            {
                **attrs,
                "llm_d.epp.picker.top_endpoints": [f"llm-d/{c.name}-rank-0" for c in ranked],
                "llm_d.epp.picker.top_scores": [1.0] * len(ranked),
            },
            profile,
            scope=scheduler,
        )
        orch.end(end_time=T0 + int((at + 0.4) * MS))
        if phase == "prefill":
            body = llm_request(1, 1, 0.045, 0.001, 0.047, public)
        else:
            body = llm_request(512, 200, 0.343, 0.322, 2.946, public)
        span = engine.span("llm_request", at + 1, at + length - 1, body, root, trace.SpanKind.SERVER)
        root.end(end_time=T0 + int((at + length) * MS))
        ids[f"{phase}_trace"] = format(root.context.trace_id, "032x")
        ids[f"{phase}_span"] = format(span.context.span_id, "016x")
        ids["traces"].append(ids[f"{phase}_trace"])
        if phase == "decode" and kv:
            worker = Process(
                url,
                {
                    **vllm_resource("vllm-decode"),
                    "vllm.process_kind": "worker",
                    "vllm.process_name": "Worker_0",
                },
                "railtrace.kv_transfer",
                sender,
            )
            processes.append(worker)
            kv_span = worker.span(
                "llm_d.kv_transfer",
                at + 8,
                at + 60,
                {
                    "llm_d.kv_transfer.request_id": f"{public}-99ae74c8",  # vLLM's engine id
                    "llm_d.kv_transfer.transport": transport,
                    "llm_d.kv_transfer.operation": "read",
                    "llm_d.kv_transfer.bytes": 268_435_456,
                    "llm_d.kv_transfer.remote.host": prefill.ip,
                },
            )
            ids["kv_trace"] = format(kv_span.context.trace_id, "032x")
            ids["traces"].append(ids["kv_trace"])
        at += length + 3.0  # the coordinator reads the prefill response, then sends decode
    for p in processes:
        p.close()
    return ids
