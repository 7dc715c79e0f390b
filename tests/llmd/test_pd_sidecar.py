"""llm-d's real P/D routing sidecar between a client and two vLLM-shaped engines, into `railtrace serve`.

The sidecar is the binary of llm-d's router release v0.7.1 (module
github.com/llm-d/llm-d-inference-scheduler, cmd/pd-sidecar), built by scripts/build-llmd from the Go
module proxy: the newest release of the router the proxy serves (docs/shims.md, "llm-d's own
binaries"). Its tracing is always on in that release (pkg/telemetry/tracing.go `InitTracing`:
OTLP/gRPC to `OTEL_EXPORTER_OTLP_ENDPOINT`, `ParentBased(TraceIDRatioBased(OTEL_TRACES_SAMPLER_ARG))`,
a batch processor). It runs the nixlv2 connector; the prefill target comes in the
`x-prefiller-host-port` header (pkg/common/common.go), the decode engine is `localhost:<--vllm-port>`.

The engines (tests/llmd/vllm_engine.py) answer as vLLM does and emit vLLM 0.34.0's `llm_request`.
Everything the test asserts about the sidecar's spans is what the binary sent: names, kinds, scope,
service, parent links and the ids it put in the engines' `x-request-id` headers.

Two clients, as in a deployment:
- `untraced`: no trace context, no request id (nothing in front of the sidecar traces). The sidecar
  starts the trace; it does not inject its context into the engines' requests (that came in v0.10.0,
  PR #1667), so each `llm_request` is a root of its own, and railtrace must join the three traces by
  the sidecar's UUID, which the engines saw as their only `x-request-id` (`chatcmpl-<uuid>`).
- `traced`: a client traced with the official OpenTelemetry SDK, sending its `traceparent` and an
  `x-request-id` (as Envoy and the EPP would). The sidecar's spans continue the client's trace, and
  the engines receive the client's `traceparent` unchanged (the sidecar clones the request with its
  headers), so both `llm_request` spans are children of the client's span, siblings of the
  sidecar's. The sidecar *adds* its UUID as a second `x-request-id`; vLLM keeps the first.

Both on SQLite and PostgreSQL (`db_url`).
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tests.llmd.processes import Proc, free_port, go_available, llmd_binary, railtrace_serve
from tests.service_helpers import wait_for

pytestmark = pytest.mark.skipif(
    not go_available(), reason="Go is unavailable: scripts/build-llmd cannot build llm-d's sidecar"
)

SIDECAR_RELEASE = "v0.7.1"
# What the v0.7.1 binary emits for one nixlv2 request (pkg/sidecar/proxy/proxy_helpers.go,
# chat_completions.go, connector_nixlv2.go; pkg/telemetry/tracing.go): name -> (kind, scope).
OTELHTTP_SCOPE = "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
SIDECAR_SPANS = {
    "llm_d.pd_proxy.POST /v1/chat/completions": (trace.SpanKind.SERVER, OTELHTTP_SCOPE),
    "llm_d.pd_proxy.request": (trace.SpanKind.SERVER, "llm-d-inference-scheduler"),
    "llm_d.pd_proxy.prefill": (trace.SpanKind.INTERNAL, "llm-d-inference-scheduler"),
    "llm_d.pd_proxy.decode": (trace.SpanKind.INTERNAL, "llm-d-inference-scheduler"),
}
# The binary's default service name, for the sidecar as for the EPP of that release.
SIDECAR_SERVICE = "llm-d-inference-scheduler"
# Which canonical name and role railtrace gives each (docs/normalisation.md).
CANONICAL = {
    "llm_d.pd_proxy.POST /v1/chat/completions": ("llm_d.pd_proxy.POST /v1/chat/completions", "proxy"),
    "llm_d.pd_proxy.request": ("forward_request", "proxy"),
    "llm_d.pd_proxy.prefill": ("prefill", "prefill"),
    "llm_d.pd_proxy.decode": ("decode", "decode"),
}
MAX_TOKENS = 8
FAST_BATCHES = {"OTEL_BSP_SCHEDULE_DELAY": "100"}  # Go's and Python's SDKs read it: spans leave in 0.1 s


def _spans_of(base: str, trace_id: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{base}/api/v1/traces/{trace_id}", timeout=30)
    assert r.status_code == 200, r.text
    return list(r.json()["spans"])


def _engine_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _start_sidecar(binary: Path, log_dir: Path, otlp: str, decode_port: int) -> tuple[Proc, int]:
    """The sidecar in front of the decode engine on `decode_port`, tracing to `otlp`, every request
    sampled. The endpoint is a URL: InitTracing strips the scheme, and the OTLP exporter, which
    reads the variable too, logs a parse error for a bare host:port. v0.7.1 listens on every
    interface (proxy_helpers.go `net.Listen("tcp", ":"+port)`, no flag); the port is a free one
    and the process lives only for its test."""
    port = free_port()
    proc = Proc(
        "pd-sidecar",
        [
            str(binary),
            "--port",
            str(port),
            "--vllm-port",
            str(decode_port),
            "--kv-connector",
            "nixlv2",
            "--secure-proxy=false",
        ],
        log_dir,
        {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{otlp}", "OTEL_TRACES_SAMPLER_ARG": "1", **FAST_BATCHES},
    )
    proc.wait_port(port)
    return proc, port


@pytest.mark.parametrize("client", ["untraced", "traced"])
def test_real_sidecar_into_railtrace(db_url: str, tmp_path: Path, client: str) -> None:
    sidecar_bin = llmd_binary("pd-sidecar")
    serve, base, grpc_port = railtrace_serve(db_url, tmp_path)
    procs = [serve]
    otlp = f"127.0.0.1:{grpc_port}"
    try:
        ports = {"prefill": free_port(), "decode": free_port()}
        for role, port in ports.items():
            engine = Proc(
                f"vllm-{role}",
                [
                    sys.executable,
                    "-m",
                    "tests.llmd.vllm_engine",
                    "--port",
                    str(port),
                    "--otlp",
                    otlp,
                    "--log",
                    str(tmp_path / f"{role}.jsonl"),
                ],
                tmp_path,
                {"OTEL_SERVICE_NAME": f"vllm-{role}", **FAST_BATCHES},
            )
            procs.append(engine)
            engine.wait_port(port)
        sidecar, sidecar_port = _start_sidecar(sidecar_bin, tmp_path, otlp, ports["decode"])
        procs.append(sidecar)

        headers = {"x-prefiller-host-port": f"127.0.0.1:{ports['prefill']}"}
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": "hello " * 40}],
            "max_tokens": MAX_TOKENS,
        }
        url = f"http://127.0.0.1:{sidecar_port}/v1/chat/completions"
        client_trace = client_span = client_id = None
        if client == "traced":
            provider = TracerProvider(resource=Resource.create({"service.name": "chat-client"}))
            provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=otlp, insecure=True)))
            client_id = str(uuid.uuid4())
            with provider.get_tracer("chat-client").start_as_current_span(
                "POST", kind=trace.SpanKind.CLIENT
            ) as cs:
                headers["x-request-id"] = client_id
                TraceContextTextMapPropagator().inject(headers)
                reply = httpx.post(url, headers=headers, json=body, timeout=60)
            provider.shutdown()
            client_trace = format(cs.get_span_context().trace_id, "032x")
            client_span = format(cs.get_span_context().span_id, "016x")
        else:
            reply = httpx.post(url, headers=headers, json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        for p in procs[1:3]:  # the engines; SIGTERM: each flushes its batch
            assert p.stop() == 0, p.log()

        # What the sidecar sent each engine.
        (pre,) = _engine_log(tmp_path / "prefill.jsonl")
        (dec,) = _engine_log(tmp_path / "decode.jsonl")
        assert pre["prefill"] and not dec["prefill"]
        assert dec["kv_transfer_params_in"]["do_remote_prefill"] is True  # handed over by the sidecar
        if client == "traced":
            assert pre["x_request_ids"][0] == dec["x_request_ids"][0] == client_id
            sidecar_id = pre["x_request_ids"][1]
            assert pre["x_request_ids"] == dec["x_request_ids"] == [client_id, sidecar_id]
            assert pre["traceparent"] == dec["traceparent"] == headers["traceparent"]  # passed through
            assert pre["gen_ai_request_id"] == f"chatcmpl-{client_id}"
        else:
            (sidecar_id,) = pre["x_request_ids"]
            assert dec["x_request_ids"] == [sidecar_id]
            assert pre["traceparent"] is None and dec["traceparent"] is None  # no injection in v0.7.1
            assert pre["gen_ai_request_id"] == f"chatcmpl-{sidecar_id}"
        uuid.UUID(sidecar_id)

        def assembled() -> dict[str, Any] | None:
            r = httpx.get(f"{base}/api/v1/requests/{sidecar_id}", timeout=30)
            got = r.json() if r.status_code == 200 else None
            want = 7 if client == "traced" else 6
            return got if got and got["span_count"] == want else None

        summary = wait_for(assembled, timeout=60, what=f"the {client} request assembled")
        traces = summary["trace_ids"]
        spans = _spans_of(base, traces[0])  # the request's spans, from every trace it joined
        by_name: dict[str, list[dict[str, Any]]] = {}
        for s in spans:
            by_name.setdefault(s["name"], []).append(s)
        want_names = {**dict.fromkeys(SIDECAR_SPANS, 1), "llm_request": 2}
        if client == "traced":
            want_names["POST"] = 1
        assert {n: len(v) for n, v in by_name.items()} == want_names

        # The sidecar's spans exactly as the binary sent them, and railtrace's reading of them.
        one = {name: by_name[name][0] for name in SIDECAR_SPANS}
        for name, (kind, scope) in SIDECAR_SPANS.items():
            s = one[name]
            assert (s["kind"], s["scope_name"], s["service_name"]) == (
                kind.value + 1,
                scope,
                SIDECAR_SERVICE,
            ), s
            assert (s["canonical_name"], s["role"]) == CANONICAL[name], s
        server = one["llm_d.pd_proxy.POST /v1/chat/completions"]
        root, prefill, decode = (one[f"llm_d.pd_proxy.{n}"] for n in ("request", "prefill", "decode"))
        sidecar_trace = server["trace_id"]
        assert {s["trace_id"] for s in one.values()} == {sidecar_trace}
        assert root["parent_span_id"] == server["span_id"]
        assert prefill["parent_span_id"] == root["span_id"]
        assert decode["parent_span_id"] == prefill["span_id"]  # nixlv2: decode under prefill
        for leg in (prefill, decode):
            assert leg["attributes"]["llm_d.pd_proxy.request_id"] == sidecar_id
            assert leg["attributes"]["llm_d.pd_proxy.connector"] == "nixlv2"
        assert prefill["attributes"]["llm_d.pd_proxy.prefill_target"] == f"127.0.0.1:{ports['prefill']}"
        assert root["attributes"]["llm_d.pd_proxy.prefill_target"] == f"127.0.0.1:{ports['prefill']}"
        assert decode["attributes"]["llm_d.pd_proxy.decode.target"] == f"localhost:{ports['decode']}"
        for key in ("true_ttft_ms", "prefill_duration_ms", "decode_duration_ms", "total_duration_ms"):
            assert isinstance(decode["attributes"][f"llm_d.pd_proxy.{key}"], float), key

        # The engines' spans: where the binary's headers put them.
        engine = {s["service_name"]: s for s in by_name["llm_request"]}
        assert set(engine) == {"vllm-prefill", "vllm-decode"}
        assert (engine["vllm-prefill"]["role"], engine["vllm-decode"]["role"]) == ("prefill", "decode")
        for service, logged in (("vllm-prefill", pre), ("vllm-decode", dec)):
            s = engine[service]
            assert (s["trace_id"], s["span_id"]) == (logged["trace_id"], logged["span_id"])
            assert s["attributes"]["gen_ai.request.id"] == logged["gen_ai_request_id"]
        if client == "traced":
            (post,) = by_name["POST"]
            assert (post["trace_id"], post["span_id"], post["parent_span_id"]) == (
                client_trace,
                client_span,
                None,
            )
            assert sidecar_trace == client_trace and server["parent_span_id"] == client_span
            for s in engine.values():
                assert (s["trace_id"], s["parent_span_id"]) == (client_trace, client_span)
            assert traces == [client_trace]
        else:
            assert server["parent_span_id"] is None
            for s in engine.values():
                assert s["parent_span_id"] is None and s["trace_id"] != sidecar_trace
            assert traces[0] == sidecar_trace and len(traces) == 3
            assert "joined by" in summary["coverage"]["joined"]

        # The request as railtrace assembled it: both legs, the sidecar's TTFT, no flag.
        assert summary["trace_id"] == sidecar_trace
        assert summary["request_id"] == sidecar_id
        assert summary["flags"] == []
        assert summary["coverage"]["hops"] == ["sidecar", "prefill_engine", "decode_engine"]
        assert set(summary["breakdown_s"]) >= {"prefill", "decode"}
        assert summary["ttft_s"] == pytest.approx(
            (decode["start_ns"] - server["start_ns"]) / 1e9
            + engine["vllm-decode"]["attributes"]["gen_ai.latency.time_to_first_token"],
            abs=0.002,
        )
        forms = [sidecar_trace, sidecar_id, pre["gen_ai_request_id"], *([client_id] if client_id else [])]
        for ident in forms:
            r = httpx.get(f"{base}/api/v1/requests/{ident}", timeout=30)
            assert r.status_code == 200 and r.json()["trace_id"] == sidecar_trace, ident
        listed = httpx.get(f"{base}/api/v1/requests", timeout=30).json()["items"]
        assert [r["trace_id"] for r in listed] == [sidecar_trace]
    finally:
        for p in reversed(procs):
            p.stop()


def test_real_sidecar_with_llmd_inference_sim(db_url: str, tmp_path: Path) -> None:
    """The sidecar between two of llm-d's own engine simulators (llm-d-inference-sim v0.10.2, P/D
    `kv_transfer_params` and all): upstream code on every hop. The simulator traces nothing, so
    railtrace has the sidecar's four spans alone and must still make one request of them, both
    legs from the sidecar's `prefill` and `decode`, with no flag."""
    sidecar_bin, sim_bin = llmd_binary("pd-sidecar"), llmd_binary("llm-d-inference-sim")
    serve, base, grpc_port = railtrace_serve(db_url, tmp_path)
    procs = [serve]
    try:
        ports = {"prefill": free_port(), "decode": free_port()}
        for role, port in ports.items():
            # Listens on every interface too (its HTTP and gRPC on one port, no address flag).
            sim = Proc(
                f"sim-{role}",
                [
                    str(sim_bin),
                    "--port",
                    str(port),
                    "--model",
                    "m",
                    "--time-to-first-token",
                    "20ms",
                    "--inter-token-latency",
                    "2ms",
                ],
                tmp_path,
            )
            procs.append(sim)
            sim.wait_port(port)
        sidecar, sidecar_port = _start_sidecar(
            sidecar_bin, tmp_path, f"127.0.0.1:{grpc_port}", ports["decode"]
        )
        procs.append(sidecar)
        reply = httpx.post(
            f"http://127.0.0.1:{sidecar_port}/v1/chat/completions",
            headers={"x-prefiller-host-port": f"127.0.0.1:{ports['prefill']}"},
            json={
                "model": "m",
                "messages": [{"role": "user", "content": "hello " * 40}],
                "max_tokens": MAX_TOKENS,
            },
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        # The decode simulator's answer (the prefill one ends with `remote_decode`).
        assert reply.json()["choices"][0]["finish_reason"] in ("stop", "length"), reply.text
        # The sidecar stays up until its spans are in: v0.7.1 (and v0.8.0) flush at SIGTERM with
        # the signal's context, already cancelled, so the last batch is dropped (cmd/pd-sidecar/main.go;
        # v0.9.0 shuts down with context.Background()).

        def assembled() -> dict[str, Any] | None:
            items = httpx.get(f"{base}/api/v1/requests", timeout=30).json()["items"]
            return items[0] if len(items) == 1 and items[0]["span_count"] == len(SIDECAR_SPANS) else None

        summary = wait_for(assembled, timeout=60, what="the request assembled from the sidecar's spans")
        spans = {s["name"]: s for s in _spans_of(base, summary["trace_id"])}
        assert set(spans) == set(SIDECAR_SPANS)
        for name, (kind, scope) in SIDECAR_SPANS.items():
            s = spans[name]
            assert (s["kind"], s["scope_name"], s["service_name"]) == (
                kind.value + 1,
                scope,
                SIDECAR_SERVICE,
            ), s
            assert (s["canonical_name"], s["role"]) == CANONICAL[name], s
        server, root, prefill, decode = (spans[n] for n in SIDECAR_SPANS)
        assert server["parent_span_id"] is None
        assert root["parent_span_id"] == server["span_id"]
        assert prefill["parent_span_id"] == root["span_id"]
        assert decode["parent_span_id"] == prefill["span_id"]
        sidecar_id = prefill["attributes"]["llm_d.pd_proxy.request_id"]
        assert decode["attributes"]["llm_d.pd_proxy.request_id"] == sidecar_id
        assert prefill["attributes"]["llm_d.pd_proxy.prefill.status_code"] == 200
        assert decode["attributes"]["llm_d.pd_proxy.decode.target"] == f"localhost:{ports['decode']}"
        assert summary["trace_ids"] == [server["trace_id"]] == [summary["trace_id"]]
        assert summary["request_id"] == sidecar_id
        assert summary["flags"] == []
        assert summary["coverage"]["hops"] == ["sidecar"]
        r = httpx.get(f"{base}/api/v1/requests/{sidecar_id}", timeout=30)
        assert r.status_code == 200 and r.json()["trace_id"] == summary["trace_id"]
    finally:
        for p in reversed(procs):
            p.stop()
