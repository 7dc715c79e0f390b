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
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue

from benchmarks.common.payload import export_calls
from railtrace.otlp import accelerators
from railtrace.otlp.content import KeyScan, content_filter
from railtrace.otlp.decode import PayloadError, parse_protobuf
from railtrace.otlp.encode import key_value
from railtrace.otlp.export import prepare
from railtrace.otlp.rows import RowBatch, rows_from_bytes, rows_from_request
from tests.fixtures.otlp_fixtures import protobuf_body, scenario_names
from tests.reliability.otlp_strategies import export_requests, mangled, varint

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


def _both(raw: bytes) -> tuple[tuple[object, ...] | None, tuple[object, ...]]:
    """(accelerated rows, or None where the accelerator declines the call; Python rows)."""
    unparsed = rows_from_bytes(raw)
    plain = _rows(rows_from_request(parse_protobuf(raw), raw))
    return (None if unparsed is None else _rows(unparsed)), plain


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
    assert fast is None or fast == plain


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
        # Not a request at all: the protobuf library rejects it, so the accelerator must not
        # take it unparsed (its rows would hold spans that cannot be read back).
        assert rows_from_bytes(raw) is None
        return
    assert fast is None or fast == plain


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
        scope = b"\x12" + varint(len(span)) + span
        resource = b"\x12" + varint(len(scope)) + scope
        raw = bytearray(b"\x0a" + varint(len(resource)) + resource)
    return bytes(raw)


@needs_accelerator
def test_a_repeated_singular_field_is_left_to_the_protobuf_library() -> None:
    """Protobuf keeps the last of a repeated singular field; the accelerator declines such a
    span, and the rows still follow the protobuf library's reading."""
    other_trace = b"\x0a\x10" + bytes(range(101, 117))
    raw = _span_call(extra=other_trace)
    request = parse_protobuf(raw)
    assert request.resource_spans[0].scope_spans[0].spans[0].trace_id == bytes(range(101, 117))
    fast, plain = _both(raw)
    assert fast is None
    assert plain[0][0][0] == bytes(range(101, 117)).hex()


@needs_accelerator
def test_a_long_request_id_takes_the_long_reading() -> None:
    fast, plain = _both(_span_call(request_id="r" * 300))
    assert fast == plain
    assert fast[1] == [("r" * 256, bytes(range(1, 17)).hex())]


@needs_accelerator
def test_a_wrong_wire_type_is_left_to_the_protobuf_library() -> None:
    start_as_varint = b"\x38\x05"  # field 7 (start time, fixed64) sent as a varint
    fast, plain = _both(_span_call(extra=start_as_varint))
    assert fast is None and plain[3] == 1


@needs_accelerator
def test_span_counts_that_disagree_with_the_bytes_are_declined() -> None:
    one = _span_call(request_id="req-bbbb")
    assert wirescan.chunk_spans(one, [(1, 1), (2, 1)], (), 0, 2**63) is None
    assert wirescan.chunk_spans(one, [(1, 2)], (), 0, 2**63) is None


@needs_accelerator
def test_the_same_span_twice_in_one_call_counts_once() -> None:
    twice = _span_call() + _span_call()  # two resource spans holding the same span
    fast, plain = _both(twice)
    assert fast == plain and plain[3] == 1


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


@needs_accelerator
@pytest.mark.parametrize(
    "bad",
    [b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"ok\xe2\x82"],
    ids=["invalid byte", "overlong", "surrogate", "above U+10FFFF", "cut short"],
)
def test_a_string_the_protobuf_library_rejects_is_not_taken_unparsed(bad: bytes) -> None:
    name = b"\x2a" + varint(len(bad)) + bad  # a second span name, not UTF-8
    raw = _span_call(extra=name)
    assert rows_from_bytes(raw) is None
    with pytest.raises(PayloadError):
        parse_protobuf(raw)


@needs_accelerator
def test_nesting_deeper_than_the_check_follows_is_left_to_the_protobuf_library() -> None:
    value = AnyValue(string_value="leaf")
    for _ in range(40):  # 80 messages deep: past the accelerator's check, within the library's
        value = AnyValue(array_value=ArrayValue(values=[value]))
    kv = KeyValue(key="deep", value=value).SerializeToString()
    raw = _span_call(extra=b"\x4a" + varint(len(kv)) + kv)
    fast, plain = _both(raw)
    assert fast is None and plain[3] == 1


@needs_accelerator
def test_a_resource_after_its_scopes_and_a_repeated_resource() -> None:
    """Field order is free on the wire; a repeated message field is merged by the library."""
    req = ExportTraceServiceRequest.FromString(_span_call())
    rs = req.resource_spans[0]
    rs.resource.attributes.append(key_value("service.name", "decode"))
    resource = b"\x0a" + varint(rs.resource.ByteSize()) + rs.resource.SerializeToString()
    scopes = b"".join(b"\x12" + varint(ss.ByteSize()) + ss.SerializeToString() for ss in rs.scope_spans)
    after = scopes + resource
    fast, plain = _both(b"\x0a" + varint(len(after)) + after)
    assert fast == plain and b"decode" in next(iter(plain[2].values()))
    doubled = resource + scopes + resource
    fast, plain = _both(b"\x0a" + varint(len(doubled)) + doubled)
    assert fast is None and b"decode" in next(iter(plain[2].values()))


@needs_accelerator
def test_prepare_takes_the_call_unparsed_and_still_answers_bad_bytes_with_a_payload_error() -> None:
    raw = export_calls(512, seed=3)[0]
    assert rows_from_bytes(raw) is not None
    assert _rows(prepare(raw)) == _rows(rows_from_request(parse_protobuf(raw), raw))
    with pytest.raises(PayloadError):
        prepare(b"\x0a\x05\x12\x03\x12\x01\xff")  # a span field cut short


_FLIP_BASE = export_calls(64, spans_per_call=64, seed=11)[0]


@needs_accelerator
@settings(max_examples=300, deadline=None)
@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=3))
def test_byte_flips_are_taken_unparsed_only_when_the_protobuf_library_parses_them(
    flips: list[tuple[int, int]],
) -> None:
    raw = bytearray(_FLIP_BASE)
    for at, value in flips:
        raw[at % len(raw)] = value
    unparsed = rows_from_bytes(bytes(raw))
    try:
        request = parse_protobuf(bytes(raw))
    except PayloadError:
        assert unparsed is None
        return
    if unparsed is not None:
        assert _rows(unparsed) == _rows(rows_from_request(request, bytes(raw)))


@needs_accelerator
def test_a_resource_without_scopes_is_left_to_the_protobuf_library() -> None:
    """Nothing else would parse (and so check) such a resource: a corrupt one must get a 400."""
    corrupt = b"\x30\xc2\x80"  # Resource field 6 as a varint cut short
    raw = b"\x0a\x05\x0a\x03" + corrupt
    assert rows_from_bytes(raw) is None
    with pytest.raises(PayloadError):
        prepare(raw)
    fine = b"\x0a\x02\x0a\x00"  # an empty resource, no scopes
    assert rows_from_bytes(fine) is None and prepare(fine).span_count == 0
