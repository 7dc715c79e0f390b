"""Helpers for the service tests: OTLP payloads shaped like real llm-d P/D traces, settings,
query plans, and calls to a running service."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from railtrace.otlp.encode import key_value as kv
from railtrace.server.runner import Service
from railtrace.settings import Settings
from railtrace.store import Store
from tests.reliability.reliability_helpers import free_port

T0 = 1_790_000_000 * 10**9


def settings_for(db_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "db": db_url,
        "port": 0,
        "grpc_port": 0,
        "quiet_period_s": 0.2,
        "assembly_interval_s": 0.05,
        "topology": [],
    }
    values.update(overrides)
    return Settings(**values)


def trace_id(n: int) -> str:
    return f"{0xA0000000 + n:032x}"


def span_id(n: int, i: int) -> str:
    return f"{(n << 8) + i + 1:016x}"


# (service, pod, node) per process of the P/D path.
PROCESSES = {
    "epp": ("llm-d-router/epp", "epp-0", "node-cpu"),
    "sidecar": ("routing-sidecar", "decode-0", "node-b"),
    "prefill": ("vllm-prefill", "prefill-0", "node-a"),
    "decode": ("vllm-decode", "decode-0", "node-b"),
}


def pd_spans(n: int, start_ns: int = T0) -> list[tuple[str, dict[str, Any]]]:
    """The eight spans of one P/D request (names and attributes as in the Jaeger capture)."""
    rid = f"{n:08x}-1111-2222-3333-444455556666"
    ms = 1_000_000
    s = lambda i: span_id(n, i)  # noqa: E731
    return [
        (
            "epp",
            dict(
                i=0,
                parent=None,
                name="gateway.request",
                start=0,
                end=3146 * ms,
                attrs={"gen_ai.request.model": "llama-3-70b", "http.request.header.x-request-id": [rid]},
            ),
        ),
        (
            "epp",
            dict(
                i=1,
                parent=s(0),
                name="run_scheduler_profile",
                start=1 * ms,
                end=2 * ms,
                attrs={"llm_d.epp.scheduling.profile.name": "decode"},
            ),
        ),
        (
            "epp",
            dict(
                i=2,
                parent=s(1),
                name="pick_endpoints",
                start=1 * ms,
                end=2 * ms,
                attrs={"llm_d.epp.picker.top_endpoints": ["10.0.0.2:8000"]},
            ),
        ),
        (
            "sidecar",
            dict(
                i=3,
                parent=s(0),
                name="forward_request",
                start=3 * ms,
                end=3145 * ms,
                attrs={"llm_d.pd_proxy.request_id": rid, "llm_d.pd_proxy.connector": "nixlv2"},
            ),
        ),
        (
            "sidecar",
            dict(
                i=4,
                parent=s(3),
                name="prefill",
                start=4 * ms,
                end=54 * ms,
                attrs={"llm_d.pd_proxy.prefill_target": "10.0.0.1:8000"},
            ),
        ),
        (
            "prefill",
            dict(
                i=5,
                parent=s(4),
                name="llm_request",
                start=5 * ms,
                end=52 * ms,
                attrs={
                    "gen_ai.request.id": f"chatcmpl-{rid}",
                    "gen_ai.usage.completion_tokens": 1,
                    "gen_ai.request.max_tokens": 1,
                    "gen_ai.usage.prompt_tokens": 2071,
                },
            ),
        ),
        (
            "sidecar",
            dict(
                i=6,
                parent=s(4),
                name="decode",
                start=54 * ms,
                end=3145 * ms,
                attrs={"llm_d.pd_proxy.true_ttft_ms": 50.0, "llm_d.pd_proxy.decode.target": "10.0.0.2:8000"},
            ),
        ),
        (
            "decode",
            dict(
                i=7,
                parent=s(6),
                name="llm_request",
                start=55 * ms,
                end=3144 * ms,
                attrs={
                    "gen_ai.request.id": f"chatcmpl-{rid}",
                    "gen_ai.latency.time_to_first_token": 0.343,
                    "gen_ai.latency.time_in_queue": 0.322,
                    "gen_ai.usage.completion_tokens": 200,
                },
            ),
        ),
    ]


def export_request(
    traces: list[int],
    *,
    start_ns: int = T0,
    skip: set[tuple[int, int]] = frozenset(),
    only: set[int] | None = None,
    split: bool = False,
    invalid: int = 0,
) -> ExportTraceServiceRequest:
    """An export call carrying the P/D spans of the given trace numbers (minus `skip`, or
    just the span indexes in `only`), plus `invalid` spans with an all-zero trace id.

    `split` imitates older llm-d that broke the context at the sidecar: the sidecar and
    engine spans arrive in a trace of their own (`trace_id(n + 500)`), joined only by the
    request id."""
    req = ExportTraceServiceRequest()
    by_process: dict[str, Any] = {}
    for proc, (service, pod, node) in PROCESSES.items():
        rs = req.resource_spans.add()
        rs.resource.attributes.extend(
            [
                kv("service.name", service),
                kv("k8s.pod.name", pod),
                kv("k8s.node.name", node),
                kv("k8s.namespace.name", "llm-d"),
            ]
        )
        ss = rs.scope_spans.add()
        ss.scope.name = "railtrace.test"
        by_process[proc] = ss
    for n in traces:
        for proc, sp in pd_spans(n):
            if (n, sp["i"]) in skip or (only is not None and sp["i"] not in only):
                continue
            pb = by_process[proc].spans.add()
            second_half = split and sp["i"] >= 3
            pb.trace_id = bytes.fromhex(trace_id(n + 500 if second_half else n))
            pb.span_id = bytes.fromhex(span_id(n, sp["i"]))
            if sp["parent"] and not (split and sp["i"] == 3):
                pb.parent_span_id = bytes.fromhex(sp["parent"])
            pb.name = sp["name"]
            pb.kind = PbSpan.SPAN_KIND_SERVER if not pb.parent_span_id else PbSpan.SPAN_KIND_INTERNAL
            pb.start_time_unix_nano = start_ns + n * 10**9 + sp["start"]
            pb.end_time_unix_nano = start_ns + n * 10**9 + sp["end"]
            pb.attributes.extend(kv(k, v) for k, v in sp["attrs"].items())
    for i in range(invalid):
        pb = by_process["epp"].spans.add()
        pb.trace_id = b"\0" * 16
        pb.span_id = bytes.fromhex(f"{0xBAD0 + i:016x}")
        pb.name = "broken"
        pb.start_time_unix_nano = start_ns
        pb.end_time_unix_nano = start_ns + 1
    return req


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll until `predicate()` is truthy (eventual consistency, not a speed check)."""
    deadline = time.monotonic() + timeout * float(os.environ.get("RAILTRACE_TEST_TIMEOUT_SCALE", "1"))
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def query_plan(store: Store, stmt: Any, params: dict[str, Any], analyze: bool = False) -> list[str]:
    """`stmt`'s plan; PostgreSQL is told to avoid full scans wherever it can (on a table this
    small it would scan rather than look ids up), so that one that remains is one no index allows.
    `analyze` (PostgreSQL): run it and show the rows each step read; what it wrote is rolled back."""
    with store.engine.begin() as conn:
        compiled = stmt.compile(dialect=conn.dialect)
        values = compiled.construct_params(params)
        if store.sqlite:
            ordered = tuple(values[k] for k in compiled.positiontup or ())
            return [row[-1] for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + str(compiled), ordered)]
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        explain = "EXPLAIN (ANALYZE, COSTS OFF) " if analyze else "EXPLAIN "
        plan = [row[0] for row in conn.exec_driver_sql(explain + str(compiled), values)]
        conn.rollback()
        return plan


def post(svc: Service, req: ExportTraceServiceRequest) -> None:
    """POST one export request as protobuf; it must be acknowledged."""
    r = httpx.post(
        svc.http_url + "/v1/traces",
        content=req.SerializeToString(),
        headers={"content-type": "application/x-protobuf"},
        timeout=60,
    )
    assert r.status_code == 200, r.text


def get_request(svc: Service, ident: str) -> dict | None:
    r = httpx.get(f"{svc.http_url}/api/v1/requests/{ident}")
    return r.json() if r.status_code == 200 else None


def metric_sum(svc: Service, name: str) -> float:
    """The sum of every series of one metric in the service's `/metrics`."""
    total = 0.0
    for line in httpx.get(svc.http_url + "/metrics").text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            head = line.split(" ", 1)[0]
            if head == name or head.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def flood_export(first: int, count: int) -> ExportTraceServiceRequest:
    """An export of requests `first`..`first + count - 1`, each with its own model, pods, nodes."""
    req = ExportTraceServiceRequest()
    for n in range(first, first + count):
        scopes = {}
        for proc, (service, pod, node) in PROCESSES.items():
            rs = req.resource_spans.add()
            rs.resource.attributes.extend(
                [
                    kv("service.name", service),
                    kv("k8s.pod.name", f"{pod}-{n}"),
                    kv("k8s.node.name", f"{node}-{n}"),
                    kv("k8s.namespace.name", "llm-d"),
                ]
            )
            ss = rs.scope_spans.add()
            ss.scope.name = "railtrace.test"
            scopes[proc] = ss
        for proc, sp in pd_spans(n):
            pb = scopes[proc].spans.add()
            pb.trace_id = bytes.fromhex(trace_id(n))
            pb.span_id = bytes.fromhex(span_id(n, sp["i"]))
            if sp["parent"]:
                pb.parent_span_id = bytes.fromhex(sp["parent"])
            pb.name = sp["name"]
            pb.kind = PbSpan.SPAN_KIND_SERVER if not pb.parent_span_id else PbSpan.SPAN_KIND_INTERNAL
            pb.start_time_unix_nano = T0 + n * 10**6 + sp["start"]
            pb.end_time_unix_nano = T0 + n * 10**6 + sp["end"]
            attrs = dict(sp["attrs"])
            if "gen_ai.request.model" in attrs:
                attrs["gen_ai.request.model"] = f"flood-model-{n}"
            pb.attributes.extend(kv(k, v) for k, v in attrs.items())
    return req


@contextmanager
def serve_process(db_url: str, cwd: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`railtrace serve` in its own process on `db_url` (free ports, 127.0.0.1, quiet period
    0.2 s unless `args` say otherwise), until it is ready: its base URL. Stopped by its PID, with
    SIGTERM and, past 30 s, SIGKILL."""
    port = free_port()
    cmd = [sys.executable, "-m", "railtrace.cli", "serve", "--port", str(port)]
    cmd += ["--grpc-port", str(free_port())]
    proc = subprocess.Popen(
        [*cmd, "--quiet-period", "0.2", *args],
        env=dict(os.environ, RAILTRACE_DB=db_url, **(env or {})),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                return httpx.get(base + "/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout=60, what="railtrace serve to become ready")
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
