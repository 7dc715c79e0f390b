"""Everything one service instance owns, built from one `Settings` and injected everywhere.

The FastAPI app, the gRPC server and the tests reach the store, writer, metrics and topology
through this object (held on `app.state.runtime`), never through module globals.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import Engine

from railtrace.ingest import BulkWriter
from railtrace.ingest.assembler import Assembler, Pipeline, default_pipeline
from railtrace.ingest.workers import AssemblyWorkers, assembly_process_count
from railtrace.metrics import Metrics
from railtrace.server.security import content_filter
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
        self.metrics = Metrics()
        self.content_filter = content_filter(settings.drop_attributes)
        self.trusted_proxies = trusted_networks(settings.trusted_proxies)
        self.engine = make_engine(settings.db)
        self.store = Store(self.engine)
        self.writer = BulkWriter(
            self.store,
            batch_spans=settings.write_batch_spans,
            max_pending_spans=settings.max_pending_spans,
            on_commit=self._committed,
            on_depth=self.metrics[semconv.M_INGEST_QUEUE].set,
        )
        self.topology_holder: Any = None
        self.topology_error: str | None = None
        self._live_topology: Any = None
        self._pipeline = pipeline
        self.assembler: Assembler | None = None
        self._assembly_engine: Engine | None = None
        self.assembly_workers: AssemblyWorkers | None = None
        self.assembly_error: str | None = None
        self._contract_cache: Any = None
        self.started = False

    def _committed(self, result: InsertResult) -> None:
        if result.duplicates:
            self.metrics[semconv.M_DUPLICATE_SPANS].inc(result.duplicates)

    def _load_topology(self) -> None:
        try:
            from railtrace.topology import open_topology
        except ImportError as exc:
            self.topology_error = f"topology model unavailable: {exc}"
            log.warning(self.topology_error)
            return
        # Raises TopologyError on unreadable input.
        self.topology_holder, self._live_topology = open_topology(list(self.settings.topology))

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
        self.started = True
        return self

    def stop(self) -> None:
        """Commit what is queued, stop the loops, release the database."""
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
