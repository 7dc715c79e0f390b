"""The C accelerator of ingest (`railtrace.otlp._wirescan`) must build the very rows the Python
path builds, and must never crash on what a hostile sender can put on the wire.

Every comparison runs `rows_from_request` twice on the same call, with and without the
accelerator: on the scenario traces, on the benchmark's realistic calls, on generated requests
with hostile values, on mangled bytes, and on encodings the accelerator leaves to the Python path
(a repeated singular field, a request id too long for its short reading).
"""

from __future__ import annotations

import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from benchmarks.ingest.payload import export_calls
from railtrace.otlp import accelerators
from railtrace.otlp.content import KeyScan
from railtrace.otlp.decode import PayloadError, parse_protobuf
from railtrace.otlp.encode import key_value
from railtrace.server.security import content_filter
from railtrace.store.rows import RowBatch, rows_from_request
from tests.fixtures.otlp_fixtures import protobuf_body, scenario_names
from tests.reliability.otlp_strategies import export_requests, mangled

wirescan = accelerators.wirescan
needs_accelerator = pytest.mark.skipif(wirescan is None, reason="the C accelerator is not built")
T0 = 1_790_000_000 * 10**9


def _rows(batch: RowBatch) -> tuple[object, ...]:
    return (
        batch.chunks,
        sorted(batch.keys),
        batch.resources,
        batch.span_count,
        batch.rejected,
        batch.errors,
        batch.dropped_content_attributes,
    )


def _content_free(request: ExportTraceServiceRequest) -> bytes:
    """The generated request without content attributes: calls with content take the Python
    path whatever is built, so they would not test the accelerator."""
    content_filter(None).strip(request)
    return request.SerializeToString()


def _both(raw: bytes) -> tuple[tuple[object, ...], tuple[object, ...]]:
    # Parsed twice: the Python path strips content attributes from the message it is given.
    fast = rows_from_request(parse_protobuf(raw), raw, accelerated=True)
    plain = rows_from_request(parse_protobuf(raw), raw, accelerated=False)
    return _rows(fast), _rows(plain)


def test_the_accelerator_is_built_where_a_compiler_is() -> None:
    """A silently missing accelerator would halve ingest without any test failing."""
    if accelerators.load("_wirescan") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler here: the install took the pure-Python path")
    assert accelerators.load("_wirescan") is not None, "railtrace.otlp._wirescan failed to build"


def test_pure_python_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(accelerators.PURE_PYTHON_ENV, "1")
    assert accelerators.load("_wirescan") is None


@needs_accelerator
@pytest.mark.parametrize("name", scenario_names())
def test_scenario_traces_give_the_same_rows(name: str) -> None:
    fast, plain = _both(protobuf_body(name))
    assert fast == plain


@needs_accelerator
def test_benchmark_calls_give_the_same_rows() -> None:
    for raw in export_calls(4096, seed=7):
        fast, plain = _both(raw)
        assert fast == plain
        assert fast[3] == 512 and fast[1]  # every span counted, keys found


@needs_accelerator
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=export_requests())
def test_hostile_values_give_the_same_rows(request: ExportTraceServiceRequest) -> None:
    try:
        fast, plain = _both(_content_free(request))
    except PayloadError:
        return  # nested deeper than the protobuf library parses: rejected before either path
    assert fast == plain


@needs_accelerator
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), request=export_requests())
def test_mangled_bytes_give_the_same_rows_or_the_same_error(
    data: st.DataObject, request: ExportTraceServiceRequest
) -> None:
    raw = data.draw(mangled(_content_free(request)))
    try:
        fast, plain = _both(raw)
    except PayloadError:
        return  # not a request at all: the protobuf library rejects it before either path runs
    assert fast == plain


def _span_call(extra: bytes = b"", request_id: str = "req-0001") -> bytes:
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    s = ss.spans.add()
    s.trace_id = bytes(range(1, 17))
    s.span_id = bytes(range(1, 9))
    s.name = "prefill"
    s.start_time_unix_nano = T0
    s.end_time_unix_nano = T0 + 5
    s.attributes.append(key_value("gen_ai.request.id", request_id))
    raw = bytearray(req.SerializeToString())
    if extra:  # append fields to the one span, and fix up the three lengths that enclose it
        span = s.SerializeToString() + extra
        scope = b"\x12" + _varint(len(span)) + span
        resource = b"\x12" + _varint(len(scope)) + scope
        raw = bytearray(b"\x0a" + _varint(len(resource)) + resource)
    return bytes(raw)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


@needs_accelerator
def test_a_repeated_singular_field_is_left_to_the_protobuf_library() -> None:
    """Protobuf keeps the last of a repeated singular field; the accelerator declines such a
    span, and the rows still follow the protobuf library's reading."""
    other_trace = b"\x0a\x10" + bytes(range(101, 117))
    raw = _span_call(extra=other_trace)
    request = parse_protobuf(raw)
    assert request.resource_spans[0].scope_spans[0].spans[0].trace_id == bytes(range(101, 117))
    fast, plain = _both(raw)
    assert fast == plain
    assert fast[0][0][0] == bytes(range(101, 117)).hex()


@needs_accelerator
def test_a_long_request_id_takes_the_long_reading() -> None:
    fast, plain = _both(_span_call(request_id="r" * 300))
    assert fast == plain
    assert fast[1] == [("r" * 256, bytes(range(1, 17)).hex())]


@needs_accelerator
def test_a_wrong_wire_type_is_left_to_the_protobuf_library() -> None:
    start_as_varint = b"\x38\x05"  # field 7 (start time, fixed64) sent as a varint
    fast, plain = _both(_span_call(extra=start_as_varint))
    assert fast == plain


@needs_accelerator
def test_rows_need_the_call_they_were_parsed_from() -> None:
    """Bytes that disagree with the parsed message (a caller's mistake) are not trusted."""
    a, b = _span_call(request_id="req-aaaa"), _span_call(request_id="req-bbbb")
    two = ExportTraceServiceRequest.FromString(a + a)  # two resource spans
    assert wirescan.chunk_spans(b, [(1, 1), (2, 1)], (), 0, 2**63) is None
    assert rows_from_request(two, a + a).span_count == 1  # the same span twice in one call
    assert rows_from_request(two, b, accelerated=True).span_count == 1


@needs_accelerator
@settings(max_examples=500, deadline=None)
@given(
    needles=st.lists(st.binary(min_size=0, max_size=12), max_size=6),
    hay=st.binary(max_size=300),
    plant=st.integers(min_value=-1, max_value=5),
)
def test_contains_any_agrees_with_substring_search(needles: list[bytes], hay: bytes, plant: int) -> None:
    if 0 <= plant < len(needles):
        hay = hay[: len(hay) // 2] + needles[plant] + hay[len(hay) // 2 :]
    assert wirescan.contains_any(hay, tuple(needles)) == any(n in hay for n in needles)


@needs_accelerator
@settings(max_examples=200, deadline=None)
@given(hay=st.binary(max_size=2000))
def test_content_scan_agrees_with_and_without_the_accelerator(hay: bytes) -> None:
    scan = KeyScan([b"gen_ai.prompt", b"gen_ai.completion", b"llm.input_messages", b"ab"])
    assert scan(hay) == any(n in hay for n in scan.needles)


@needs_accelerator
def test_bad_arguments_raise_not_crash() -> None:
    with pytest.raises(TypeError):
        wirescan.contains_any(b"abc", ("a",))
    with pytest.raises(TypeError):
        wirescan.chunk_spans(b"", [], (b"",), 0, 1)
    with pytest.raises((TypeError, ValueError)):
        wirescan.chunk_spans(b"", [(1, -1)], (), 0, 1)
    assert wirescan.chunk_spans(b"\xff\xff\xff", [], (), 0, 1) is None
    assert wirescan.chunk_spans(b"", [], (), 0, 1) == ([], [], [], [], 0)
