"""The scale benchmark's bulk load builds the database a running server builds from the same calls.

`benchmarks/scale/bulk.py` puts export calls through the receiver's `prepare` and the writer's
`Store.insert_batches` in worker processes and assembles with the real `Assembler.run_once` in
two processes sharing the database. Here the simulator's traffic is loaded once through
`railtrace serve`'s OTLP/HTTP receiver and once through that bulk path, into two fresh
databases of the same kind, and every stored row is compared: request summaries and flags,
span chunks (all columns but the commit's receive time), request keys and trace states.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from benchmarks.scale.bulk import BulkLoad, CopyPlan, dirty_count
from benchmarks.scale.traffic import _retag, capture, copy_calls
from railtrace.server.runner import Service
from railtrace.settings import Settings

QUIET_S = 1.0
REQUESTS = 30


@pytest.fixture
def bulk_url(db_url: str, new_database: Callable[[str], str]) -> str:
    """A second fresh database of the same kind as `db_url`."""
    return new_database("sqlite" if db_url.startswith("sqlite") else "postgresql")


def snapshot(url: str) -> dict[str, list[Any]]:
    engine = create_engine(url)
    queries = {
        "requests": "SELECT trace_id, request_id, start_ns, path_class, flag_names, summary FROM requests"
        " ORDER BY trace_id",
        "request_flags": "SELECT flag, start_ns, trace_id FROM request_flags ORDER BY 1, 2, 3",
        "span_chunks": "SELECT trace_id, chunk_id, span_count, body FROM span_chunks ORDER BY 1, 2",
        "trace_keys": "SELECT request_key, trace_id FROM trace_keys ORDER BY 1, 2",
        "traces": "SELECT trace_id, span_count, has_root, dirty, late_spans, request_trace_id FROM traces"
        " ORDER BY trace_id",
        "resources": "SELECT id, attributes FROM resources ORDER BY id",
    }
    try:
        with engine.connect() as conn:
            return {
                name: [
                    tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                    for row in conn.execute(text(q))
                ]
                for name, q in queries.items()
            }
    finally:
        engine.dispose()


def test_bulk_load_builds_the_database_the_server_builds(db_url: str, bulk_url: str, tmp_path: Path) -> None:
    topo = tmp_path / "topology"
    calls, rids, length_ns = capture(topo, REQUESTS, seed=3)
    plan = CopyPlan(calls, lambda value, tag: _retag(value, rids, tag))
    shift = time.time_ns() - length_ns - 10**9
    copy = plan.copy(0, shift)
    assert copy == copy_calls(calls, rids, 0, shift)  # byte patching is the replay's copy, exactly

    loader = BulkLoad(
        bulk_url, topo, plan, workers=1, assemblers=2, quiet_period_s=QUIET_S, start_method="fork"
    )
    try:
        loader.load([(0, shift)], 1, "bulk")
    finally:
        loader.close()

    settings = Settings(
        db=db_url, topology=[str(topo)], port=0, grpc_port=0, quiet_period_s=QUIET_S, assembly_interval_s=0.05
    )
    with Service(settings) as svc:
        for raw in copy:
            r = httpx.post(
                svc.http_url + "/v1/traces",
                content=raw,
                headers={"content-type": "application/x-protobuf"},
                timeout=60,
            )
            assert r.status_code == 200, r.text
        engine = create_engine(db_url)
        deadline = time.monotonic() + 60
        while dirty_count(engine) and time.monotonic() < deadline:
            time.sleep(0.1)
        engine.dispose()

    served, bulk = snapshot(db_url), snapshot(bulk_url)
    assert len(served["requests"]) >= REQUESTS
    assert sum(row[2] for row in served["span_chunks"]) == plan.spans
    assert not any(t[3] for t in served["traces"])  # nothing left waiting for assembly
    for table in served:
        assert bulk[table] == served[table], table
