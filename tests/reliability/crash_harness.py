"""Drives a real `railtrace serve` process with the official OTLP exporters and kills it.

`Ledger` records exactly the spans an exporter was told were accepted (its `export` returned
SUCCESS); everything else (in flight when the process died, or refused) may or may not be
stored. Used by the crash-safety test and by `benchmarks/reliability/crash.py`.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import create_engine, select

from railtrace.store import Store
from railtrace.store.schema import requests as requests_table
from tests.reliability.reliability_helpers import free_port

# The exporters log every failed attempt; a killed server makes many on purpose.
for _name in (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http",
    "opentelemetry.exporter.otlp.common",
):
    logging.getLogger(_name).setLevel(logging.CRITICAL)

_seq = itertools.count(1)


def pd_batch(traces: int) -> list[ReadableSpan]:
    """SDK spans of `traces` P/D requests (sidecar -> prefill -> engine), each a trace."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": "routing-sidecar", "k8s.pod.name": "decode-0", "k8s.node.name": "node-b"}
        )
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("railtrace.reliability")
    for _ in range(traces):
        rid = f"crash-{os.getpid()}-{next(_seq)}"
        with (
            tracer.start_as_current_span("forward_request", attributes={"llm_d.pd_proxy.request_id": rid}),
            tracer.start_as_current_span("prefill", attributes={"llm_d.pd_proxy.connector": "nixlv2"}),
            tracer.start_as_current_span("llm_request", attributes={"gen_ai.request.id": f"chatcmpl-{rid}"}),
        ):
            pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def key(span: ReadableSpan) -> tuple[str, str]:
    return format(span.context.trace_id, "032x"), format(span.context.span_id, "016x")


@dataclass
class Ledger:
    acked: set[tuple[str, str]] = field(default_factory=set)
    failed_exports: int = 0
    ok_exports: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, spans: list[ReadableSpan], result: SpanExportResult) -> None:
        with self.lock:
            if result == SpanExportResult.SUCCESS:
                self.acked.update(key(s) for s in spans)
                self.ok_exports += 1
            else:
                self.failed_exports += 1


class Server:
    """`railtrace serve` in its own process on free ports."""

    def __init__(self, db_url: str, workdir: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.port, self.grpc_port = free_port(), free_port()
        self.log = open(workdir / f"serve-{self.port}.log", "wb")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "railtrace.cli",
                "serve",
                "--db",
                db_url,
                "--port",
                str(self.port),
                "--grpc-port",
                str(self.grpc_port),
                "--quiet-period",
                "0.3",
                *extra,
            ],
            cwd=workdir,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc_endpoint = f"127.0.0.1:{self.grpc_port}"

    def wait_ready(self, timeout: float = 120, path: str = "/readyz") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"railtrace serve exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError("railtrace serve did not become ready")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.wait()

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.wait()

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log.close()


class Senders:
    """One HTTP and one gRPC official exporter, each exporting batches in a loop."""

    def __init__(self, server: Server, ledger: Ledger, traces_per_batch: int = 20) -> None:
        self.stop = threading.Event()
        self.ledger = ledger
        self.exporters = [
            HttpExporter(endpoint=server.url + "/v1/traces", timeout=3),
            GrpcExporter(endpoint=server.grpc_endpoint, insecure=True, timeout=3),
        ]
        self.threads = [
            threading.Thread(target=self._run, args=(e, traces_per_batch), daemon=True)
            for e in self.exporters
        ]

    def _run(self, exporter: HttpExporter | GrpcExporter, n: int) -> None:
        while not self.stop.is_set():
            spans = pd_batch(n)
            self.ledger.record(spans, exporter.export(spans))

    def __enter__(self) -> Senders:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)
        for e in self.exporters:
            e.shutdown()


def stored(db_url: str) -> set[tuple[str, str]]:
    engine = create_engine(db_url)
    try:
        return Store(engine).span_ids()
    finally:
        engine.dispose()


def assembled(db_url: str) -> set[str]:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return set(conn.execute(select(requests_table.c.trace_id)).scalars())
    finally:
        engine.dispose()


def sqlite_integrity(db_url: str) -> str:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return conn.exec_driver_sql("PRAGMA integrity_check").scalar_one()
    finally:
        engine.dispose()


def crash_rounds(db_url: str, workdir: Path, rounds: int, batches_before_kill: int = 4) -> dict[str, int]:
    """Kill -9 the server `rounds` times mid-ingest, restarting it each time; after each
    restart every acknowledged span must be stored. Returns the figures."""
    ledger = Ledger()
    for _ in range(rounds):
        server = Server(db_url, workdir)
        server.wait_ready()
        missing = ledger.acked - stored(db_url)
        assert not missing, f"{len(missing)} acknowledged spans lost, e.g. {sorted(missing)[:2]}"
        with Senders(server, ledger):
            target = ledger.ok_exports + batches_before_kill
            while ledger.ok_exports < target and server.proc.poll() is None:
                time.sleep(0.01)
            server.kill()  # exports are in flight: the senders loop without pause
        if db_url.startswith("sqlite"):
            assert sqlite_integrity(db_url) == "ok"
    return {
        "kills": rounds,
        "acked_spans": len(ledger.acked),
        "ok_exports": ledger.ok_exports,
        "failed_exports": ledger.failed_exports,
        "ledger": ledger,
    }  # type: ignore[dict-item]
