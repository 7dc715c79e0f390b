"""Everything one service instance owns, built from one `Settings` and injected everywhere.

The FastAPI app, the gRPC server and the tests reach the store, writer, metrics and topology
through this object (held on `app.state.runtime`), never through module globals.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import Any

from sqlalchemy import Engine

from railtrace.ingest import BulkWriter, ExportAcceptor
from railtrace.metrics import Metrics, TopologyLabels, metric_limits
from railtrace.otlp.content import content_filter
from railtrace.query.budget import QueryGate
from railtrace.scheduling.assembler import Assembler, Pipeline, default_pipeline
from railtrace.scheduling.workers import AssemblyWorkers, assembly_process_count
from railtrace.server.sampling import SamplingEstimator
from railtrace.server.senders import trusted_networks
from railtrace.settings import Settings
from railtrace.store import InsertResult, Store, make_engine, migrate
from railtrace_tracing import semconv

log = logging.getLogger(__name__)


class TopologyUnavailable(RuntimeError):
    """The topology part is not installed or could not be loaded."""


class Runtime:
    """Engine, store, writer, assembler, metrics and topology of one service."""

    def __init__(self, settings: Settings, pipeline: Pipeline | None = None) -> None:
        self.settings = settings
        self.topology_holder: Any = None
        self.metrics = Metrics(limits=metric_limits(settings, TopologyLabels(self._current_topology)))
        self.content_filter = content_filter(settings.drop_attributes)
        self.trusted_proxies = trusted_networks(settings.trusted_proxies)
        self.trusted_collectors = trusted_networks(settings.trusted_collectors)
        self.engine = make_engine(settings.db)
        self.store = Store(self.engine, max_spans_per_trace=settings.max_spans_per_trace)
        self.writer = BulkWriter(
            self.store,
            batch_spans=settings.write_batch_spans,
            max_pending_spans=settings.max_pending_spans,
            on_commit=self._committed,
            on_depth=self.metrics[semconv.M_INGEST_QUEUE].set,
            retry_max_s=settings.write_retry_max_s,
        )
        # The traced share (docs/deploy.md, "Sampling"): thresholds read at ingest, Prometheus
        # asked by a thread of its own.
        self.sampling = SamplingEstimator(settings, self.count_assembled, self.metrics)
        self.exports = ExportAcceptor(
            self.writer,
            self.content_filter,
            self.metrics,
            max_pending_spans=settings.max_pending_spans,
            max_spans_per_trace=settings.max_spans_per_trace,
            parse_inline_max_bytes=settings.parse_inline_max_bytes,
            observe=self.sampling.observe,
        )
        # Searches and trace reads: their turns, budgets and stop (railtrace.query.budget).
        self.queries = QueryGate(settings.query_concurrency, settings.query_timeout_s)
        self.topology_error: str | None = None
        self._live_topology: Any = None
        self._pipeline = pipeline
        self.assembler: Assembler | None = None
        self._assembly_engine: Engine | None = None
        self.assembly_workers: AssemblyWorkers | None = None
        self.assembly_error: str | None = None
        self._contract_cache: Any = None
        self._ping_lock = threading.Lock()
        self._ping: Future[None] | None = None
        self._ping_started = 0.0
        self.started = False

    def ping_database(self, wait_s: float = 2.0) -> str | None:
        """None if the database answered a ping within `wait_s`, else the problem.

        At most one ping is under way: a server that stops answering without closing the
        connection (packets dropped) would otherwise hold one worker thread per probe until
        none was left for the API or for /healthz."""
        with self._ping_lock:
            if self._ping is None or self._ping.done():
                self._ping = Future()
                self._ping_started = time.monotonic()
                threading.Thread(target=self._run_ping, args=(self._ping,), daemon=True).start()
            ping, started = self._ping, self._ping_started
        try:
            ping.result(timeout=wait_s)
        except TimeoutError:
            return f"database: no answer for {time.monotonic() - started:.0f}s"
        except Exception as exc:
            return f"database: {type(exc).__name__}"
        return None

    def _run_ping(self, ping: Future[None]) -> None:
        try:
            self.store.ping()
        except Exception as exc:
            ping.set_exception(exc)
        else:
            ping.set_result(None)

    def liveness_problems(self) -> list[str]:
        """Why the process should be restarted: the writer thread is gone, database writes
        have failed for longer than `write_failure_restart_s`, or one write has not returned
        for that long (a server that drops packets). A restart may fix what retrying did not:
        a wedged driver or connection, a stale DNS answer, a connection pool in a bad state."""
        if not self.started:
            return []
        problems = []
        if not self.writer.alive:
            problems.append("writer: not running")
        limit = self.settings.write_failure_restart_s
        failing = self.writer.failing_for
        if limit and self.writer.refusing and failing > limit:
            problems.append(f"writer: database writes failing for {failing:.0f}s (limit {limit:g}s)")
        stuck = self.writer.stuck_for
        if limit and stuck > limit:
            problems.append(f"writer: a database write has not returned for {stuck:.0f}s (limit {limit:g}s)")
        return problems

    def _committed(self, result: InsertResult) -> None:
        if result.duplicates:
            self.metrics[semconv.M_DUPLICATE_SPANS].inc(result.duplicates)
        if result.dropped:
            self.metrics[semconv.M_TRACE_SPAN_LIMIT_DROPPED].inc(result.dropped)
            self.metrics[semconv.M_SPANS_REJECTED].labels(semconv.REJECT_TRACE_SPAN_LIMIT).inc(result.dropped)

    def count_assembled(self, since_ns: int, until_ns: int) -> int:
        """Requests assembled that started in [since, until): the traced side of the share."""
        return sum(int(g["requests"]) for g in self.store.stats("coverage", since_ns, until_ns))

    def _load_topology(self) -> None:
        try:
            from railtrace.topology import open_topology
        except ImportError as exc:
            self.topology_error = f"topology model unavailable: {exc}"
            log.warning(self.topology_error)
            return
        # Raises TopologyError on unreadable input.
        self.topology_holder, self._live_topology = open_topology(list(self.settings.topology))

    def _current_topology(self) -> Any:
        """The topology now, or None before it is loaded (metric label bounds ask early)."""
        holder = self.topology_holder
        return holder.get() if holder is not None else None

    def topology(self) -> Any:
        if self.topology_holder is None:
            raise TopologyUnavailable(self.topology_error or "no topology")
        return self.topology_holder.get()

    def contract_report(self) -> Any:
        """The contract audit shared by the REST route and the /metrics gauge (cached briefly)."""
        from railtrace.contract.online import ContractCache

        topology = self.topology()
        if self._contract_cache is None:
            self._contract_cache = ContractCache()
        return self._contract_cache.get(topology, self.store)

    def refresh_contract_gauge(self) -> None:
        """Set one gauge per obligation and status; a scrape never fails because of the audit."""
        from railtrace.contract.report import contract_gauges

        try:
            report = self.contract_report()
        except Exception as exc:  # no topology yet, or a store hiccup: keep the last values
            log.debug("contract gauge not refreshed: %s", exc)
            return
        gauge = self.metrics[semconv.M_CONTRACT]
        for (obligation, status), pods in contract_gauges(report).items():
            gauge.labels(obligation, status).set(pods)

    def start(self) -> Runtime:
        """Migrate, load the topology, start the writer and the assembler loop."""
        migrate(self.engine)
        self._load_topology()
        self.writer.start()
        pipeline = self._pipeline
        if pipeline is None and self.topology_holder is not None:
            processes = assembly_process_count(self.settings.assembly_processes)
            if processes:
                log.info(
                    "assembling in %d child processes (assembly_processes=%s)",
                    processes,
                    self.settings.assembly_processes,
                )
                self.assembly_workers = AssemblyWorkers(self.settings, self.metrics, processes).start()
            else:
                try:
                    pipeline = default_pipeline(self.settings, self.topology)
                except ImportError as exc:
                    self.assembly_error = f"assembly unavailable: {exc}"
                    log.warning(self.assembly_error)
        if pipeline is not None:
            # Its own engine: assembly's commits need not wait for the disk (see `make_engine`).
            self._assembly_engine = make_engine(self.settings.db, derived_only=True)
            self.assembler = Assembler(
                Store(self._assembly_engine),
                self.settings,
                self.metrics,
                pipeline,
                busy=lambda: self.writer.pending > 0,
            )
            self.assembler.start()
        self.sampling.start()
        self.started = True
        return self

    def stop(self) -> None:
        """Commit what is queued, stop the loops, release the database."""
        self.queries.close()
        self.sampling.stop()
        if self._live_topology is not None:
            self._live_topology.stop()
        if self.assembler:
            self.assembler.stop()
        if self.assembly_workers:
            self.assembly_workers.stop()
        self.writer.stop()
        if self._assembly_engine is not None:
            self._assembly_engine.dispose()
            self._assembly_engine = None
        self.engine.dispose()
        self.started = False

    def __enter__(self) -> Runtime:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
