"""A value no store can hold, sent in a span, costs only itself.

- A KV-transfer span's `bytes` sent as the double 1e300 is integral, so it once became a Python
  int past 64 bits: the request's summary could be neither encoded as JSON nor stored, and every
  page of requests stored with it failed, again at every assembly step. Such a value is now
  read as absent.
- PostgreSQL's text cannot hold NUL: a request id with one in it failed the whole ingest commit
  it came in (every export batched with it, at every retry), and a pod name with one failed its
  page of requests. Such an id is no request key (`normalize_request_id`), so it stitches
  nothing, and text columns hold U+FFFD in its place.
"""

from __future__ import annotations

from sqlalchemy import select

from railtrace.metrics import Metrics
from railtrace.otlp.encode import key_value as kv
from railtrace.otlp.export import prepare
from railtrace.scheduling.assembler import Assembler, default_pipeline
from railtrace.store import Store
from railtrace.store.schema import requests as requests_table
from railtrace.topology import TopologyHolder
from railtrace_tracing import semconv
from tests.service_helpers import export_request, settings_for, trace_id


def _assembler(store: Store, db_url: str) -> Assembler:
    """An assembler with no quiet period: a test's `run_once` stores whatever has arrived."""
    settings = settings_for(db_url, quiet_period_s=0.0)
    return Assembler(store, settings, Metrics(), default_pipeline(settings, TopologyHolder([]).get))


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


def test_a_kv_byte_count_past_64_bits_is_read_as_absent_and_nothing_else_is_lost(
    store: Store, db_url: str
) -> None:
    assembler = _assembler(store, db_url)
    store.insert_batches([prepare(_with_kv_transfers([1, 2, 3], [1e300, 2**62, 3.0 * 2**20]))])
    assembler.run_once(now_ns=2**62)
    with store.engine.connect() as conn:
        rows = dict(conn.execute(select(requests_table.c.trace_id, requests_table.c.kv_bytes)).all())
    assert rows == {trace_id(1): None, trace_id(2): 2**62, trace_id(3): 3 * 2**20}
    summary = store.get_request(trace_id(1))
    assert summary is not None and summary["kv_transfer"]["bytes"] is None


def test_a_page_mixing_integer_and_float_times_is_stored(store: Store) -> None:
    """PostgreSQL takes a page's values of a column as one array of one Python type: a TTFT
    that is an int among floats is stored as a float, not a failure of the whole page."""
    from railtrace.model import RequestSummary, rfc3339

    start = rfc3339(1_790_000_000 * 10**9)
    summaries = [
        RequestSummary(
            trace_id=trace_id(n),
            request_id=f"req-{n}",
            model="m",
            start=start,
            ttft_s=t,
            e2e_s=e,
            breakdown_s={},
            prefill={},
            decode={},
            kv_transfer=None,
            flags=[],
        )
        for n, t, e in ((1, 1, 2.5), (2, 0.25, 3), (3, None, 1.0))
    ]
    store.save_assembly(summaries, {}, (), 1)
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(requests_table.c.trace_id, requests_table.c.ttft_s, requests_table.c.e2e_s)
        ).all()
    assert sorted(rows) == [(trace_id(1), 1.0, 2.5), (trace_id(2), 0.25, 3.0), (trace_id(3), None, 1.0)]


def test_nul_in_request_ids_and_names_costs_nothing_else(store: Store, db_url: str) -> None:
    assembler = _assembler(store, db_url)
    hostile = export_request([1])
    for rs in hostile.resource_spans:
        for at in rs.resource.attributes:
            if at.key == "k8s.pod.name":
                at.value.string_value += "\x00x"
        for sp in rs.scope_spans[0].spans:
            for at in sp.attributes:
                if at.key in ("llm_d.pd_proxy.request_id", "gen_ai.request.id"):
                    at.value.string_value = "req\x00" + at.value.string_value
    # One group commit: the hostile export and a good one; both acknowledged, both assembled.
    result = store.insert_batches([prepare(hostile), prepare(export_request([2]))])
    assert result.inserted == 16
    assembler.run_once(now_ns=2**62)
    hostile_summary, good = store.get_request(trace_id(1)), store.get_request(trace_id(2))
    assert good is not None and good["decode"]["pod"] == "decode-0"
    assert hostile_summary is not None and hostile_summary["decode"]["pod"] == "decode-0\x00x"
    with store.engine.connect() as conn:
        pods = dict(conn.execute(select(requests_table.c.trace_id, requests_table.c.decode_pod)).all())
    assert pods == {trace_id(1): "decode-0\ufffdx", trace_id(2): "decode-0"}
