"""A number no store can hold, sent as a span attribute, costs only itself.

A KV-transfer span's `bytes` sent as the double 1e300 is integral, so it once became a Python
int past 64 bits: the request's summary could be neither encoded as JSON nor stored, and every
page of requests stored with it failed, again at every assembly step. Now such a value is read
as absent, and the request and its neighbours are stored.
"""

from __future__ import annotations

from service_helpers import export_request, settings_for, trace_id
from sqlalchemy import select

from railtrace.ingest.assembler import Assembler, default_pipeline
from railtrace.ingest.writer import prepare
from railtrace.metrics import Metrics
from railtrace.otlp.encode import key_value as kv
from railtrace.store import Store, make_engine, migrate
from railtrace.store.schema import requests as requests_table
from railtrace.topology import TopologyHolder
from railtrace_tracing import semconv


def _with_kv_transfers(numbers: list[int], byte_values: list[object]) -> object:
    """`export_request(numbers)` plus a KV-transfer span under each decode engine span."""
    call = export_request(numbers)
    decode = next(
        rs for rs in call.resource_spans if rs.resource.attributes[0].value.string_value == "vllm-decode"
    )
    spans = decode.scope_spans[0].spans
    for engine_span, value in zip(list(spans), byte_values, strict=True):
        kv_span = spans.add()
        kv_span.trace_id = engine_span.trace_id
        kv_span.span_id = bytes(reversed(engine_span.span_id))
        kv_span.parent_span_id = engine_span.span_id
        kv_span.name = semconv.SPAN_KV_TRANSFER
        kv_span.start_time_unix_nano = engine_span.start_time_unix_nano + 1_000
        kv_span.end_time_unix_nano = engine_span.start_time_unix_nano + 2_000_000
        kv_span.attributes.extend(
            [kv(semconv.KV_BYTES, value), kv(semconv.KV_OPERATION, "read"), kv(semconv.KV_TRANSPORT, "rdma")]
        )
    return call


def test_a_kv_byte_count_past_64_bits_is_read_as_absent_and_nothing_else_is_lost(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    store = Store(engine)
    settings = settings_for(db_url, quiet_period_s=0.0)
    assembler = Assembler(store, settings, Metrics(), default_pipeline(settings, TopologyHolder([]).get))
    store.insert_batches([prepare(_with_kv_transfers([1, 2, 3], [1e300, 2**62, 3.0 * 2**20]))])
    assembler.run_once(now_ns=2**62)
    with engine.connect() as conn:
        rows = dict(conn.execute(select(requests_table.c.trace_id, requests_table.c.kv_bytes)).all())
    assert rows == {trace_id(1): None, trace_id(2): 2**62, trace_id(3): 3 * 2**20}
    summary = store.get_request(trace_id(1))
    assert summary is not None and summary["kv_transfer"]["bytes"] is None
    engine.dispose()
