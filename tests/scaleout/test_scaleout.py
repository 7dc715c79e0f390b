"""Scale-out: replicas fed by traceID partitioning share one PostgreSQL and agree with one replica.

The simulator's traffic (real shims, real OTel SDK) is captured once, encoded with the
official OTLP encoder and sent twice: whole to a single replica, and split by the collector
`loadbalancing` exporter's traceID ring (`ring.py`) across replicas that share one database.
The v0.8 generation breaks trace context at the sidecar, so one request's hops arrive as
separate traces -- usually on different replicas -- and must still be stitched into one
request. Both runs must end with exactly the same request rows and verdicts, no duplicates,
none lost, and the same verdict counts in /metrics (summed over replicas).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from sqlalchemy import create_engine, func, select, text

from railtrace.server.runner import Service
from railtrace.settings import Settings
from railtrace.simulator import Emitter, Processes, build_fleet, resolve, simulate
from railtrace.store import Store, make_engine, migrate
from railtrace.store.schema import requests as requests_table
from railtrace.store.schema import traces as traces_table
from tests.fixtures.otlp_fixtures import SinkExporter
from tests.scaleout.ring import TraceIdRing

REQUESTS = 40
SEED = 3
CHUNK = 200  # spans per collector batch
# Longer than sending the whole traffic takes, so that no request is assembled from part of
# its hops: /metrics counts a request at its first assembly, and a hop that arrives after that
# (one replica or many alike) can count it twice. Rows and the API are right either way.
QUIET_S = 4.0


def simulated_traffic(topo_dir: Path, generation: str, seed: int) -> list[ReadableSpan]:
    """Spans of the simulator's default scenario mix, in the order the processes exported them."""
    scenarios = resolve(None)
    fleet = build_fleet("a3-ultra", scenarios, seed)
    fleet.write(topo_dir)
    runs = simulate(fleet, scenarios, REQUESTS, seed)
    sink: list[ReadableSpan] = []
    lock = threading.Lock()
    procs = Processes(lambda: SinkExporter(sink, lock), seed)
    base_ns = time.time_ns() - int((max(r.end for r in runs) + 1.0) * 1e9)
    emitter = Emitter(fleet, procs, generation, base_ns)
    for r in runs:
        emitter.emit(r)
    procs.flush()
    procs.shutdown()
    return sink


def send(urls: list[str], spans: list[ReadableSpan]) -> dict[str, int]:
    """Post in collector-sized batches; with several URLs each batch is split by traceID."""
    ring = TraceIdRing(urls)
    sent = dict.fromkeys(urls, 0)
    for i in range(0, len(spans), CHUNK):
        parts: dict[str, list[ReadableSpan]] = {}
        for s in spans[i : i + CHUNK]:
            parts.setdefault(ring.endpoint_for(s.context.trace_id.to_bytes(16, "big")), []).append(s)
        for url, part in parts.items():
            r = httpx.post(
                url + "/v1/traces",
                content=encode_spans(part).SerializeToString(),
                headers={"content-type": "application/x-protobuf"},
                timeout=60,
            )
            assert r.status_code == 200, r.text
            sent[url] += len(part)
    return sent


def settled(url: str, spans: int, quiet_s: float) -> list[dict[str, Any]]:
    """The request rows once every span is stored, nothing is dirty, and nothing changed for
    a while (a stitched request may be re-assembled once its last hop is quiet)."""
    engine = create_engine(url)
    try:
        deadline = time.monotonic() + 120
        last: list[dict[str, Any]] | None = None
        stable_since = time.monotonic()
        while time.monotonic() < deadline:
            stored = Store(engine).count_spans()
            with engine.connect() as conn:
                dirty = conn.execute(
                    select(func.count()).select_from(traces_table).where(traces_table.c.dirty.is_(True))
                ).scalar_one()
                rows = [
                    orjson.loads(r[0])
                    for r in conn.execute(
                        select(requests_table.c.summary).order_by(requests_table.c.trace_id)
                    )
                ]
            if stored == spans and dirty == 0 and rows == last:
                if time.monotonic() - stable_since > quiet_s * 2 + 1:
                    return rows
            else:
                stable_since = time.monotonic()
            last = rows
            time.sleep(0.2)
        raise AssertionError("requests did not settle")
    finally:
        engine.dispose()


def verdict_counts(urls: list[str]) -> dict[tuple[str, str], float]:
    """llm_d_tracing_requests_total and _flags_total samples summed over the replicas."""
    out: dict[tuple[str, str], float] = {}
    for url in urls:
        for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(("llm_d_tracing_requests_total{", "llm_d_tracing_flags_total{")):
                series, value = line.rsplit(" ", 1)
                name, labels = series.split("{", 1)
                out[(name, labels)] = out.get((name, labels), 0.0) + float(value)
    return out


@pytest.fixture
def pg_url(new_database: Callable[[str], str]) -> str:
    return new_database("postgresql")


@pytest.fixture
def pg_url_b(new_database: Callable[[str], str]) -> str:
    return new_database("postgresql")


def _settings(db: str, topo: Path) -> Settings:
    return Settings(
        db=db, topology=[str(topo)], port=0, grpc_port=0, quiet_period_s=QUIET_S, assembly_interval_s=0.05
    )


@pytest.mark.parametrize(("generation", "replicas"), [("v0.8", 2), ("v0.8", 3), ("current", 2)])
def test_replicas_sharing_postgresql_give_the_verdicts_of_one(
    generation: str, replicas: int, pg_url: str, pg_url_b: str, tmp_path: Path
) -> None:
    topo = tmp_path / "topology"
    spans = simulated_traffic(topo, generation, SEED)
    n = len({(s.context.trace_id, s.context.span_id) for s in spans})

    with Service(_settings(pg_url, topo)) as one:
        send([one.http_url], spans)
        single = settled(pg_url, n, QUIET_S)
        single_counts = verdict_counts([one.http_url])

    services = [Service(_settings(pg_url_b, topo)) for _ in range(replicas)]
    threads = [threading.Thread(target=s.start) for s in services]  # concurrent start: migrations race
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert all(s.runtime is not None and s.runtime.started for s in services)
        urls = [s.http_url for s in services]
        sent = send(urls, spans)
        assert sum(1 for v in sent.values() if v) >= 2, "the ring must spread the traffic"
        shared = settled(pg_url_b, n, QUIET_S)
        shared_counts = verdict_counts(urls)
    finally:
        for s in services:
            s.stop()

    assert len(single) >= REQUESTS  # every simulated request assembled (none lost)
    ids = [r["trace_id"] for r in shared]
    assert len(ids) == len(set(ids))  # no duplicates
    request_ids = [r["request_id"] for r in shared]
    assert len(request_ids) == len(set(request_ids))
    if generation == "v0.8":  # hops in separate traces, joined across replicas
        assert all(len(r.get("trace_ids") or []) > 1 for r in shared)
    assert shared == single
    assert shared_counts == single_counts


def test_concurrent_migrations_serialise(pg_url: str) -> None:
    """Replicas starting together on an empty database: one migrates, the others wait, none fails."""
    errors: list[BaseException] = []

    def run() -> None:
        engine = make_engine(pg_url)
        try:
            migrate(engine)
        except BaseException as exc:
            errors.append(exc)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    engine = create_engine(pg_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar_one() == 1
    engine.dispose()
