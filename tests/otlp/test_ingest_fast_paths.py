"""The ingest hot path's shortcuts must not change what is stored.

Join keys are read from a span's bytes only for the key attributes its scope holds at all,
span encodings are cut out of the call by a specialised loop, and SQLite rows go in as
multi-row statements. Each shortcut is checked here against the plain reading: the decoded
spans' strongest keys, the parsed spans' own encodings, and row counts.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sqlalchemy import text

from railtrace.normalize import span_request_keys
from railtrace.otlp import decode
from railtrace.otlp.decode import parse_protobuf
from railtrace.otlp.encode import key_value
from railtrace.otlp.export import prepare
from railtrace.otlp.rows import chunk_records, rows_from_request, span_slices
from railtrace.store import Store, make_engine, migrate
from railtrace.store.statements import _insert_values

T0 = 1_790_000_000 * 10**9
PD = "llm_d.pd_proxy.request_id"
KV = "llm_d.kv_transfer.request_id"
HEADER = "http.request.header.x-request-id"
VLLM = "gen_ai.request.id"


def _call(scopes: list[list[tuple[int, int, dict[str, object], dict[str, object] | None]]]) -> bytes:
    """An export call: per scope, spans as (trace number, span number, attributes, event
    attributes or None)."""
    req = ExportTraceServiceRequest()
    for n, spans in enumerate(scopes):
        rs = req.resource_spans.add()
        rs.resource.attributes.append(key_value("service.name", f"svc-{n}"))
        ss = rs.scope_spans.add()
        ss.scope.name = f"scope-{n}"
        for trace, span, attrs, event in spans:
            s = ss.spans.add()
            s.trace_id = trace.to_bytes(16, "big")
            s.span_id = (1000 * trace + span).to_bytes(8, "big")
            if span:
                s.parent_span_id = (1000 * trace).to_bytes(8, "big")
            s.name = f"op-{span}"
            s.start_time_unix_nano = T0 + span
            s.end_time_unix_nano = T0 + span + 10
            s.attributes.extend(key_value(k, v) for k, v in attrs.items())
            if event is not None:
                e = s.events.add()
                e.name = "e"
                e.attributes.extend(key_value(k, v) for k, v in event.items())
    return req.SerializeToString()


def _decoded_keys(raw: bytes) -> set[tuple[str, str]]:
    out = set()
    for span in decode(raw, "application/x-protobuf").spans:
        keys = span_request_keys(span)
        if keys:
            out.add((keys[0], span.trace_id))
    return out


def test_each_span_contributes_its_own_strongest_key() -> None:
    """Spans of one trace with different ids each add theirs; a scope without a key attribute
    adds nothing; an id too short to join is skipped for the next attribute."""
    raw = _call(
        [
            [  # the sidecar: its own id is stronger than the header
                (1, 0, {HEADER: ["hdr-1111"], PD: "pd-aaaa"}, None),
                (1, 1, {HEADER: ["hdr-1111"]}, None),
                (2, 0, {PD: "ab", HEADER: "hdr-2222"}, None),  # "ab" is too short to join
            ],
            [  # vLLM: the prefixed OpenAI id
                (1, 2, {VLLM: "chatcmpl-VLLM-0001"}, None),
                (2, 1, {VLLM: "cmpl-bbbb-3", KV: "kv-cccc"}, None),
            ],
            [(3, 0, {"http.request.method": "POST"}, None)],  # no key attribute at all
        ]
    )
    batch = rows_from_request(parse_protobuf(raw), raw=raw, content_free=True)
    assert batch.keys == _decoded_keys(raw)
    t1, t2 = (1).to_bytes(16, "big").hex(), (2).to_bytes(16, "big").hex()
    assert batch.keys == {
        ("pd-aaaa", t1),
        ("hdr-1111", t1),
        ("vllm-0001", t1),
        ("hdr-2222", t2),
        ("kv-cccc", t2),
    }
    # The same call re-encoded span by span (no raw bytes) reads the same keys.
    assert rows_from_request(parse_protobuf(raw), content_free=True).keys == batch.keys


def test_a_key_attribute_in_another_scope_does_not_leak_into_this_one() -> None:
    raw = _call(
        [
            [(1, 0, {HEADER: "hdr-1111"}, None)],
            [(2, 0, {"other": "x"}, {PD: "pd-in-an-event"})],  # only an event carries a key
        ]
    )
    batch = rows_from_request(parse_protobuf(raw), raw=raw, content_free=True)
    plain = rows_from_request(parse_protobuf(raw), content_free=True)
    assert batch.keys == plain.keys
    assert ("hdr-1111", (1).to_bytes(16, "big").hex()) in batch.keys


def test_span_slices_are_the_spans_own_encodings() -> None:
    # Attribute values long enough that some spans need a three-byte length.
    raw = _call([[(t, s, {"pad": "x" * (2000 * t * s)}, None) for s in range(3)] for t in range(1, 6)])
    req = parse_protobuf(raw)
    slices = span_slices(raw)
    assert slices is not None
    expected = [
        [s.SerializeToString() for s in ss.spans] for rs in req.resource_spans for ss in rs.scope_spans
    ]
    assert [bodies for bodies, _, _ in slices] == expected
    assert any(len(b) >= 1 << 14 for bodies in expected for b in bodies)
    # Chunk bodies hold exactly those encodings.
    batch = rows_from_request(req, raw=raw, content_free=True)
    stored = sorted(enc for chunk in batch.chunks for _, enc in chunk_records(chunk[4]))
    assert stored == sorted(b for bodies in expected for b in bodies)


def test_multi_row_inserts_count_new_rows_only(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    migrate(engine)
    store = Store(engine)
    # 1,200 traces in one commit: more chunks than one statement takes.
    raw = _call([[(t, s, {HEADER: f"req-{t:06d}"}, None) for t in range(1, 1201) for s in range(2)]])
    first = store.insert_batches([prepare(raw)])
    assert (first.inserted, first.duplicates) == (2400, 0)
    again = store.insert_batches([prepare(raw), prepare(raw)])
    assert (again.inserted, again.duplicates) == (0, 4800)
    with engine.connect() as conn:
        counts = [
            conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("span_chunks", "traces", "trace_keys")
        ]
        spans = conn.execute(text("SELECT sum(span_count) FROM traces")).scalar_one()
    assert counts == [1200, 1200, 1200] and spans == 2400
    engine.dispose()


def test_multi_row_inserts_respect_a_low_variable_limit(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "y.db")
    conn.execute("CREATE TABLE t (a TEXT PRIMARY KEY, b INTEGER, c BLOB)")
    conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 20)  # six rows of three per statement
    rows = [(f"k{i}", i, bytes([i % 256]) * i) for i in range(45)]
    cur = conn.cursor()
    sql = "INSERT INTO t (a, b, c) VALUES (?, ?, ?) ON CONFLICT DO NOTHING"
    assert _insert_values(cur, sql, rows) == 45
    assert _insert_values(cur, sql, [*rows[:7], ("new", 1, b"")]) == 1
    assert conn.execute("SELECT a, b, c FROM t ORDER BY rowid").fetchall() == [*rows, ("new", 1, b"")]
    conn.close()
