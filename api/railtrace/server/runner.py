"""Running the service: `railtrace serve` and the in-process `Service` (tests, demo).

    with Service(settings) as svc:
        svc.http_url        # http://127.0.0.1:<port>  (OTLP/HTTP + REST API)
        svc.grpc_endpoint   # 127.0.0.1:<port>         (OTLP/gRPC)

Port 0 picks free ports. Uvicorn runs in a thread on a socket bound here, so the bound port
is known before anything connects.
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import socket
import sys
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI

from railtrace.scheduling.assembler import Pipeline
from railtrace.server.app import create_app
from railtrace.server.grpc_server import make_grpc_server
from railtrace.server.http_limits import bounded_protocol, http_limits
from railtrace.server.runtime import Runtime
from railtrace.server.security import exposure_warnings
from railtrace.settings import Settings

log = logging.getLogger(__name__)


class Service:
    """HTTP (OTLP/HTTP + API) and gRPC (OTLP) over one runtime, started and stopped together."""

    def __init__(self, settings: Settings, pipeline: Pipeline | None = None) -> None:
        self.settings = settings
        self._pipeline = pipeline
        self.runtime: Runtime | None = None
        self._uvicorn: uvicorn.Server | None = None
        self.app: FastAPI | None = None
        self._thread: threading.Thread | None = None
        self._grpc: Any = None
        self.http_port = 0
        self.grpc_port = 0

    @property
    def http_url(self) -> str:
        scheme = "https" if self.settings.tls_cert else "http"
        return f"{scheme}://{_url_host(self.settings.host)}:{self.http_port}"

    @property
    def grpc_endpoint(self) -> str:
        return f"{_url_host(self.settings.host)}:{self.grpc_port}"

    def start(self) -> Service:
        self.runtime = Runtime(self.settings, self._pipeline)
        try:
            self.runtime.start()
            sock = _listen(self.settings.host, self.settings.port)
            self.http_port = sock.getsockname()[1]
            self._grpc, self.grpc_port = make_grpc_server(
                self.runtime, self.settings.host, self.settings.grpc_port
            )
            app = self.app = create_app(self.settings, self.runtime)
            config = uvicorn.Config(
                app,
                log_level="warning",
                access_log=False,
                lifespan="on",
                # The OTLP receiver reads X-Forwarded-For itself, from `trusted_proxies` only
                # (railtrace.server.senders); uvicorn would trust 127.0.0.1 by default.
                proxy_headers=False,
                ssl_certfile=self.settings.tls_cert,
                ssl_keyfile=self.settings.tls_key,
                # The connection limit, the idle and head timeouts and the head size limits
                # are the protocol's own (railtrace.server.http_limits).
                http=bounded_protocol(http_limits(self.settings)),
                timeout_keep_alive=int(self.settings.idle_timeout_s) or 1,
            )
            self._uvicorn = uvicorn.Server(config)
            self._thread = threading.Thread(
                target=self._uvicorn.run, kwargs={"sockets": [sock]}, name="railtrace-http", daemon=True
            )
            self._thread.start()
            self._grpc.start()
            deadline = time.monotonic() + 30
            while not self._uvicorn.started:
                if not self._thread.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError("HTTP server did not start")
                time.sleep(0.01)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop accepting, finish in-flight exports (they are answered after commit), close.

        Each step is logged, so a stop that takes long shows which part it waits for. Queries
        are told first: a search or trace read ends at its next budget check (or is given up
        on, its daemon thread left behind), so none holds the HTTP server's stop."""
        if self.runtime is not None:
            self.runtime.queries.close()
        if self._grpc is not None:
            log.info("stopping: OTLP/gRPC")
            self._grpc.stop(grace=5).wait(10)
            self._grpc = None
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            log.info("stopping: HTTP")
            self._thread.join(timeout=15)
            self._thread = None
        self._uvicorn = None
        if self.runtime is not None:
            log.info("stopping: writer and assembly")
            self.runtime.stop()
            self.runtime = None
            log.info("stopped")

    def __enter__(self) -> Service:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen for HTTP on {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Command-line options over `RAILTRACE_*` environment variables over defaults."""
    overrides: dict[str, Any] = {}
    for arg, field in (
        ("db", "db"),
        ("topology", "topology"),
        ("host", "host"),
        ("port", "port"),
        ("grpc_port", "grpc_port"),
        ("quiet_period", "quiet_period_s"),
        ("assembly_processes", "assembly_processes"),
        ("retention_hours", "retention_hours"),
        ("ingest_token", "ingest_token"),
        ("api_token", "api_token"),
        ("tls_cert", "tls_cert"),
        ("tls_key", "tls_key"),
        ("cors_origin", "cors_origins"),
        ("trusted_proxy", "trusted_proxies"),
        ("trusted_collector", "trusted_collectors"),
        ("prometheus_url", "prometheus_url"),
    ):
        value = getattr(args, arg, None)
        if value is not None:
            overrides[field] = value
    return Settings(**overrides)


def serve_command(args: argparse.Namespace) -> int:
    """`railtrace serve`: run until SIGINT/SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Alembic narrates every start (context, DDL mode, each revision) at INFO; a start-up says
    # where the service is, and problems, nothing else.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    settings = settings_from_args(args)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        service = Service(settings).start()
    except Exception as exc:
        print(f"railtrace serve: {exc}", file=sys.stderr)
        return 2
    rt = service.runtime
    # What start-up built (modules, app, topology) lives as long as the process. Left in the
    # collector's oldest generation, every full collection walked it again and stalled an
    # API answer by ~50 ms now and then (docs/performance.md, section 3).
    gc.freeze()
    print(
        f"railtrace serving OTLP/HTTP + API on {service.http_url}, OTLP/gRPC on {service.grpc_endpoint}, "
        f"store {_safe_url(settings.db)}\n"
        f"web UI: {service.http_url}/",
        flush=True,
    )
    for warning in exposure_warnings(
        settings.host, settings.ingest_token, settings.api_token, bool(settings.tls_cert)
    ):
        log.warning(warning)
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    if rt is not None and rt.assembly_error:
        print(f"warning: {rt.assembly_error}", file=sys.stderr)
    if rt is not None and rt.topology_error:
        print(f"warning: {rt.topology_error}", file=sys.stderr)
    try:
        stop.wait()
    finally:
        service.stop()
    return 0


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
