"""`railtrace serve` as users run it: its own process, options from the command line and the
environment, the official OTLP exporter, the REST API, a clean stop on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.service_helpers import wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_command_end_to_end(db_url: str, tmp_path: Path) -> None:
    port, grpc_port = _free_port(), _free_port()
    env = dict(os.environ, RAILTRACE_DB=db_url, RAILTRACE_GRPC_PORT=str(grpc_port))
    proc = subprocess.Popen(
        [sys.executable, "-m", "railtrace.cli", "serve", "--port", str(port), "--quiet-period", "0.2"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                return httpx.get(base + "/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, what="railtrace serve to become ready")
        memory = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": "routing-sidecar"}))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracer = provider.get_tracer("test")
        attrs = {"llm_d.pd_proxy.request_id": "abcd-1"}
        with tracer.start_as_current_span("forward_request", attributes=attrs):
            pass
        provider.shutdown()
        exporter = OTLPSpanExporter(endpoint=base + "/v1/traces")
        assert exporter.export(memory.get_finished_spans()) == SpanExportResult.SUCCESS
        exporter.shutdown()
        tid = format(memory.get_finished_spans()[0].context.trace_id, "032x")
        spans = httpx.get(f"{base}/api/v1/traces/{tid}").json()["spans"]
        assert [s["name"] for s in spans] == ["forward_request"]
        with socket.create_connection(("127.0.0.1", grpc_port), timeout=5):
            pass  # the gRPC port from the environment is listening
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            # What it logged says which part of the stop hung.
            raise AssertionError(
                "railtrace serve did not stop within 30 s of SIGTERM:\n" + proc.stdout.read().decode()
            ) from None
    output = proc.stdout.read().decode()
    assert code == 0, output
    assert f"http://127.0.0.1:{port}" in output and f"127.0.0.1:{grpc_port}" in output


def test_serve_command_reports_a_busy_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "railtrace.cli",
                "serve",
                "--port",
                str(port),
                "--grpc-port",
                "0",
                "--db",
                f"sqlite:///{tmp_path / 'x.db'}",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 2
    assert f"cannot listen for HTTP on 127.0.0.1:{port}" in result.stderr
