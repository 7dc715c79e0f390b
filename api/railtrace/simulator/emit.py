"""Emission: every simulated request as the spans the real stack (plus railtrace's shims) sends.

One TracerProvider with its own Resource per simulated process (the EPP, each sidecar, each
vLLM engine), each exporting through the official OTLP exporter. Trace context travels in
header dicts between processes with the W3C propagator, exactly where the real hops inject
and extract it, so an old sidecar that does not inject produces separate traces by itself.
The router scoring and KV-transfer spans go through the railtrace shims; the KV span's
evidence is UCX log text parsed by the real parser. Timestamps are the simulated ones.
"""

from __future__ import annotations

import contextlib
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from railtrace.simulator.engine import SimRequest
from railtrace.simulator.fleet import MODEL_NAME, NAMESPACE, SIDECAR_PORT, VLLM_PORT, Fleet, Pod
from railtrace.simulator.router import DECODE_WEIGHTS, PREFILL_WEIGHTS, TOPOLOGY_SCORER, TOPOLOGY_WEIGHT
from railtrace.simulator.scenarios import SCENARIOS
from railtrace.simulator.ucxlog import endpoint_log
from railtrace_tracing import semconv as sc
from railtrace_tracing.kv_transfer import record_kv_transfer
from railtrace_tracing.pd import Leg, PDProxyRecorder
from railtrace_tracing.router_scoring import Candidate, SchedulingRecorder

GENERATIONS = ("current", "post-v0.10", "v0.10", "v0.9", "v0.8")
# The llm-d-router release each generation's names come from (docs/normalisation.md cites them):
# `post-v0.10` is router main after v0.10.0 (no tag yet; builds describe v0.10.0).
RELEASES = {
    "current": "HEAD",
    "post-v0.10": "main@8540131219eb",
    "v0.10": "v0.10.0",
    "v0.9": "v0.9.0",
    "v0.8": "v0.8.0",
}
# How the simulated processes' resources reach railtrace (docs/simulator.md):
# - `collector`: through the production overlay's tier-1 collector, whose k8sattributes processor
#   adds k8s.pod.name, k8s.namespace.name and k8s.node.name to every process (a documented step);
# - `emitted`: as the code emits them (vLLM: service.name, vllm.instrumenting_module_name,
#   vllm.process_id; the sidecar: service.name; only the EPP's chart adds k8s.*), each process's
#   pod IP reaching railtrace as its sender address (X-Forwarded-For from a trusted proxy).
RESOURCE_MODES = ("collector", "emitted")
# Which hops the deployment traces: everything, or llm-d's guide (the decode engine only).
RECIPES = ("full", "decode_only")
EPP_POD = "llm-d-router-epp-7c9d5b8f4-x2k9q"
EPP_NODE = "gke-railtrace-cpu-pool-3f1e9a2c-q7m2"
_W3C = TraceContextTextMapPropagator()


@dataclass(frozen=True, slots=True)
class Names:
    """What one llm-d generation calls its spans and services, and which hops propagate."""

    epp_service: str
    sidecar_service: str
    sidecar_root: str
    prefill: str
    decode: str
    disagg_pick: str
    decision_attr: str
    prepare: str
    prefix_span: str | None  # old single prefix-scorer span; None when the scoring subtree exists
    sidecar_injects: bool
    root: str = sc.SPAN_GATEWAY_REQUEST  # the EPP's server span
    orchestration: str = sc.SPAN_GATEWAY_ORCHESTRATION  # the director's span
    scoring: str = sc.SPAN_EPP_SCORING
    scorer_prefix: str = sc.SPAN_EPP_SCORER_PREFIX


_CURRENT = Names(
    epp_service="llm-d-router/epp",
    sidecar_service="llm-d-disagg-sidecar",
    sidecar_root=sc.SPAN_PD_FORWARD,
    prefill=sc.SPAN_PD_PREFILL,
    decode=sc.SPAN_PD_DECODE,
    disagg_pick=sc.SPAN_PICK_DISAGG_PROFILE,
    decision_attr=sc.EPP_DECISION,
    prepare=sc.SPAN_PREPARE_DISAGGREGATION,
    prefix_span=None,
    sidecar_injects=True,
)
# Each older generation as its differences from the next newer one (rename map in
# llm-d-telemetry.md §5 and propagation gaps in §6).
_V010 = replace(_CURRENT, sidecar_service="pd-sidecar")
_V09 = replace(_V010, prefix_span=sc.SPAN_SCORE_PREFIX_CACHE, sidecar_injects=False)
NAMES: dict[str, Names] = {
    "current": _CURRENT,
    "post-v0.10": replace(
        _CURRENT,
        root=sc.SPAN_POST_V010_REQUEST,
        orchestration=sc.SPAN_POST_V010_ORCHESTRATION,
        scoring=sc.SPAN_POST_V010_SCORING,
        scorer_prefix=sc.SPAN_POST_V010_SCORER_PREFIX,
    ),
    "v0.10": _V010,
    "v0.9": _V09,
    "v0.8": replace(
        _V09,
        epp_service="llm-d-inference-scheduler",
        sidecar_root=sc.SPAN_V08_PD_REQUEST,
        prefill=sc.SPAN_V08_PD_PREFILL,
        decode=sc.SPAN_V08_PD_DECODE,
        disagg_pick=sc.SPAN_V08_DISAGG_PICK,
        decision_attr=sc.EPP_DECISION_LEGACY,
        prepare=sc.SPAN_V08_PREREQUEST_DISAGG,
        prefix_span=sc.SPAN_V08_PREFIX_SCORER,
    ),
}


class SeededIds(IdGenerator):
    """Trace and span ids from a seeded stream, so a seed reproduces the same trace ids."""

    def __init__(self, seed: str) -> None:
        self._rng = random.Random(seed)

    def generate_span_id(self) -> int:
        return self._rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._rng.getrandbits(128) or 1


ExporterFactory = Callable[..., SpanExporter]  # called with `sender=` only in `emitted` mode


def _forwarded(sender: str | None) -> dict[str, str] | None:
    return {"x-forwarded-for": sender} if sender else None


def otlp_http_exporter(http_url: str) -> ExporterFactory:
    """Exporters to railtrace over OTLP/HTTP; `sender` stands for the pod's own address, sent as
    a forwarding proxy would (railtrace trusts it from `trusted_proxies` only)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    def make(sender: str | None = None) -> SpanExporter:
        url = f"{http_url.rstrip('/')}/v1/traces"
        return OTLPSpanExporter(endpoint=url, timeout=30, headers=_forwarded(sender))

    return make


def otlp_grpc_exporter(endpoint: str) -> ExporterFactory:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    def make(sender: str | None = None) -> SpanExporter:
        return OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=30, headers=_forwarded(sender))

    return make


class Processes:
    """The simulated processes' tracer providers, created on first use."""

    def __init__(self, exporter: ExporterFactory, seed: int) -> None:
        self.exporter = exporter
        self.seed = seed
        self.providers: dict[str, TracerProvider] = {}

    def provider(
        self, key: str, resource: dict[str, Any], sender: str | None = None, traced: bool = True
    ) -> TracerProvider:
        """The process's provider. `sender`: the pod IP its exports carry as their sender;
        `traced=False`: a process the deployment does not trace (its spans go nowhere)."""
        tp = self.providers.get(key)
        if tp is None:
            tp = TracerProvider(
                resource=Resource.create(resource), id_generator=SeededIds(f"{self.seed}-{key}")
            )
            self.providers[key] = tp
            if not traced:
                return tp
            tp.add_span_processor(
                BatchSpanProcessor(
                    self.exporter(sender=sender) if sender else self.exporter(),
                    max_queue_size=65536,
                    max_export_batch_size=1024,
                    schedule_delay_millis=250,
                )
            )
        return tp

    def flush(self) -> None:
        for tp in self.providers.values():
            tp.force_flush(60_000)

    def shutdown(self) -> None:
        for tp in self.providers.values():
            tp.shutdown()


def _res(service: str, pod: str, node: str, **extra: Any) -> dict[str, Any]:
    """A resource with what the tier-1 collector's k8sattributes adds (or the router chart's
    OTEL_RESOURCE_ATTRIBUTES, for the EPP)."""
    return {
        sc.RES_SERVICE_NAME: service,
        sc.RES_POD: pod,
        sc.RES_NODE: node,
        sc.RES_NAMESPACE: NAMESPACE,
        **extra,
    }


# vLLM's tracer (`trace.get_tracer(__name__)` in vllm/tracing/otel.py l.195, vLLM 0.16.0 to 0.34.0).
VLLM_TRACER = "vllm.tracing.otel"


def vllm_resource(service: str, module: str = "vllm.llm_engine", **extra: Any) -> dict[str, Any]:
    """vLLM's own resource: `OTEL_SERVICE_NAME` (llm-d's guide), the tracer module and the process
    id as a string (`init_otel_tracer`, vllm/tracing/otel.py l.76-78, the same in vLLM 0.16.0 to
    0.34.0; docs/normalisation.md section 7)."""
    return {
        sc.RES_SERVICE_NAME: service,
        sc.RES_VLLM_MODULE: module,
        "vllm.process_id": "1",
        **extra,
    }


# The request parameters the simulated clients send: chat defaults but for max_tokens.
# vLLM writes top_p, temperature and n only when truthy, so temperature 0 would be absent.
CLIENT_TOP_P = 1.0
CLIENT_TEMPERATURE = 0.7
CLIENT_N = 1


def vllm_llm_request(
    provider: trace.TracerProvider,
    *,
    external_req_id: str,
    arrival_ns: int,
    scheduled_ns: int,
    first_token_ns: int,
    last_token_ns: int,
    prompt_tokens: int,
    completion_tokens: int,
    max_tokens: int | None,
    parent: otel_context.Context,
) -> None:
    """One `llm_request` exactly as vLLM writes it for a finished request.

    `OutputProcessor.do_tracing` (vllm/v1/engine/output_processor.py l.731-786, vLLM 0.21.0;
    the same body in 0.19.1 and 0.34.0, docs/normalisation.md section 7) through
    `instrument_manual` on the tracer `vllm.tracing.otel`: kind SERVER, start at arrival, end
    when the output processor sees the last token; the nine latency/usage/id attributes, then
    top_p, max_tokens, temperature and n only when truthy. No model, no role, no status: a
    request with no queueing (queued = arrival) here.
    """
    s = 1e-9
    attributes: dict[str, Any] = {
        sc.VLLM_TTFT: (first_token_ns - arrival_ns) * s,
        sc.VLLM_E2E: (last_token_ns - arrival_ns) * s,
        sc.VLLM_QUEUE: (scheduled_ns - arrival_ns) * s,
        sc.VLLM_PROMPT_TOKENS: prompt_tokens,
        sc.VLLM_COMPLETION_TOKENS: completion_tokens,
        sc.VLLM_PREFILL: (first_token_ns - scheduled_ns) * s,
        sc.VLLM_DECODE: (last_token_ns - first_token_ns) * s,
        sc.VLLM_INFERENCE: (last_token_ns - scheduled_ns) * s,
        sc.GEN_AI_REQUEST_ID: external_req_id,
    }
    for key, value in (
        (sc.GEN_AI_TOP_P, CLIENT_TOP_P),
        (sc.GEN_AI_MAX_TOKENS, max_tokens),
        (sc.GEN_AI_TEMPERATURE, CLIENT_TEMPERATURE),
        (sc.GEN_AI_N, CLIENT_N),
    ):
        if value:
            attributes[key] = value
    span = provider.get_tracer(VLLM_TRACER).start_span(
        sc.SPAN_VLLM_REQUEST,
        context=parent,
        kind=SpanKind.SERVER,
        attributes=attributes,
        start_time=arrival_ns,
    )
    span.end(end_time=last_token_ns)


def endpoint_id(pod: Pod, rank: int = 0) -> str:
    """The EPP's id of a pod's data-parallel rank (llm-d-router pkg/epp/datastore/datastore.go,
    v0.9.0 and later; gateway-api-inference-extension v1.5.0 the same)."""
    return f"{NAMESPACE}/{pod.name}-rank-{rank}"


def epp_request_id(r: SimRequest) -> str:
    """The x-request-id Envoy/the EPP gives the request (server.go: uuid.NewString when absent):
    what the EPP's spans and vLLM's `gen_ai.request.id` carry. The nixlv2 sidecar mints its own
    UUID (`r.request_id`) and adds it as a second x-request-id, which vLLM ignores."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"x-request-id/{r.request_id}"))


def engine_request_id(r: SimRequest) -> str:
    """vLLM's engine-internal id of the chat request: the public id plus `-<8 hex>`
    (vllm/v1/engine/input_processor.py `assign_request_id`, vLLM PR #27987)."""
    suffix = uuid.uuid5(uuid.NAMESPACE_URL, f"engine/{r.request_id}").hex[:8]
    return f"chatcmpl-{epp_request_id(r)}-{suffix}"


class Emitter:
    """Turns simulated requests into spans of the right processes."""

    def __init__(
        self,
        fleet: Fleet,
        processes: Processes,
        generation: str,
        base_ns: int,
        *,
        resources: str = "collector",
        recipe: str = "full",
    ) -> None:
        if generation not in NAMES:
            raise ValueError(f"unknown generation {generation!r}; choose one of {', '.join(GENERATIONS)}")
        if resources not in RESOURCE_MODES:
            raise ValueError(f"unknown resources {resources!r}; choose one of {', '.join(RESOURCE_MODES)}")
        if recipe not in RECIPES:
            raise ValueError(f"unknown recipe {recipe!r}; choose one of {', '.join(RECIPES)}")
        self.fleet = fleet
        self.procs = processes
        self.names = NAMES[generation]
        if recipe == "decode_only":
            # Untraced EPP and sidecar have no propagator set up: nothing reaches the engines.
            self.names = replace(self.names, sidecar_injects=False)
        self.generation = generation
        self.base_ns = base_ns
        self.resources = resources
        self.recipe = recipe
        self._ucx_logs: dict[tuple[str, str], str] = {}

    def ns(self, t: float) -> int:
        return self.base_ns + round(t * 1e9)

    # -- processes ---------------------------------------------------------------------
    @property
    def _full(self) -> bool:
        return self.recipe == "full"

    def _go_version(self, image: str) -> dict[str, Any]:
        """`service.version` as the router's Go tracer sets it (llm-d-router v0.9.0 and later,
        pkg/common/observability/tracing/telemetry.go `newResource`: the router package's
        `version.BuildRef`). The EPP image sets it to the release tag (Dockerfile.epp ldflags);
        the sidecar image sets `pkg/sidecar/version.BuildRef` instead, so the sidecar sends it
        empty. v0.8.0's tracer (pkg/telemetry/tracing.go) sets service.name alone."""
        if self.generation == "v0.8":
            return {}
        release = RELEASES[self.generation]
        # HEAD and main builds describe the newest tag
        tag = release if release.startswith("v") else "v0.10.0"
        return {sc.RES_SERVICE_VERSION: tag if image == "epp" else ""}

    def _epp(self) -> trace.TracerProvider:
        # The router chart adds k8s.* to the EPP (config/charts/routerlib/templates/_deployment.yaml).
        resource = _res(self.names.epp_service, EPP_POD, EPP_NODE, **self._go_version("epp"))
        return self.procs.provider("epp", resource, traced=self._full)

    def _process(self, key: str, pod: Pod, resource: dict[str, Any], traced: bool) -> trace.TracerProvider:
        if self.resources == "collector":
            return self.procs.provider(
                key,
                {**resource, **_res(resource[sc.RES_SERVICE_NAME], pod.name, pod.node.name)},
                traced=traced,
            )
        return self.procs.provider(key, resource, sender=pod.ip, traced=traced)

    def _sidecar(self, pod: Pod) -> trace.TracerProvider:
        service = self.names.sidecar_service if pod.sidecar_version == "current" else "pd-sidecar"
        resource = {sc.RES_SERVICE_NAME: service, **self._go_version("sidecar")}
        return self._process(f"sidecar/{pod.name}", pod, resource, self._full)

    def _vllm(self, pod: Pod) -> trace.TracerProvider:
        traced = self._full or pod.role == "decode"  # llm-d's guide patches decode Deployments only
        if pod.role == "decode" and SCENARIOS[pod.scenario].decode_spans_lost:
            traced = False  # its exporter loses them (scenario broken-trace)
        return self._process(f"vllm/{pod.name}", pod, vllm_resource(f"vllm-{pod.role}"), traced)

    def _vllm_worker(self, pod: Pod) -> trace.TracerProvider:
        """The engine's worker process, where the KV connector (and railtrace's KV shim) runs; its
        resource as vLLM's worker tracer sets it (vllm/v1/executor/multiproc_executor.py)."""
        resource = vllm_resource(
            f"vllm-{pod.role}",
            "vllm.worker",
            **{"vllm.process_kind": "worker", "vllm.process_name": "Worker_0"},
        )
        return self._process(f"vllm-worker/{pod.name}", pod, resource, True)

    # -- one request -------------------------------------------------------------------
    def emit(self, r: SimRequest) -> None:
        epp = self._epp().get_tracer("llm-d-router/pkg/epp/handlers")
        failed_status = Status(StatusCode.ERROR, "upstream request timeout")
        gw = epp.start_span(
            self.names.root,
            kind=SpanKind.SERVER,
            start_time=self.ns(r.arrival),
            attributes={
                sc.GEN_AI_REQUEST_MODEL: MODEL_NAME,
                sc.HTTP_REQUEST_METHOD: "POST",
                sc.URL_PATH: "/v1/chat/completions",
            },
        )
        gw_ctx = trace.set_span_in_context(gw)
        self._schedule(r, gw_ctx)
        headers: dict[str, str] = {}
        _W3C.inject(headers, context=gw_ctx)  # the EPP's header mutation towards the sidecar
        self._sidecar_spans(r, headers)
        gw.set_attribute(sc.HTTP_RESPONSE_STATUS, 504 if r.failed else 200)
        if r.failed:
            gw.set_status(failed_status)
            gw.set_attribute(sc.ERROR_TYPE, "timeout")
        gw.end(end_time=self.ns(r.end + 0.0002))

    def _schedule(self, r: SimRequest, parent: otel_context.Context) -> None:
        n = self.names
        tracer = self._epp().get_tracer("llm-d-router/pkg/epp/requestcontrol")
        t0, t1 = r.arrival + 0.00005, r.sched_end - 0.00005
        orch = tracer.start_span(
            n.orchestration,
            context=parent,
            kind=SpanKind.SERVER,
            start_time=self.ns(t0),
            attributes={sc.TARGET_MODEL: MODEL_NAME},
        )
        octx = trace.set_span_in_context(orch)
        step = (t1 - t0) / 8
        rec = SchedulingRecorder(self._epp(), scoring_span=n.scoring, scorer_prefix=n.scorer_prefix)
        req_id = epp_request_id(r)  # the x-request-id the EPP reads (and sets when absent)

        def decision(i: int, value: str) -> None:
            s = tracer.start_span(
                n.disagg_pick,
                context=octx,
                start_time=self.ns(t0 + i * step),
                attributes={
                    n.decision_attr: value,
                    sc.GEN_AI_REQUEST_MODEL: MODEL_NAME,
                    sc.GEN_AI_REQUEST_ID: req_id,
                },
            )
            s.end(end_time=self.ns(t0 + (i + 0.5) * step))

        # Decode profile first, then prefill, as llm-d's disaggregated profile handler does.
        decision(0, "run_decode")
        self._profile(rec, r, "decode", octx, t0 + 1 * step, t0 + 3 * step, req_id)
        decision(3, "run_prefill")
        self._profile(rec, r, "prefill", octx, t0 + 4 * step, t0 + 6 * step, req_id)
        decision(6, "complete_prefill-decode")
        prep = tracer.start_span(
            n.prepare,
            context=octx,
            start_time=self.ns(t0 + 7 * step),
            attributes={
                sc.EPP_PD_DISAGG_USED: True,
                sc.EPP_PD_PREFILL_ADDRESS: r.prefill.ip,
                sc.EPP_PD_PREFILL_PORT: str(VLLM_PORT),
                sc.GEN_AI_REQUEST_ID: req_id,
            },
        )
        prep.end(end_time=self.ns(t1))
        orch.end(end_time=self.ns(t1))

    def _profile(
        self,
        rec: SchedulingRecorder,
        r: SimRequest,
        profile: str,
        parent: otel_context.Context,
        start: float,
        end: float,
        req_id: str | None,
    ) -> None:
        pick = r.decode_pick if profile == "decode" else r.prefill_pick
        # The EPP names endpoints `<namespace>/<pod>-rank-<i>` (pkg/epp/datastore/datastore.go).
        cands = [
            Candidate(
                endpoint=endpoint_id(c.pod),
                score=c.total,
                scorer_scores=dict(c.scorers),
                topology=c.pod.topology_key,
                pod=c.pod.name,
            )
            for c in pick.candidates
        ]
        weights = dict(PREFILL_WEIGHTS if profile == "prefill" else DECODE_WEIGHTS)
        if profile == "decode" and any(TOPOLOGY_SCORER in c.scorers for c in pick.candidates):
            weights[TOPOLOGY_SCORER] = TOPOLOGY_WEIGHT
        old_prefix = self.names.prefix_span
        rec.record(
            profile,
            cands,
            endpoint_id(pick.chosen),
            scorers=None if old_prefix else weights,
            model=MODEL_NAME,
            request_id=req_id,
            parent=parent,
            start_time_ns=self.ns(start),
            end_time_ns=self.ns(end),
        )
        if old_prefix and profile == "prefill":
            tracer = self._epp().get_tracer("llm-d-router/pkg/epp/framework/plugins/scheduling")
            vals = [c.scorers.get("prefix-cache-scorer", 0.0) for c in pick.candidates]
            s = tracer.start_span(
                old_prefix,
                context=parent,
                start_time=self.ns(start),
                attributes={
                    sc.EPP_SCORER_CANDIDATES: len(vals),
                    sc.EPP_SCORER_SCORE_MAX: max(vals),
                    sc.EPP_SCORER_SCORE_AVG: sum(vals) / len(vals),
                },
            )
            s.end(end_time=self.ns(start + (end - start) / 4))

    def _sidecar_spans(self, r: SimRequest, inbound: dict[str, str]) -> None:
        if self.names.sidecar_root == sc.SPAN_PD_FORWARD:
            self._sidecar_via_shim(r, inbound)
        else:
            self._legacy_sidecar(r, inbound)

    def _sidecar_via_shim(self, r: SimRequest, inbound: dict[str, str]) -> None:
        """Sidecar spans through the P/D shim (its names are the sidecar's since v0.9). A sidecar
        that does not propagate context simply sends no `traceparent` to the engines."""
        dc, pf = r.decode, r.prefill
        injects = self.names.sidecar_injects and dc.sidecar_version == "current"
        rec = PDProxyRecorder(self._sidecar(dc), connector="nixlv2")

        def outbound(leg: Leg) -> dict[str, str]:
            headers = dict(leg.headers())
            if not injects:
                headers = {k: v for k, v in headers.items() if k not in ("traceparent", "tracestate")}
            return headers

        with (
            contextlib.suppress(TimeoutError),
            rec.request(
                "POST",
                "/v1/chat/completions",
                headers=inbound,
                request_id=r.request_id,
                start_time_ns=self.ns(r.sched_end),
                end_time_ns=self.ns(r.end + 0.00016),
            ) as req,
        ):
            with req.prefill(
                pf.endpoint,
                start_time_ns=self.ns(r.prefill_arrive - 0.0001),
                end_time_ns=self.ns(r.prefill_end),
            ) as leg:
                self._vllm_prefill(r, outbound(leg))
                leg.status_code = 200
            with req.decode(
                dc.endpoint,
                streaming=True,
                start_time_ns=self.ns(r.decode_arrive - 0.0001),
                end_time_ns=self.ns(r.end + 0.0001),
            ) as dleg:
                self._vllm_decode(r, outbound(dleg))
                if r.failed:
                    raise TimeoutError("decode leg timed out waiting for the KV cache")

    def _legacy_sidecar(self, r: SimRequest, inbound: dict[str, str]) -> None:
        """Sidecar spans of llm-d <= v0.8 (`llm_d.pd_proxy.request` …), which no shim emits."""
        n = self.names
        dc, pf = r.decode, r.prefill
        tracer = self._sidecar(dc).get_tracer("llm-d-router/pkg/sidecar/proxy")
        injects = n.sidecar_injects and dc.sidecar_version == "current"
        ctx = _W3C.extract(inbound)
        t_in = r.sched_end
        server = tracer.start_span(
            f"{sc.SPAN_PD_SERVER_PREFIX}POST /v1/chat/completions",
            context=ctx,
            kind=SpanKind.SERVER,
            start_time=self.ns(t_in),
            attributes={
                sc.HTTP_REQUEST_METHOD: "POST",
                sc.URL_PATH: "/v1/chat/completions",
                sc.SERVER_PORT: SIDECAR_PORT,
            },
        )
        fwd = tracer.start_span(
            n.sidecar_root,
            context=trace.set_span_in_context(server),
            kind=SpanKind.SERVER,
            start_time=self.ns(t_in + 0.00002),
            attributes={
                sc.PD_CONNECTOR: "nixlv2",
                sc.PD_KV_CONNECTOR: "nixlv2",
                sc.PD_DISAGG_USED: True,
                sc.PD_PREFILL_TARGET: pf.endpoint,
                sc.PD_REQUEST_PATH: "/v1/chat/completions",
            },
        )
        common = {sc.PD_REQUEST_ID: r.request_id, sc.PD_CONNECTOR: "nixlv2"}
        pre = tracer.start_span(
            n.prefill,
            context=trace.set_span_in_context(fwd),
            start_time=self.ns(t_in + 0.00004),
            attributes={**common, sc.PD_PREFILL_TARGET: pf.endpoint},
        )
        pre_ctx = trace.set_span_in_context(pre)
        # Prefill leg: HTTP POST to the prefill engine.
        http_p = tracer.start_span(
            sc.SPAN_HTTP_CLIENT_POST,
            context=pre_ctx,
            kind=SpanKind.CLIENT,
            start_time=self.ns(r.prefill_arrive),
            attributes={sc.SERVER_ADDRESS: pf.ip, sc.SERVER_PORT: VLLM_PORT, sc.HTTP_REQUEST_METHOD: "POST"},
        )
        hp: dict[str, str] = {"x-request-id": r.request_id}
        if injects:
            _W3C.inject(hp, context=trace.set_span_in_context(http_p))
        self._vllm_prefill(r, hp)
        http_p.set_attribute(sc.HTTP_RESPONSE_STATUS, 200)
        http_p.end(end_time=self.ns(r.prefill_end + 0.0001))
        prefill_ms = float(round((r.prefill_end - r.prefill_arrive) * 1000))
        pre.set_attributes({sc.PD_PREFILL_STATUS: 200, sc.PD_PREFILL_LEG_DURATION_MS: prefill_ms})

        # Decode leg, a child of prefill in the nixlv2 serial path.
        dec = tracer.start_span(
            n.decode,
            context=pre_ctx,
            start_time=self.ns(r.decode_arrive - 0.0001),
            attributes={**common, sc.PD_DECODE_TARGET: dc.endpoint, sc.PD_DECODE_STREAMING: True},
        )
        http_d = tracer.start_span(
            sc.SPAN_HTTP_CLIENT_POST,
            context=trace.set_span_in_context(dec),
            kind=SpanKind.CLIENT,
            start_time=self.ns(r.decode_arrive),
            attributes={sc.SERVER_ADDRESS: dc.ip, sc.SERVER_PORT: VLLM_PORT, sc.HTTP_REQUEST_METHOD: "POST"},
        )
        hd: dict[str, str] = {"x-request-id": r.request_id}
        if injects:
            _W3C.inject(hd, context=trace.set_span_in_context(http_d))
        self._vllm_decode(r, hd)
        http_d.set_attribute(sc.HTTP_RESPONSE_STATUS, 504 if r.failed else 200)
        http_d.end(end_time=self.ns(r.end + 0.00005))
        total_ms = float(round((r.end - t_in) * 1000))
        decode_ms = float(round((r.end - r.decode_arrive) * 1000))
        dec.set_attributes(
            {
                sc.PD_DECODE_LEG_DURATION_MS: decode_ms,
                sc.PD_TOTAL_DURATION_MS: total_ms,
                sc.PD_TRUE_TTFT_MS: float(round((r.decode_arrive - t_in) * 1000)),
                sc.PD_PREFILL_DURATION_MS: prefill_ms,
                sc.PD_DECODE_DURATION_MS: decode_ms,
                sc.PD_COORDINATOR_OVERHEAD_MS: float(round(max(0.0, total_ms - prefill_ms - decode_ms))),
            }
        )
        for span in (dec, pre, fwd, server):
            if r.failed:
                span.set_status(Status(StatusCode.ERROR, "decode leg timed out"))
        dec.end(end_time=self.ns(r.end + 0.0001))
        pre.end(end_time=self.ns(r.end + 0.00012))
        fwd.end(end_time=self.ns(r.end + 0.00014))
        server.end(end_time=self.ns(r.end + 0.00016))

    def _vllm_prefill(self, r: SimRequest, headers: dict[str, str]) -> None:
        """The prefill engine's `llm_request`: the sidecar asks for one token (max_tokens=1)."""
        vllm_llm_request(
            self._vllm(r.prefill),
            external_req_id=f"chatcmpl-{epp_request_id(r)}",  # vLLM keeps the first x-request-id
            arrival_ns=self.ns(r.prefill_arrive),
            scheduled_ns=self.ns(r.prefill_start),
            first_token_ns=self.ns(r.prefill_end),
            last_token_ns=self.ns(r.prefill_end),
            prompt_tokens=r.prompt_tokens,
            completion_tokens=1,
            max_tokens=1,
            parent=_W3C.extract(headers) if "traceparent" in headers else otel_context.Context(),
        )

    def _vllm_decode(self, r: SimRequest, headers: dict[str, str]) -> None:
        """The decode engine's `llm_request` and the KV pull its worker ran.

        A request the sidecar gave up on is aborted in vLLM (the client went away), and
        vLLM writes no `llm_request` for an aborted request: `abort_requests` never reaches
        `do_tracing` (vllm/v1/engine/output_processor.py l.471-530, vLLM 0.21.0)."""
        dc = r.decode
        incoming = _W3C.extract(headers) if "traceparent" in headers else None
        if r.first_token is not None:
            vllm_llm_request(
                self._vllm(dc),
                external_req_id=f"chatcmpl-{epp_request_id(r)}",
                arrival_ns=self.ns(r.decode_arrive),
                scheduled_ns=self.ns(r.decode_start),
                first_token_ns=self.ns(r.first_token),
                last_token_ns=self.ns(r.end),
                prompt_tokens=r.prompt_tokens,
                completion_tokens=r.output_tokens,
                max_tokens=None,  # the simulated clients leave max_tokens unset
                parent=incoming if incoming is not None else otel_context.Context(),
            )
        if r.kv_ran:
            # The KV connector runs in the worker process, which vLLM gives no trace headers:
            # the transfer is a root span there, joined to the request by vLLM's engine id.
            self._kv_span(r, self._vllm_worker(dc), otel_context.Context())

    def _kv_span(self, r: SimRequest, vllm: trace.TracerProvider, parent: otel_context.Context) -> None:
        dc, pf = r.decode, r.prefill
        agent = dc.engine_id
        with record_kv_transfer(
            tracer_provider=vllm,
            ucx_log_text=self._ucx_log(r, agent),
            ucx_context=agent,
            operation="read",
            request_id=engine_request_id(r),
            bytes=r.kv_bytes,
            descriptors=-(-r.prompt_tokens // 16),
            local_gpu=dc.gpu.uuid,
            remote_host=pf.ip,
            remote_engine_id=pf.engine_id,
            parent=parent,
            start_time_ns=self.ns(r.kv_start),
            end_time_ns=self.ns(r.kv_end),
        ) as kv:
            if r.failed:
                kv.fail("timeout", "KV transfer did not complete before the request timed out")

    def _ucx_log(self, r: SimRequest, agent: str) -> str:
        """The decode engine's UCX log for its endpoint to this prefill engine (one per pair)."""
        key = (r.decode.name, r.prefill.name)
        text = self._ucx_logs.get(key)
        if text is None:
            text = endpoint_log(
                agent=agent,
                host=r.decode.name,
                pid=1000 + len(self._ucx_logs) % 97,
                ts=self.ns(r.kv_start) / 1e9,
                devices=list(r.devices),
                split=list(r.split),
                transport=r.transport,
                operation="read",
                net_devices=",".join(f"{nic.rdma_device}:1" for nic in r.decode.nics),
            )
            self._ucx_logs[key] = text
        return text
