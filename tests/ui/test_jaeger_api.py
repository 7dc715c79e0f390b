"""railtrace's Jaeger query API (`/jaeger/api/...`) against a real Jaeger, field by field.

The same spans, made by the official OpenTelemetry SDK (an llm-d P/D request: the EPP's
`gateway.request` and scheduler spans, the routing sidecar's, both vLLM `llm_request` spans;
every attribute type, span kinds, an error status with a description, events with attributes)
are sent with the SDK's OTLP/HTTP exporter to Jaeger v2 (scripts/build-jaeger, v1.75.0, its
in-memory store) and to `railtrace serve` (its own process, on SQLite and PostgreSQL). Then the
answers of both to the same calls are compared: trace by id (every span's fields, its process,
the envelope), services, operations (both forms) and searches by service, operation, tags and
duration; bad parameters get a 400 from both. The only differences allowed are the ones
docs/ui.md lists ("Jaeger API: what differs from Jaeger"): `ALLOWED` below.

Skipped, with the reason, when Jaeger cannot be built (no Go).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

from benchmarks.common.jaeger import Jaeger, JaegerUnavailable, jaeger_binary
from benchmarks.common.payload import PROCESSES, spans_of_request
from railtrace.server.runner import Service
from tests.service_helpers import serve_process, settings_for, wait_for

# The tags railtrace adds and Jaeger cannot: the request's verdict, on its root span only, and
# ingest's stamps on the resource (who sent it, who vouches for its pod), on every process.
VERDICT_PREFIX = "railtrace.verdict."
INGEST_PREFIX = "railtrace.otlp."
# What railtrace does not store, so cannot show (docs/ui.md): the instrumentation scope's version.
NOT_STORED = {"otel.scope.version"}
ERROR_TAG = json.dumps({"error": "true"})
KINDS = {
    "gateway.request": SpanKind.SERVER,
    "run_scheduler_profile": SpanKind.INTERNAL,
    "forward_request": SpanKind.SERVER,
    "prefill": SpanKind.CLIENT,
    "decode": SpanKind.CLIENT,
    "llm_request": SpanKind.SERVER,
}


@pytest.fixture
def jaegers() -> Iterator[dict[str, Jaeger]]:
    """Jaeger v2 with its default in-memory store, and with Badger (on disk): fresh for each
    test, so both hold what railtrace holds (counts of calls compare)."""
    try:
        binary = jaeger_binary()
    except JaegerUnavailable as exc:
        pytest.skip(str(exc))
    started: dict[str, Jaeger] = {}
    try:
        for store in ("memory", "badger"):
            started[store] = Jaeger(binary, store)
        yield started
    finally:
        for j in started.values():
            j.stop()


@pytest.fixture
def railtrace(db_url: str, tmp_path: Path) -> Iterator[str]:
    """`railtrace serve` in its own process on `db_url`: its base URL."""
    with serve_process(db_url, tmp_path) as base:
        yield base


def _request_spans(seed: int) -> tuple[list[ReadableSpan], str]:
    """One llm-d P/D request made with the SDK, one provider (resource) per process; the spans
    and the trace id (32 hex)."""
    rng = random.Random(seed)
    memory = InMemorySpanExporter()
    providers = {}
    for proc, (service, pod, node) in PROCESSES.items():
        resource = Resource.create(
            {
                "service.name": service,
                "k8s.pod.name": pod,
                "k8s.node.name": node,
                "k8s.namespace.name": "llm-d",
                "host.name": node,
                "service.instance.id": f"{pod}-{seed}",
            }
        )
        p = TracerProvider(resource=resource)
        p.add_span_processor(SimpleSpanProcessor(memory))
        providers[proc] = p
    t0 = time.time_ns() - 30 * 10**9
    made: list[Any] = []
    for i, (proc, name, parent, attrs, s0, s1) in enumerate(spans_of_request(rng, 1)):
        tracer = providers[proc].get_tracer(f"{PROCESSES[proc][0]}.tracer", "0.1.0")
        ctx = set_span_in_context(made[int(parent)]) if parent is not None else None
        extra: dict[str, Any] = (
            {
                "test.int_list": [1, 2, 3],
                "test.bool_list": [True, False],
                "test.float_list": [1.0, 2.5, 1e-07, 0.00001],
                "test.str_list": ["a<b>&c", "ü"],
            }
            if i == 0
            else {}
        )
        span = tracer.start_span(
            name, context=ctx, kind=KINDS[name], attributes={**attrs, **extra}, start_time=t0 + s0
        )
        if name == "decode" and proc == "sidecar":
            span.add_event(
                "first_token", {"llm_d.pd_proxy.ttft_ms": 42.5, "chunk": 1}, timestamp=t0 + s0 + 5_000_000
            )
            span.add_event("done", timestamp=t0 + s1 - 1000)
        if name == "prefill":
            span.set_status(Status(StatusCode.ERROR, "prefill pod answered 503 once"))
        if name == "llm_request" and proc == "decode":
            span.set_status(Status(StatusCode.OK))
        made.append(span)
    for span, (_, _, _, _, _, s1) in zip(
        reversed(made), reversed(spans_of_request(random.Random(seed), 1)), strict=True
    ):
        span.end(end_time=t0 + s1)
    for p in providers.values():
        p.shutdown()
    spans = list(memory.get_finished_spans())
    return spans, format(spans[0].context.trace_id, "032x")


def _send(spans: list[ReadableSpan], endpoint: str) -> None:
    exporter = OTLPSpanExporter(endpoint=endpoint)
    try:
        assert exporter.export(spans) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()


def _get(url: str, **params: Any) -> httpx.Response:
    return httpx.get(url, params=params, timeout=30)


def _trace(base: str, trace_id: str) -> dict[str, Any]:
    r = _get(f"{base}/api/traces/{trace_id}")
    assert r.status_code == 200, r.text
    return r.json()


def _by_span(trace: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each span with its process inlined (process ids are per answer), verdict tags apart."""
    out = {}
    for s in trace["spans"]:
        s = dict(s)
        process = trace["processes"][s.pop("processID")]
        s["stamps"] = [t["key"] for t in process["tags"] if t["key"].startswith(INGEST_PREFIX)]
        s["process"] = {**process, "tags": [t for t in process["tags"] if t["key"] not in s["stamps"]]}
        s["verdict"] = [t for t in s["tags"] if t["key"].startswith(VERDICT_PREFIX)]
        s["tags"] = [t for t in s["tags"] if not t["key"].startswith(VERDICT_PREFIX)]
        s["not_stored"] = [t for t in s["tags"] if t["key"] in NOT_STORED]
        s["tags"] = [t for t in s["tags"] if t["key"] not in NOT_STORED]
        out[s["spanID"]] = s
    return out


def _same_trace(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    """Field by field; the only difference allowed is the verdict on railtrace's root span."""
    assert set(ours) == set(theirs)
    assert ours["traceID"] == theirs["traceID"]
    assert ours["warnings"] == theirs["warnings"]
    assert len(ours["processes"]) == len(theirs["processes"])
    a, b = _by_span(ours), _by_span(theirs)
    assert set(a) == set(b)
    for span_id, theirs_span in b.items():
        ours_span = a[span_id]
        assert set(ours_span) == set(theirs_span), span_id
        for key in theirs_span:
            if key in ("verdict", "stamps", "not_stored"):
                continue
            assert ours_span[key] == theirs_span[key], (span_id, theirs_span["operationName"], key)
    roots = [s for s in a.values() if not s["references"]]
    assert len(roots) == 1
    assert all(not s["verdict"] for s in a.values() if s is not roots[0])
    assert all(not s["verdict"] and not s["stamps"] for s in b.values())
    assert all(s["stamps"] for s in a.values())
    assert all(not s["not_stored"] for s in a.values())


def test_trace_services_operations_and_search_match_jaeger(
    jaegers: dict[str, Jaeger], railtrace: str
) -> None:
    spans, trace_id = _request_spans(seed=random.randrange(1 << 30))
    for j in jaegers.values():
        _send(spans, j.otlp_http + "/v1/traces")
    _send(spans, railtrace + "/v1/traces")
    theirs_base, ours_base = jaegers["memory"].query, railtrace + "/jaeger"
    badger_base = jaegers["badger"].query

    for base in (theirs_base, badger_base):
        wait_for(lambda b=base: _get(f"{b}/api/traces/{trace_id}").status_code == 200, what="Jaeger to store")
    wait_for(lambda: _get(f"{railtrace}/api/v1/requests/{trace_id}").status_code == 200, what="assembly")

    # Trace by id: the envelope and every field.
    theirs, ours = _trace(theirs_base, trace_id), _trace(ours_base, trace_id)
    assert set(ours) == set(theirs) == {"data", "total", "limit", "offset", "errors"}
    assert {k: v for k, v in ours.items() if k != "data"} == {k: v for k, v in theirs.items() if k != "data"}
    assert len(ours["data"]) == len(theirs["data"]) == 1
    _same_trace(ours["data"][0], theirs["data"][0])
    _same_trace(ours["data"][0], _trace(badger_base, trace_id)["data"][0])
    root = next(s for s in ours["data"][0]["spans"] if not s["references"])
    assert any(t["key"] == "railtrace.verdict.request_id" for t in root["tags"])

    # Services and operations.
    # Jaeger lists services in no particular order (a map's); railtrace sorts them.
    services = _get(f"{theirs_base}/api/services").json()
    ours_services = _get(f"{ours_base}/api/services").json()
    assert ours_services["data"] == sorted(services["data"])
    assert {**ours_services, "data": None} == {**services, "data": None}
    for service in services["data"]:
        path = f"/api/services/{quote(service, safe='')}/operations"  # Grafana encodes it too
        theirs_ops, ours_ops = _get(theirs_base + path).json(), _get(ours_base + path).json()
        assert (
            sorted(ours_ops["data"]) == sorted(theirs_ops["data"])
            and ours_ops["total"] == theirs_ops["total"]
        )
        theirs_ops, ours_ops = (
            _get(b + "/api/operations", service=service).json() for b in (theirs_base, ours_base)
        )
        key = lambda o: (o["name"], o["spanKind"])  # noqa: E731
        assert sorted(ours_ops["data"], key=key) == sorted(theirs_ops["data"], key=key)

    # Searches: the same traces found (our trace among them), each the same trace.
    searches: list[dict[str, Any]] = [
        {"service": "vllm-decode"},
        {"service": "routing-sidecar", "operation": "decode"},
        {"service": "llm-d-router/epp", "tags": json.dumps({"http.response.status_code": "200"})},
        {"service": "routing-sidecar", "tags": json.dumps({"error": "true"})},
        {"service": "routing-sidecar", "tag": "llm_d.pd_proxy.connector:nixlv2", "minDuration": "1ms"},
        {"service": "vllm-decode", "minDuration": "1h"},
        {"service": "vllm-decode", "maxDuration": "1us"},
        {"service": "routing-sidecar", "operation": "no-such-operation"},
        {"service": "no-such-service"},
    ]
    for params in searches:
        params = {**params, "limit": 20}
        ours_found = _get(ours_base + "/api/traces", **params).json()
        mine = lambda r: [t for t in r["data"] if t["traceID"] == trace_id]  # noqa: E731
        for base in (theirs_base, badger_base):
            theirs_found = _get(base + "/api/traces", **params).json()
            if base == theirs_base and params.get("tags") == ERROR_TAG:
                # Jaeger's in-memory store reads `error` as a boolean that a `tags` string never
                # is, and finds only spans with status OK (docs/ui.md); Badger finds the errors.
                assert not mine(theirs_found) and mine(ours_found)
                continue
            assert len(mine(ours_found)) == len(mine(theirs_found)), (base, params)
            for o, t in zip(mine(ours_found), mine(theirs_found), strict=True):
                _same_trace(o, t)

    # Calls between services (Grafana's dependency graph): the same links and counts.
    now_ms = time.time_ns() // 10**6
    for params in ({"endTs": now_ms, "lookback": 3_600_000}, {"endTs": now_ms, "service": "vllm-decode"}):
        theirs_deps, ours_deps = (
            _get(b + "/api/dependencies", **params).json() for b in (theirs_base, ours_base)
        )
        key = lambda d: (d["parent"], d["child"])  # noqa: E731
        assert ours_deps["data"] == sorted(theirs_deps["data"], key=key), params
        assert ours_deps["data"], params

    # Traces by id through the search form: the same traces, the same errors for unknown ids.
    unknown = "0" * 31 + "1"
    theirs_ids, ours_ids = (
        httpx.get(b + "/api/traces", params=[("traceID", trace_id), ("traceID", unknown)], timeout=30).json()
        for b in (theirs_base, ours_base)
    )
    assert (
        ours_ids["errors"] == theirs_ids["errors"] and len(ours_ids["data"]) == len(theirs_ids["data"]) == 1
    )
    _same_trace(ours_ids["data"][0], theirs_ids["data"][0])

    # Bad parameters: a 400 from both, with the reason in Jaeger's `errors`.
    for params in (
        {},
        {"service": "vllm-decode", "tags": "{not json"},
        {"service": "vllm-decode", "minDuration": "fast"},
        {"service": "vllm-decode", "start": "yesterday"},
        {"service": "vllm-decode", "limit": "many"},
        {"service": "vllm-decode", "minDuration": "2s", "maxDuration": "1s"},
        {"service": "vllm-decode", "tag": "no-colon"},
    ):
        theirs_r, ours_r = (_get(b + "/api/traces", **params) for b in (theirs_base, ours_base))
        assert theirs_r.status_code == ours_r.status_code == 400, (params, theirs_r.text, ours_r.text)
        body = ours_r.json()
        assert body["data"] is None and body["errors"][0]["code"] == 400 and body["errors"][0]["msg"]
    assert (
        _get(f"{ours_base}/api/traces/{'0' * 31}1").status_code
        == _get(f"{theirs_base}/api/traces/{'0' * 31}1").status_code
        == 404
    )
    assert (
        _get(f"{ours_base}/api/traces/not-hex").status_code
        == _get(f"{theirs_base}/api/traces/not-hex").status_code
        == 400
    )


def test_jaeger_paths_need_the_api_token_and_take_read_turns(tmp_path: Path) -> None:
    """Without Jaeger: `/jaeger/api/` is read API like `/api/` (token, read gate), and its
    answers keep Jaeger's envelope on refusals of railtrace's own (bounded limit)."""
    settings = settings_for(f"sqlite:///{tmp_path / 'railtrace.db'}", api_token="s3cret")
    with Service(settings) as svc:
        base = svc.http_url + "/jaeger/api"
        assert httpx.get(base + "/services", timeout=10).status_code == 401
        auth = {"authorization": "Bearer s3cret"}
        assert svc.app is not None
        reads = svc.app.state.reads
        before = reads.admitted
        r = httpx.get(base + "/services", headers=auth, timeout=10)
        assert r.status_code == 200 and r.json() == {
            "data": [],
            "total": 0,
            "limit": 0,
            "offset": 0,
            "errors": None,
        }
        assert reads.admitted == before + 1
        r = httpx.get(base + "/traces", params={"service": "x", "limit": 5000}, headers=auth, timeout=10)
        assert r.status_code == 400 and "between 1 and 1000" in r.json()["errors"][0]["msg"]
        r = httpx.get(base + "/traces/" + "ab" * 16, headers=auth, timeout=10)
        assert r.status_code == 404 and r.json()["errors"] == [{"code": 404, "msg": "trace not found"}]
        # Documented in /openapi.json with the answers' models.
        paths = httpx.get(svc.http_url + "/openapi.json", timeout=10).json()["paths"]
        assert {
            "/jaeger/api/services",
            "/jaeger/api/services/{service}/operations",
            "/jaeger/api/operations",
            "/jaeger/api/traces",
            "/jaeger/api/traces/{trace_id}",
        } <= set(paths)


def test_a_trace_over_the_span_budget_is_cut_with_a_warning(tmp_path: Path) -> None:
    """Without Jaeger: a trace over `trace_max_spans` is answered cut there, the reason in
    Jaeger's `warnings` and in `X-Railtrace-Partial`, as the Tempo API does."""
    settings = settings_for(f"sqlite:///{tmp_path / 'railtrace.db'}", trace_max_spans=3)
    spans, trace_id = _request_spans(seed=11)
    with Service(settings) as svc:
        _send(spans, svc.http_url + "/v1/traces")
        r = httpx.get(f"{svc.http_url}/jaeger/api/traces/{trace_id}", timeout=30)
        assert r.status_code == 200, r.text
        trace = r.json()["data"][0]
        assert 0 < len(trace["spans"]) < len(spans)
        assert trace["warnings"] and "cut short" in trace["warnings"][0]
        assert "cut short" in r.headers["x-railtrace-partial"]
