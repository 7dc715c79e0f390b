"""Span storage: a trace's spans from one export call are one chunk row.

What must hold whatever the layout: every span sent comes back exactly once and unchanged,
an exporter's retry stores nothing, a span re-sent inside different bytes is still returned
once, and a database written by the row-per-span layout is converted losslessly (both ways).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sqlalchemy import Engine, text

from railtrace.normalize import span_request_keys
from railtrace.otlp import decode
from railtrace.otlp.decode import DEFAULT_DROP, DecodeResult, attributes, parse_protobuf
from railtrace.otlp.encode import key_value as kv
from railtrace.otlp.export import prepare
from railtrace.otlp.rows import (
    RECORD_HEADER,
    chunk_records,
    resource_key,
    rows_from_request,
    service_name_of,
)
from railtrace.store import Store, make_engine, migrate
from railtrace.store.engine import alembic_config, pg_has_lz4
from tests.fixtures.otlp_fixtures import protobuf_body, scenario_names, split_protobuf_bodies
from tests.service_helpers import export_request, trace_id

OLD_COLUMNS = (
    "trace_id, span_id, parent_span_id, name, service_name, start_ns, end_ns, status_code,"
    " resource_id, received_ns, body"
)


def fixture_calls() -> list[bytes]:
    """Every scenario fixture, one export call per process, as a fleet's exporters send them."""
    return [body for name in scenario_names() for body in split_protobuf_bodies(name)]


def all_trace_ids(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return [r[0] for r in conn.execute(text("SELECT trace_id FROM traces ORDER BY trace_id"))]


def span_key(s) -> tuple:
    return (s.trace_id, s.span_id)


def test_chunk_records_round_trip_and_reject_bad_framing() -> None:
    records = [(7, b"abc"), (2**63 - 1, b""), (0, bytes(range(256)))]
    body = b"".join(RECORD_HEADER.pack(rid, len(enc)) + enc for rid, enc in records)
    assert chunk_records(body) == records
    with pytest.raises(ValueError):
        chunk_records(body[:-1])  # last record cut short
    with pytest.raises(ValueError):
        chunk_records(body[:5])  # a header cut short


def test_every_span_comes_back_once_and_retries_store_nothing(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    store = Store(engine)
    calls = fixture_calls()
    sent = sum(len(prepare(c)) for c in calls)
    first = [store.insert_batches([prepare(c)]) for c in calls]
    assert sum(r.inserted for r in first) == sent and store.count_spans() == sent
    # The same calls again, two to a commit (exporter retries): nothing new.
    again = [store.insert_batches([prepare(c), prepare(c)]) for c in calls]
    assert sum(r.inserted for r in again) == 0
    assert sum(r.duplicates for r in again) == 2 * sent
    assert store.count_spans() == sent
    ids = all_trace_ids(engine)
    spans = store.load_spans(ids)
    assert len(spans) == sent == len({span_key(s) for s in spans})
    assert store.span_ids() == {span_key(s) for s in spans}
    # A scenario's spans again, but all processes in one call (as a collector batches them):
    # each trace's chunk is new bytes, so it is stored again, and still read back once.
    store.insert_batches([prepare(protobuf_body(scenario_names()[0]))])
    assert store.count_spans() > sent  # stored again: the path below is really exercised
    assert sorted(map(span_key, store.load_spans(ids))) == sorted(map(span_key, spans))
    engine.dispose()


def test_postgresql_compresses_chunk_bodies_with_lz4(new_database: Callable[[str], str]) -> None:
    """A P/D request's chunk (~6 KB) is compressed as it is stored: with lz4 where the server has
    it (pglz took four times the CPU in ingest's COPY), else as before; it reads back unchanged."""
    engine = make_engine(new_database("postgresql"))
    migrate(engine)
    store = Store(engine)
    call = export_request([1, 2])
    for rs in call.resource_spans:  # as long as a real request's spans, and as compressible
        for sp in rs.scope_spans[0].spans:
            sp.attributes.extend([kv(f"llm_d.test.note_{i}", "kv-cache block " * 12) for i in range(3)])
    batch = prepare(call)
    assert min(len(r[4]) for r in batch.chunks) > 4000
    store.insert_batches([batch])
    with engine.connect() as conn:
        lz4 = pg_has_lz4(conn)
        methods = set(conn.exec_driver_sql("SELECT pg_column_compression(body) FROM span_chunks").scalars())
        declared = conn.exec_driver_sql(
            "SELECT attcompression FROM pg_attribute"
            " WHERE attrelid = 'span_chunks'::regclass AND attname = 'body'"
        ).scalar()
    assert (methods, declared) == (({"lz4"}, "l") if lz4 else ({"pglz"}, ""))
    spans = store.load_spans([trace_id(1), trace_id(2)], normalize=False)
    sent = [sp for rs in call.resource_spans for sp in rs.scope_spans[0].spans]
    assert {(s.trace_id, s.span_id) for s in spans} == {(sp.trace_id.hex(), sp.span_id.hex()) for sp in sent}
    engine.dispose()


def old_rows(calls: list[bytes], received_ns: int) -> tuple[list[dict], dict[int, bytes]]:
    """The rows the row-per-span layout (revision 0003 and before) stored for these calls."""
    rows, resources, seen = [], {}, set()
    for i, raw in enumerate(calls):
        req: ExportTraceServiceRequest = parse_protobuf(raw)
        for rs in req.resource_spans:
            resource = attributes(rs.resource.attributes, DEFAULT_DROP, DecodeResult())
            for ss in rs.scope_spans:
                rid, blob = resource_key(resource, ss.scope.name[:256])
                resources[rid] = blob
                for s in ss.spans:
                    if (s.trace_id, s.span_id) in seen:  # the old primary key kept the first
                        continue
                    seen.add((s.trace_id, s.span_id))
                    rows.append(
                        {
                            "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(),
                            "parent_span_id": s.parent_span_id.hex() or None,
                            "name": s.name,
                            "service_name": service_name_of(resource),
                            "start_ns": s.start_time_unix_nano,
                            "end_ns": s.end_time_unix_nano,
                            "status_code": int(s.status.code),
                            "resource_id": rid,
                            "received_ns": received_ns + i,
                            "body": s.SerializeToString(),
                        }
                    )
    return rows, resources


def test_migration_converts_span_rows_to_chunks_and_back(
    db_url: str, new_database: Callable[[str], str]
) -> None:
    calls = fixture_calls()
    kind = "sqlite" if db_url.startswith("sqlite") else "postgresql"
    cfg = alembic_config()
    before = ScriptDirectory.from_config(cfg).get_revision("0004").down_revision
    rows, resources = old_rows(calls, 1_790_000_000 * 10**9)
    old = make_engine(db_url)
    with old.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, before)
        conn.execute(
            text(f"INSERT INTO spans ({OLD_COLUMNS}) VALUES (:{', :'.join(OLD_COLUMNS.split(', '))})"),
            rows,
        )
        conn.execute(
            text("INSERT INTO resources (id, attributes) VALUES (:id, :a)"),
            [{"id": k, "a": v} for k, v in resources.items()],
        )
        conn.execute(
            text(
                "INSERT INTO traces (trace_id, first_arrival_ns, last_arrival_ns, span_count, has_root,"
                " dirty, late_spans) VALUES (:t, 1, 1, 1, TRUE, TRUE, 0)"
            ),
            [{"t": t} for t in sorted({r["trace_id"] for r in rows})],
        )
    migrate(old)
    fresh = make_engine(new_database(kind))
    migrate(fresh)
    store = Store(fresh)
    for c in calls:
        store.insert_batches([prepare(c)])
    try:
        ids = all_trace_ids(fresh)
        converted = Store(old).load_spans(ids)
        assert converted == store.load_spans(ids)  # every field of every span, in order
        assert Store(old).count_spans() == len(rows)
        with old.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, before)
        with old.connect() as conn:
            back = [dict(r._mapping) for r in conn.execute(text(f"SELECT {OLD_COLUMNS} FROM spans"))]
        key = lambda r: (r["trace_id"], r["span_id"])  # noqa: E731
        for r in back:
            r["body"] = bytes(r["body"])
        assert sorted(back, key=key) == sorted(rows, key=key)
    finally:
        old.dispose()
        fresh.dispose()


def test_join_keys_of_the_fixtures_are_the_decoded_spans_strongest_keys() -> None:
    """The receiver reads join keys from the wire bytes without decoding attributes; for real
    llm-d/vLLM spans they must be what decoding finds. The one addition: an id in vLLM's
    engine form (`<id>-<8 hex>`, a KV connector's) is stored in both forms, since the wire scan
    does not tell which attribute carried it (`rows.key_pair`)."""
    from railtrace.normalize import table as ntable
    from railtrace.otlp.rows import key_pair

    for raw in fixture_calls():
        batch = rows_from_request(parse_protobuf(raw), raw=raw, content_free=True)
        expected = set()
        for span in decode(raw, "application/x-protobuf").spans:
            keys = span_request_keys(span)
            if keys:
                expected.add((keys[0], span.trace_id))
                for attr in ntable.KEY_ATTRIBUTES:
                    value = span.attributes.get(attr)
                    value = value[0] if isinstance(value, list) and value else value
                    if isinstance(value, str) and key_pair(value)[0]:
                        expected.update((k, span.trace_id) for k in key_pair(value) if k)
                        break
        assert batch.keys == expected
