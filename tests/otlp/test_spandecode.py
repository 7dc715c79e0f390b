"""The C reader of stored spans (`railtrace.otlp._spandecode`) gives exactly what the upb path
(`PbSpan.FromString` + `span_from_pb`) gives.

Equal means equal to the last detail: the same types (a bool is not an int), the same float
bits (NaN included), the same dict key order, the same bounds on strings, arrays, nesting,
attribute and event counts. Checked on every span of every scenario fixture, of the
simulator's traffic in every generation and of the ingest benchmark's payload, as ingest
stores them; on generated spans with every kind of value and every bound crossed; on encodings
protobuf would merge (fields repeated, oneof members replaced); and on hostile bytes, where
the outcome (the span, or the exception type) must be the same.
"""

from __future__ import annotations

import dataclasses
import math
import random
import shutil
import struct
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.sdk.trace import ReadableSpan

from benchmarks.common.payload import export_calls
from railtrace.model import Span
from railtrace.normalize import normalize_span
from railtrace.otlp import spans as stored_spans
from railtrace.otlp.accelerators import PURE_PYTHON_ENV
from railtrace.otlp.decode import DEFAULT_DROP
from railtrace.otlp.export import prepare
from railtrace.otlp.rows import RECORD_HEADER, chunk_records
from railtrace.simulator import GENERATIONS, Emitter, Processes, build_fleet, resolve, simulate
from railtrace.store import Store, make_engine, migrate
from tests.fixtures.otlp_fixtures import SinkExporter, scenario_names, split_protobuf_bodies
from tests.reliability.otlp_strategies import array_value, kvlist_value, varint

ROOT = Path(__file__).resolve().parents[2]

needs_c = pytest.mark.skipif(
    not stored_spans.c_reader_available(), reason="railtrace.otlp._spandecode is not built"
)

TID = "0af7651916cd43dd8448eb211c80319c"
RESOURCE = {"resource": {"service.name": "vllm-decode", "k8s.pod.name": "decode-0"}, "scope": "vllm"}
DROP_KEYS = sorted(DEFAULT_DROP)


def canon(x: Any) -> Any:
    """A value with its types and float bits spelt out, so that == is exact (NaN == NaN,
    True != 1, 0.0 != -0.0, {"a": 1, "b": 2} != {"b": 2, "a": 1})."""
    if isinstance(x, Span):
        return ("Span", tuple((f.name, canon(getattr(x, f.name))) for f in dataclasses.fields(Span)))
    if type(x) is float:
        return ("float", struct.pack("<d", x))
    if isinstance(x, dict):
        return ("dict", tuple((canon(k), canon(v)) for k, v in x.items()))
    if isinstance(x, list):
        return ("list", tuple(canon(v) for v in x))
    return (type(x).__name__, x)


def outcome(read: Callable[..., Span], encoding: bytes) -> Any:
    """The span read, or the type of the exception raised."""
    try:
        return ("span", canon(read(TID, encoding, RESOURCE)))
    except Exception as exc:
        return ("raised", type(exc))


def reader(accelerated: bool, normalize: bool) -> Callable[..., Span]:
    read = stored_spans.span_reader(accelerated=accelerated)
    return (lambda *args: normalize_span(read(*args))) if normalize else read


def assert_same(encoding: bytes, normalize: bool = False) -> Any:
    """The C path (with its fallback) gives what the upb path gives; returns that outcome."""
    expected = outcome(reader(False, normalize), encoding)
    got = outcome(reader(True, normalize), encoding)
    assert got == expected
    return expected


def stored_encodings(calls: Sequence[bytes]) -> list[bytes]:
    """Every span encoding as ingest stores it (records of the chunk rows)."""
    out = []
    for call in calls:
        for chunk in prepare(call).chunks:
            out.extend(enc for _rid, enc in chunk_records(chunk[4]))
    return out


def simulator_calls(generation: str, requests: int = 12, seed: int = 5) -> list[bytes]:
    """The simulator's default scenario mix through the real shims, as OTLP export calls."""
    scenarios = resolve(None)
    fleet = build_fleet("a3-ultra", scenarios, seed)
    runs = simulate(fleet, scenarios, requests, seed)
    sink: list[ReadableSpan] = []
    procs = Processes(lambda: SinkExporter(sink, threading.Lock()), seed)
    emitter = Emitter(fleet, procs, generation, 1_790_000_000 * 10**9)
    for r in runs:
        emitter.emit(r)
    procs.flush()
    procs.shutdown()
    return [encode_spans(sink[i : i + 200]).SerializeToString() for i in range(0, len(sink), 200)]


# -- the C reader is there ---------------------------------------------------------------------


def test_c_reader_is_built_and_bounds_spans_as_the_python_code() -> None:
    """A missing accelerator must not go unnoticed: skipped only when it cannot be built here."""
    if stored_spans._spandecode is None:
        source = ROOT / "api" / "railtrace" / "otlp" / "_spandecode.c"
        cc = (sysconfig.get_config_var("CC") or "cc").split()
        if shutil.which(cc[0]) is None:
            pytest.skip(f"no C compiler ({cc[0]}): stored spans are read through upb only")
        built = subprocess.run(
            [*cc, "-fsyntax-only", f"-I{sysconfig.get_paths()['include']}", str(source)],
            capture_output=True,
            text=True,
        )
        if built.returncode != 0:
            pytest.skip(f"railtrace.otlp._spandecode does not compile here: {built.stderr[-500:]}")
        pytest.fail("railtrace.otlp._spandecode compiles here but is not built: run `pip install -e ./api`")
    assert stored_spans._spandecode.BOUNDS == stored_spans.BOUNDS
    assert stored_spans.c_reader_available()
    assert stored_spans.span_reader() is stored_spans._read_c


def test_environment_switch_forces_the_upb_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PURE_PYTHON_ENV, "1")
    assert stored_spans.span_reader() is stored_spans.read_upb


def test_without_the_extension_spans_are_read_through_upb() -> None:
    """An install without a C compiler has no `_spandecode`: everything takes the upb path."""
    script = (
        "import sys; sys.modules['railtrace.otlp._spandecode'] = None\n"
        "from railtrace.otlp import spans\n"
        "assert not spans.c_reader_available()\n"
        "assert spans.span_reader() is spans.read_upb\n"
        "try:\n"
        "    spans.span_reader(accelerated=True)\n"
        "except RuntimeError:\n"
        "    print('upb only')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip() == "upb only", done.stderr


# -- every span the test suite already uses ----------------------------------------------------


def fixture_encodings() -> list[bytes]:
    return stored_encodings([body for name in scenario_names() for body in split_protobuf_bodies(name)])


@needs_c
@pytest.mark.parametrize(
    "source",
    ["fixtures", "benchmark", *(f"simulator-{g}" for g in GENERATIONS)],
)
def test_same_spans_as_upb_on_known_traffic(source: str) -> None:
    if source == "fixtures":
        encodings = fixture_encodings()
    elif source == "benchmark":
        encodings = stored_encodings(export_calls(2048))
    else:
        encodings = stored_encodings(simulator_calls(source.removeprefix("simulator-")))
    assert len(encodings) > 20
    for encoding in encodings:
        # Read by the C reader itself, not through its upb fallback.
        assert stored_spans._spandecode.decode(encoding, DEFAULT_DROP) is not None  # type: ignore[union-attr]
        for normalize in (False, True):
            kind, _ = assert_same(encoding, normalize)
            assert kind == "span"


@needs_c
def test_store_load_spans_same_either_way(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    store = Store(engine)
    calls = [body for name in scenario_names() for body in split_protobuf_bodies(name)]
    calls += export_calls(512)
    for call in calls:
        store.insert_batches([prepare(call)])
    store.insert_batches([prepare(calls[0])])  # a retry: stores nothing, read once
    ids = sorted({tid for tid, _ in store.span_ids()})
    results = {}
    for path in ("c", "python"):
        monkeypatch.setenv(PURE_PYTHON_ENV, "1" if path == "python" else "")
        results[path] = [canon(store.load_spans(ids, normalize)) for normalize in (False, True)]
    assert results["c"] == results["python"]
    assert len(results["c"][0][1]) == len(store.span_ids())
    engine.dispose()


@needs_c
def test_store_load_spans_raises_on_an_undecodable_record_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As before the C reader: a stored record upb cannot parse raises DecodeError."""
    engine = make_engine(f"sqlite:///{tmp_path / 'rt.db'}")
    migrate(engine)
    store = Store(engine)
    batch = prepare(export_calls(512)[0])
    chunk = batch.chunks[0]
    records = chunk_records(chunk[4])
    records[1] = (records[1][0], b"\x0a\xff")  # a trace_id running past the span
    chunk[4] = b"".join(RECORD_HEADER.pack(rid, len(enc)) + enc for rid, enc in records)
    store.insert_batches([batch])
    for path in ("c", "python"):
        monkeypatch.setenv(PURE_PYTHON_ENV, "1" if path == "python" else "")
        with pytest.raises(DecodeError):
            store.load_spans([chunk[0]], normalize=False)
    engine.dispose()


# -- generated spans ---------------------------------------------------------------------------

# Characters of every UTF-8 length, so that a string cut at a bound cuts code points, not bytes.
WIDE = ["a", "é", "€", "😀"]
texts = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12)
keys = st.one_of(st.sampled_from(["k", "a.b", "", "llm_d.x", *DROP_KEYS]), texts)


@st.composite
def long_texts(draw: st.DrawFn, around: int = 8192) -> str:
    """A string a few characters either side of a bound, of mixed UTF-8 widths."""
    n = draw(st.integers(around - 3, around + 3))
    seed = draw(st.integers(0, 2**16))
    rng = random.Random(seed)
    return "".join(rng.choice(WIDE) for _ in range(n))


def _nested(depth: int, leaf: AnyValue) -> AnyValue:
    """Arrays and kvlists alternating `depth` deep, built in place (copying a deep message
    would hit protobuf's own depth limit)."""
    top = AnyValue()
    cur = top
    for i in range(depth):
        cur = cur.array_value.values.add() if i % 2 else cur.kvlist_value.values.add(key=f"d{i}").value
    cur.CopyFrom(leaf)
    return top


def _big_array(n: int) -> AnyValue:
    v = AnyValue()
    v.array_value.values.extend(AnyValue(int_value=i) for i in range(n))
    return v


def _big_kvlist(n: int, distinct: int) -> AnyValue:
    v = AnyValue()
    v.kvlist_value.values.extend(
        KeyValue(key=f"k{i % distinct}", value=AnyValue(int_value=i)) for i in range(n)
    )
    return v


leaves = st.one_of(
    texts.map(lambda s: AnyValue(string_value=s)),
    long_texts().map(lambda s: AnyValue(string_value=s)),
    st.booleans().map(lambda b: AnyValue(bool_value=b)),
    st.one_of(st.integers(-(2**63), -1), st.integers(0, 2**63 - 1)).map(lambda i: AnyValue(int_value=i)),
    st.sampled_from([math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-320]).map(
        lambda f: AnyValue(double_value=f)
    ),
    st.floats().map(lambda f: AnyValue(double_value=f)),
    st.binary(max_size=40).map(lambda b: AnyValue(bytes_value=b)),
    st.integers(8190, 8195).map(
        lambda n: AnyValue(bytes_value=bytes(range(256)) * (n // 256) + b"x" * (n % 256))
    ),
    st.integers(-(2**31), 2**31 - 1).map(lambda i: AnyValue(string_value_strindex=i)),
    st.just(AnyValue()),
)


# A third each: plain values, small nested ones, and values at or beyond a bound.
any_values = st.one_of(
    leaves,
    st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=4).map(array_value),
            st.lists(st.tuples(keys, children), max_size=4).map(kvlist_value),
        ),
        max_leaves=12,
    ),
    st.one_of(
        st.builds(_nested, st.integers(6, 12), leaves),
        st.builds(_nested, st.integers(20, 30), leaves),  # deeper than the C reader goes
        st.integers(1020, 1030).map(_big_array),
        st.builds(_big_kvlist, st.integers(250, 262), st.sampled_from([3, 300])),
    ),
)


def key_values(max_size: int = 6) -> st.SearchStrategy[list[KeyValue]]:
    one = st.one_of(st.builds(KeyValue, key=keys, value=any_values), st.builds(KeyValue, key=keys))
    many = st.builds(
        lambda n, distinct: [
            KeyValue(key=f"k{i % distinct}", value=AnyValue(string_value=f"v{i}")) for i in range(n)
        ],
        st.integers(250, 270),
        st.sampled_from([7, 1000]),
    )
    return st.one_of(
        st.lists(one, max_size=max_size),
        st.lists(one, min_size=1, max_size=max_size),
        st.builds(lambda head, tail: head + tail, st.lists(one, max_size=2), many),
    )


def _event(time_ns: int, name: str, attrs: list[KeyValue]) -> PbSpan.Event:
    e = PbSpan.Event(time_unix_nano=time_ns, name=name, dropped_attributes_count=1)
    e.attributes.extend(attrs)
    return e


events = st.builds(_event, st.integers(0, 2**64 - 1), st.one_of(texts, long_texts(256)), key_values(3))
links = st.builds(
    lambda tid, sid, ts, attrs, flags: PbSpan.Link(
        trace_id=tid, span_id=sid, trace_state=ts, attributes=attrs, flags=flags
    ),
    st.binary(max_size=16),
    st.binary(max_size=8),
    texts,
    key_values(3),
    st.integers(0, 2**32 - 1),
)


@st.composite
def pb_spans(draw: st.DrawFn) -> PbSpan:
    s = PbSpan(
        trace_id=draw(st.binary(max_size=16)),
        span_id=draw(st.one_of(st.binary(min_size=8, max_size=8), st.binary(max_size=10))),
        parent_span_id=draw(st.one_of(st.just(b""), st.binary(max_size=9))),
        trace_state=draw(texts),
        name=draw(st.one_of(texts, long_texts(512))),
        kind=draw(st.one_of(st.integers(0, 5), st.integers(-(2**31), 2**31 - 1))),
        start_time_unix_nano=draw(st.integers(0, 2**64 - 1)),
        end_time_unix_nano=draw(st.integers(0, 2**64 - 1)),
        dropped_attributes_count=draw(st.integers(0, 2**32 - 1)),
        flags=draw(st.integers(0, 2**32 - 1)),
    )
    s.attributes.extend(draw(key_values()))
    n_events = draw(st.sampled_from([0, 1, 3, 127, 128, 129, 140]))
    if n_events > 3:
        s.events.extend(
            _event(i, f"e{i}", [KeyValue(key="i", value=AnyValue(int_value=i))]) for i in range(n_events)
        )
    else:
        s.events.extend(draw(st.lists(events, min_size=n_events, max_size=n_events)))
    s.links.extend(draw(st.lists(links, max_size=2)))
    if draw(st.booleans()):
        s.status.code = draw(st.one_of(st.integers(0, 2), st.integers(-(2**31), 2**31 - 1)))
        s.status.message = draw(st.one_of(texts, long_texts(1024)))
    return s


def _nesting(v: AnyValue) -> int:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return 2 + max((_nesting(x) for x in v.array_value.values), default=0)
    if kind == "kvlist_value":
        return 3 + max((_nesting(kv.value) for kv in v.kvlist_value.values), default=0)
    return 1


def _deepest(s: PbSpan) -> int:
    kvs = [
        *s.attributes,
        *(kv for e in s.events for kv in e.attributes),
        *(kv for lk in s.links for kv in lk.attributes),
    ]
    return 2 + max((_nesting(kv.value) for kv in kvs), default=0)


SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@needs_c
@SETTINGS
@given(pb_spans(), st.booleans())
def test_same_as_upb_on_generated_spans(span: PbSpan, normalize: bool) -> None:
    """Canonical encodings (as upb writes them) are read by the C reader itself, unless nested
    deeper than it goes, and give what upb gives."""
    encoding = span.SerializeToString()
    if _deepest(span) < 40:
        assert stored_spans._spandecode.decode(encoding, DEFAULT_DROP) is not None  # type: ignore[union-attr]
    assert assert_same(encoding, normalize)[0] == "span"


def _wide(n: int, width: int) -> str:
    """n characters of UTF-8 width `width`, with an ASCII one first."""
    return "a" + WIDE[width - 1] * (n - 1)


def edge_spans() -> list[tuple[str, PbSpan]]:
    """Spans each one step either side of a bound, or with an extreme value."""
    out: list[tuple[str, PbSpan]] = []

    def add(label: str, **fields: Any) -> PbSpan:
        s = PbSpan(**{"trace_id": bytes(range(1, 17)), "span_id": bytes(range(1, 9)), **fields})
        out.append((label, s))
        return s

    for delta in (-1, 0, 1):
        for width in (1, 2, 3, 4):
            add(f"name {delta} w{width}", name=_wide(512 + delta, width))
            add(f"string {delta} w{width}").attributes.add(
                key="s", value=AnyValue(string_value=_wide(8192 + delta, width))
            )
            s = add(f"event name {delta} w{width}")
            s.events.add(name=_wide(256 + delta, width))
            add(f"status {delta} w{width}").status.message = _wide(1024 + delta, width)
        for n in (8192 + delta, 8192 * 3 + delta):
            add(f"bytes {n}").attributes.add(
                key="b", value=AnyValue(bytes_value=(bytes(range(256)) * 100)[:n])
            )
        add(f"array {delta}").attributes.add(key="a", value=_big_array(1024 + delta))
        add(f"kvlist {delta}").attributes.add(key="k", value=_big_kvlist(256 + delta, 1000))
        for depth in (7, 8, 9):
            add(f"depth {depth + delta}").attributes.add(
                key="d", value=_nested(depth + delta, AnyValue(int_value=1))
            )
        s = add(f"attributes {delta}")
        s.attributes.add(key=DROP_KEYS[0], value=AnyValue(string_value="prompt"))  # counts towards the bound
        s.attributes.extend(KeyValue(key=f"k{i}", value=AnyValue(int_value=i)) for i in range(255 + delta))
        s.attributes.add(key="k0", value=AnyValue(int_value=-1))  # a duplicate, maybe past the bound
        s = add(f"events {delta}")
        s.events.extend(PbSpan.Event(name=f"e{i}", time_unix_nano=i) for i in range(128 + delta))
    for n in (-(2**63), -1, 0, 2**63 - 1):
        add(f"int {n}").attributes.add(key="i", value=AnyValue(int_value=n))
    for n in (-(2**31), -1, 2**31 - 1):
        add(f"enums {n}", kind=n).status.code = n
    for f in (math.nan, -math.nan, math.inf, -math.inf, -0.0, 5e-324):
        add(f"double {f}").attributes.add(key="f", value=AnyValue(double_value=f))
    add(
        "bool",
        attributes=[
            KeyValue(key="t", value=AnyValue(bool_value=True)),
            KeyValue(key="f", value=AnyValue(bool_value=False)),
        ],
    )
    add("empty", attributes=[KeyValue(key="", value=AnyValue(string_value="")), KeyValue(key="n")])
    add("times", start_time_unix_nano=2**64 - 1, end_time_unix_nano=1)
    add("parent", parent_span_id=b"\0" * 8)
    add("odd ids", span_id=b"", parent_span_id=b"\xff")
    return out


EDGES = edge_spans()


@needs_c
@pytest.mark.parametrize("span", [s for _, s in EDGES], ids=[label for label, _ in EDGES])
def test_same_as_upb_at_every_bound(span: PbSpan) -> None:
    encoding = span.SerializeToString()
    assert stored_spans._spandecode.decode(encoding, DEFAULT_DROP) is not None  # type: ignore[union-attr]
    for normalize in (False, True):
        assert assert_same(encoding, normalize)[0] == "span"


# -- encodings protobuf merges, and unusual framing ------------------------------------------


def _ld(field: int, payload: bytes) -> bytes:
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def _any_piece() -> st.SearchStrategy[bytes]:
    """One encoded AnyValue oneof member (or an unknown field): several of them in a row are
    what protobuf resolves by last-wins or merging."""
    return st.one_of(
        any_values.map(lambda v: v.SerializeToString()),
        st.just(b""),
        st.integers(0, 2**64 - 1).map(lambda n: b"\x18" + varint(n)),  # int_value, any width
        st.integers(0, 2**64 - 1).map(lambda n: b"\x10" + varint(n)),  # bool_value, not 0/1
        st.sampled_from([b"\x98\x06\x01", b"\xa5\x06abcd", b"\xa1\x06abcdefgh"]),  # unknown fields
    )


@st.composite
def merged_spans(draw: st.DrawFn) -> bytes:
    """Span encodings built piece by piece: whole spans concatenated (protobuf merges them),
    attributes whose AnyValue is several members in a row, fields repeated, unknown fields."""
    pieces = [s.SerializeToString() for s in draw(st.lists(pb_spans(), min_size=1, max_size=2))]
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.integers(0, 6))
        if kind == 0:
            value = b"".join(draw(st.lists(_any_piece(), min_size=1, max_size=3)))
            pieces.append(_ld(9, _ld(1, draw(keys).encode()) + _ld(2, value)))
        elif kind == 1:  # a KeyValue with its value twice, or its key twice
            again = [_ld(2, b"\x18\x05"), _ld(1, b"b"), _ld(2, _ld(5, _ld(1, b"\x18\x07")))]
            kv = _ld(1, b"a") + _ld(2, draw(st.sampled_from([b"\x10\x01", _ld(5, _ld(1, b"\x10\x01"))])))
            kv += draw(st.sampled_from(again))
            pieces.append(_ld(9, kv))
        elif kind == 2:  # singular scalars again: the last wins
            pieces.append(
                draw(
                    st.sampled_from(
                        [
                            b"\x30\x03",
                            b"\x30" + varint(-1),
                            _ld(5, b"again"),
                            _ld(2, b"12345678"),
                            _ld(4, b""),
                        ]
                    )
                )
            )
        elif kind == 3:  # status again: merged
            pieces.append(_ld(15, b"\x12\x02ok\x18\x02"))
        elif kind == 4:  # unknown fields of every wire type, groups included
            pieces.append(
                draw(
                    st.sampled_from(
                        [
                            b"\xf8\x07\x05",
                            b"\xf9\x07" + bytes(8),
                            b"\xfd\x07" + bytes(4),
                            _ld(99, b"xyz"),
                            b"\xfb\x07\xfc\x07",
                            b"\x33\x34",
                        ]
                    )
                )
            )
        elif kind == 5:  # known fields with the wrong wire type
            pieces.append(
                draw(
                    st.sampled_from(
                        [
                            b"\x38\x05",
                            b"\x2d" + bytes(4),
                            b"\x30" + bytes(8)[:0] + b"\x01",
                            b"\x31" + bytes(8),
                            _ld(6, b"\x01"),
                        ]
                    )
                )
            )
        else:  # non-canonical tag or length
            pieces.append(draw(st.sampled_from([b"\xaa\x00\x01x", b"\x2a\x81\x00x", b"\x30\x80\x80\x01"])))
    order = draw(st.permutations(range(len(pieces))))
    return b"".join(pieces[i] for i in order)


@needs_c
@SETTINGS
@given(merged_spans(), st.booleans())
# An array twice in a row: protobuf appends the second's items to the first's.
@example(_ld(9, _ld(1, b"k") + _ld(2, _ld(5, _ld(1, b"\x10\x01")) + _ld(5, _ld(1, b"\x18\x02")))), False)
@example(_ld(9, _ld(1, b"k") + _ld(2, _ld(6, _ld(1, _ld(1, b"a"))) + _ld(6, _ld(1, _ld(1, b"b"))))), False)
# Replaced by a string in between: only the last array counts.
@example(_ld(9, _ld(1, b"k") + _ld(2, _ld(5, b"") + b"\x0a\x01x" + _ld(5, _ld(1, b"\x18\x02")))), False)
# A KeyValue's value twice, each an array: merged.
@example(
    _ld(9, _ld(1, b"k") + _ld(2, _ld(5, _ld(1, b"\x10\x01"))) + _ld(2, _ld(5, _ld(1, b"\x18\x02")))), False
)
@example(_ld(15, b"\x12\x01a") + _ld(15, b"\x18\x02"), False)
def test_same_as_upb_on_merged_and_unusual_encodings(encoding: bytes, normalize: bool) -> None:
    read_by_c = stored_spans._spandecode.decode(encoding, DEFAULT_DROP) is not None  # type: ignore[union-attr]
    event("read by the C reader" if read_by_c else "left to upb")
    assert_same(encoding, normalize)


# -- hostile bytes -------------------------------------------------------------------------------


@st.composite
def mangled(draw: st.DrawFn) -> bytes:
    """A valid span's encoding cut short, with bytes flipped, inserted, dropped or repeated."""
    data = bytearray(draw(pb_spans()).SerializeToString())
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.integers(0, 4))
        at = draw(st.integers(0, len(data)))
        if op == 0:
            del data[at:]
        elif op == 1 and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif op == 2:
            data[at:at] = draw(st.binary(min_size=1, max_size=6))
        elif op == 3:
            del data[at : at + draw(st.integers(1, 8))]
        else:
            data[at:at] = data[at : at + draw(st.integers(1, 16))]
    return bytes(data)


@needs_c
@SETTINGS
@given(st.one_of(st.binary(max_size=200), mangled()))
def test_hostile_bytes_same_outcome_as_upb(encoding: bytes) -> None:
    """Never a crash; the same span, or the same exception type, as the upb path."""
    event(f"upb: {assert_same(encoding)[0]}")


@needs_c
def test_every_truncation_of_known_spans() -> None:
    for encoding in fixture_encodings()[:40]:
        for cut in range(len(encoding)):
            assert_same(encoding[:cut])


@needs_c
def test_decode_checks_its_arguments() -> None:
    decode = stored_spans._spandecode.decode  # type: ignore[union-attr]
    with pytest.raises(TypeError):
        decode(b"")
    with pytest.raises(TypeError):
        decode(b"", ["not", "a", "set"])
    with pytest.raises(TypeError):
        decode("not bytes", DEFAULT_DROP)
    assert decode(memoryview(b"\x2a\x01x"), frozenset())[2] == "x"
    assert decode(bytearray(b""), set()) is not None


def _marked_span() -> tuple[bytes, list[bytes]]:
    """A span with a distinct marker in every place a string can be, bounded or not, kept or
    not; and the markers."""
    marks: list[bytes] = []

    def m() -> str:
        marks.append(f"~M{len(marks):03d}~".encode())
        return marks[-1].decode()

    s = PbSpan(trace_id=bytes(range(1, 17)), span_id=bytes(range(1, 9)), name=m(), trace_state=m())
    s.status.message = m()
    s.attributes.add(key=m(), value=AnyValue(string_value=m()))
    s.attributes.add(key=DROP_KEYS[0], value=AnyValue(string_value=m()))  # dropped, still checked
    array = s.attributes.add(key="arr").value.array_value
    array.values.extend(AnyValue(string_value=m() if i in (0, 1030) else "x") for i in range(1031))
    s.attributes.add(key="kvl", value=kvlist_value([(m(), AnyValue(string_value=m()))]))
    s.attributes.add(key="deep", value=_nested(12, AnyValue(string_value=m())))  # beyond MAX_DEPTH
    s.attributes.extend(KeyValue(key=f"f{i}") for i in range(260))
    s.attributes.add(key=m(), value=AnyValue(string_value=m()))  # beyond MAX_ATTRIBUTES
    for i in range(130):
        e = s.events.add(name=m() if i in (0, 129) else "e")
        if i in (0, 129):
            e.attributes.add(key=m(), value=AnyValue(string_value=m()))
    s.links.add(trace_state=m()).attributes.add(key=m(), value=AnyValue(string_value=m()))
    raw = s.SerializeToString()
    # Strings that a later field replaces: a oneof member, a KeyValue's key, the span's name.
    raw += _ld(9, _ld(1, b"r") + _ld(2, _ld(1, m().encode()) + b"\x18\x01"))
    raw += _ld(9, _ld(1, m().encode()) + _ld(1, b"k2") + _ld(2, b"\x18\x01"))
    raw += _ld(5, m().encode()) + _ld(5, b"final name")
    return raw, marks


@needs_c
def test_bad_utf8_anywhere_same_outcome_as_upb() -> None:
    """upb checks every string field, kept or not; so must the C reader (else it returns a
    span where upb raises)."""
    raw, marks = _marked_span()
    assert stored_spans._spandecode.decode(raw, DEFAULT_DROP) is not None  # type: ignore[union-attr]
    assert assert_same(raw)[0] == "span"
    for mark in marks:
        assert raw.count(mark) == 1
        broken = raw.replace(mark, b"\xc3(" + mark[2:])
        assert assert_same(broken) == ("raised", DecodeError), mark
