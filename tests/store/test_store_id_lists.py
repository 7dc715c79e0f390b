"""The store's lookups by lists of ids, on SQLite and PostgreSQL.

Each is one statement whose ids are one parameter (`among`: a JSON array on SQLite, an array
on PostgreSQL) where it was an expanding `IN (...)` split into chunks of 500; they must find
exactly the rows the `IN` list found, for empty lists, duplicates, unknown ids and lists
longer than the old chunks. And a chunk's spans read at once (`records_reader`) are the
spans read one by one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import insert, select

from railtrace.metrics import Metrics
from railtrace.otlp import spans as stored_spans
from railtrace.otlp.export import prepare
from railtrace.otlp.rows import chunk_records
from railtrace.otlp.spans import StoredResource
from railtrace.scheduling.assembler import Assembler, default_pipeline
from railtrace.store import Store, make_engine, migrate
from railtrace.store.schema import requests, resources, span_chunks, trace_keys, traces
from railtrace.store.statements import among, listed
from railtrace.topology import TopologyHolder
from tests.service_helpers import export_request, settings_for, trace_id

HOUR_NS = 3600 * 10**9
LEASE = 60 * 10**9
N = 1_200

ID_LISTS = {
    "empty": [],
    "one": [trace_id(7)],
    "duplicates": [trace_id(3), trace_id(3), trace_id(9), trace_id(3)],
    "unknown": [trace_id(N + 5), "not-a-trace", ""],
    "all and more": [trace_id(i) for i in range(N + 50)] + [trace_id(1)],
    # Longer than the column: must not match the id it starts with (no cast cutting it).
    "too long": [trace_id(4) + "00", trace_id(5) + "x" * 300],
}


def _trace_rows(numbers: range, arrival_ns: int | None = None) -> list[dict[str, Any]]:
    """Dirty `traces` rows for these trace numbers, arrived at `arrival_ns` (default: the number)."""
    return [
        {
            "trace_id": trace_id(i),
            "first_arrival_ns": i if arrival_ns is None else arrival_ns,
            "last_arrival_ns": i if arrival_ns is None else arrival_ns,
            "span_count": 1,
            "has_root": True,
            "dirty": True,
            "late_spans": 0,
        }
        for i in numbers
    ]


def _store(db_url: str) -> Store:
    engine = make_engine(db_url)
    migrate(engine)
    return Store(engine)


@pytest.mark.parametrize("name", sorted(ID_LISTS))
def test_among_finds_what_an_in_list_finds(db_url: str, name: str) -> None:
    store = _store(db_url)
    big = [2**63 - 1 - i for i in range(N)]  # resource ids use all 63 bits
    with store.engine.begin() as conn:
        conn.execute(insert(traces), _trace_rows(range(N)))
        conn.execute(insert(resources), [{"id": rid, "attributes": b"{}"} for rid in big])
    ids = ID_LISTS[name]
    rids = [big[0], big[0], big[-1], 5, 2**62] if ids else []
    t, r = traces.c, resources.c
    ids_param, rids_param = {"ids": listed(ids, store.sqlite)}, {"ids": listed(rids, store.sqlite)}
    with store.engine.connect() as conn:

        def rows(stmt: Any, params: dict[str, Any] | None = None) -> list[Any]:
            return sorted(conn.execute(stmt, params or {}).scalars())

        expected = rows(select(t.trace_id).where(t.trace_id.in_(ids)))
        assert rows(select(t.trace_id).where(among(t.trace_id, "ids", store.sqlite)), ids_param) == expected
        assert rows(select(t.trace_id).where(~among(t.trace_id, "ids", store.sqlite)), ids_param) == rows(
            select(t.trace_id).where(t.trace_id.not_in(ids))
        )
        assert rows(select(r.id).where(among(r.id, "ids", store.sqlite)), rids_param) == rows(
            select(r.id).where(r.id.in_(rids))
        )
    if name == "too long":
        assert expected == []
    store.engine.dispose()


def test_store_lookups_over_more_ids_than_a_chunk(db_url: str) -> None:
    """Ingested and assembled traces, looked up through the Store by more than 500 ids (the old
    chunk size), with duplicates and unknown ids among them."""
    store = _store(db_url)
    numbers = list(range(600))
    store.insert_batches([prepare(export_request(numbers))])
    store.insert_batches([prepare(export_request([1000, 1001], split=True))])  # 1500, 1501 join them
    ids = [trace_id(n) for n in [*numbers, 1000, 1001, 1500, 1501]]
    asked = [*ids, *ids[:50], trace_id(5000), "unknown"]
    later = time.time_ns() + HOUR_NS

    states = store.trace_states(asked)
    assert sorted(states) == sorted(ids)
    assert all(s.dirty and not s.assembled for s in states.values())
    assert store.trace_states([]) == {}

    spans = store.load_spans(asked, normalize=False)
    assert sorted((s.trace_id, s.span_id) for s in spans) == sorted(store.span_ids())
    assert store.load_spans([trace_id(5000)]) == []
    # Resources read once are kept: a second load gives equal spans sharing the same dicts.
    again = store.load_spans(asked, normalize=False)
    assert again == spans
    assert again[0].resource is spans[0].resource

    with store.engine.connect() as conn:
        pairs = sorted(conn.execute(select(trace_keys.c.request_key, trace_keys.c.trace_id)).all())
        arrivals = dict(conn.execute(select(traces.c.trace_id, traces.c.first_arrival_ns)).all())
    keys = [k for k, _ in pairs]
    holders = store.traces_for_keys([*keys, *keys[:10], "no-such-key", ""])
    assert sorted(holders) == sorted((k, t, arrivals.get(t)) for k, t in pairs)
    assert store.traces_for_keys([]) == []

    assert store.claim("a", asked, later, LEASE) == set(ids)
    assert store.claim("b", asked, later, LEASE) == set()
    assert store.claim_ready("b", later, later, later, LEASE, limit=1000) == []
    store.release("b", ids)  # not b's: nothing changes
    assert store.claim("b", ids, later, LEASE) == set()
    store.release("a", asked)
    ready = store.claim_ready("b", later, later, later, LEASE, limit=1000, skip=[*ids[:550], ids[0]])
    assert sorted(t.trace_id for t in ready) == sorted(ids[550:])
    store.release("b", ids)

    settings = settings_for(db_url, quiet_period_s=1.0)
    assembler = Assembler(store, settings, Metrics(), default_pipeline(settings, TopologyHolder([]).get))
    while assembler.run_once(now_ns=later, limit=1000):
        pass
    with store.engine.connect() as conn:
        primaries = set(conn.execute(select(requests.c.trace_id)).scalars())
    assert len(primaries) == len(numbers) + 2
    previous = store.previous_summaries([*asked, trace_id(1500)])
    assert set(previous) == primaries
    # A stitched trace's own id finds the summary stored under its request's primary trace.
    (primary,) = store.previous_summaries([trace_id(1501)])
    assert primary in (trace_id(1001), trace_id(1501))
    assert store.previous_summaries([]) == {}
    assert all(not s.dirty and s.assembled for s in store.trace_states(ids).values())
    store.engine.dispose()


@pytest.mark.parametrize("accelerated", [False, True])
def test_records_reader_reads_as_the_span_reader(accelerated: bool) -> None:
    """A chunk read at once (resources prepared once) gives the spans `span_reader` gives one by
    one; a resource id without a row reads as an empty resource, as before."""
    if accelerated and not stored_spans.c_reader_available():
        pytest.fail("the C span reader is not built")
    batch = prepare(export_request(list(range(20))))
    resource_rows = {rid: orjson.loads(blob) for rid, blob in batch.resources.items()}
    lost = next(iter(resource_rows))  # read as if its row were missing
    prepared = {rid: StoredResource.of(r) for rid, r in resource_rows.items() if rid != lost}
    one_by_one = stored_spans.span_reader(accelerated)
    at_once = stored_spans.records_reader(accelerated)
    for tid, _cid, _received, _n, body, _root in batch.chunks:
        records = chunk_records(body)
        expected = [one_by_one(tid, enc, resource_rows[rid] if rid != lost else {}) for rid, enc in records]
        assert at_once(tid, records, prepared) == expected
    missing = at_once(tid, [(lost, records[0][1])], {})
    assert [(s.service_name, s.scope_name, s.resource) for s in missing] == [("unknown_service", "", {})]


# Statements of assembly's steps that look rows up by a list of ids, with parameters to plan.
_LOOKUPS = {
    "claim": {"owner": "a", "now": 0, "until": 1},
    "release": {"owner": "a"},
    "trace_states": {},
    "traces_for_keys": {},
    "chunks": {},
    "resources": {},
    "previous_summaries": {},
    "delete_flags": {},
    "delete_requests": {},
    "lock_traces": {},
}
_TABLES = ("traces", "trace_keys", "span_chunks", "resources", "requests", "request_flags")


def test_assembly_lookups_by_id_use_indexes(db_url: str) -> None:
    """Every lookup by a list of ids reads its tables through an index: a full scan costs in
    proportion to the history kept, every assembly step (an OR with a subquery once made
    PostgreSQL scan every request row to find a page's previous summaries). PostgreSQL is
    told to avoid full scans wherever it can; one that remains is one no index allows."""
    from railtrace.store.statements import _statements

    store = _store(db_url)
    sqlite = store.sqlite
    q = _statements(sqlite)
    some = [trace_id(i) for i in range(3)]
    with store.engine.begin() as conn:
        if not sqlite:
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        for name, extra in _LOOKUPS.items():
            stmt = getattr(q, name)
            ids = [2**62 + i for i in range(3)] if name == "resources" else some
            compiled = stmt.compile(dialect=conn.dialect)
            params = compiled.construct_params({"ids": listed(ids, sqlite), **extra})
            if sqlite:
                values = tuple(params[k] for k in compiled.positiontup or ())
                rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + str(compiled), values)
                plan = [row[-1] for row in rows]
                scans = [line for line in plan if line.split()[:2] in (["SCAN", t] for t in _TABLES)]
            else:
                plan = [row[0] for row in conn.exec_driver_sql("EXPLAIN " + str(compiled), params)]
                scans = [line for line in plan if any(f"Seq Scan on {t}" in line for t in _TABLES)]
            assert not scans, f"{name} scans a whole table: {plan}"
    store.engine.dispose()


def test_statistics_are_refreshed_when_a_table_outgrows_them(db_url: str) -> None:
    """PostgreSQL: a table holding more than twice the rows its statistics know of (here: never
    analysed) is analysed, once; SQLite has nothing to refresh."""
    store = _store(db_url)
    if store.sqlite:
        assert store.refresh_statistics() == []
        return
    n = 2 * 1000 + 500
    with store.engine.begin() as conn:
        conn.execute(insert(traces), _trace_rows(range(n)))
        keys = [{"request_key": f"key-{i}", "trace_id": trace_id(i)} for i in range(n)]
        conn.execute(insert(trace_keys), keys)
        conn.exec_driver_sql("SELECT pg_stat_force_next_flush()")  # the row counts, at commit
    assert store.refresh_statistics() == ["trace_keys", "traces"]
    with store.engine.connect() as conn:
        known = dict(
            conn.exec_driver_sql(
                "SELECT relname, reltuples FROM pg_class"
                " WHERE oid IN ('traces'::regclass, 'trace_keys'::regclass)"
            ).all()
        )
        # A small sample (statistics target 10: at most 11 histogram bounds, not 101), so the
        # assembler is not held up for long.
        bounds = conn.exec_driver_sql(
            "SELECT array_length(histogram_bounds, 1) FROM pg_stats"
            " WHERE tablename = 'traces' AND attname = 'trace_id'"
        ).scalar()
    assert known == {"traces": n, "trace_keys": n}
    assert bounds is not None and bounds <= 11
    assert store.refresh_statistics() == []  # current: one catalog query, nothing analysed
    # Span chunks: only the trace id is analysed (the bodies' statistics plan nothing and cost
    # most of the time), and autovacuum still counts the rows as not analysed.
    with store.engine.begin() as conn:
        conn.execute(
            insert(span_chunks),
            [
                {"trace_id": trace_id(i), "chunk_id": i, "received_ns": i, "span_count": 1, "body": b"x" * 64}
                for i in range(n)
            ],
        )
        conn.exec_driver_sql("SELECT pg_stat_force_next_flush()")
    assert store.refresh_statistics() == ["span_chunks"]
    with store.engine.connect() as conn:
        columns = conn.exec_driver_sql(
            "SELECT attname FROM pg_stats WHERE tablename = 'span_chunks'"
        ).scalars()
        assert set(columns) == {"trace_id"}
        changes = conn.exec_driver_sql(
            "SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relid = 'span_chunks'::regclass"
        ).scalar()
        assert changes == n
    store.engine.dispose()


def test_the_assembler_refreshes_statistics_every_few_seconds_and_survives_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from railtrace.scheduling import assembler as assembler_module

    url = f"sqlite:///{tmp_path / 'railtrace.db'}"
    store = _store(url)
    settings = settings_for(url)
    assembler = Assembler(store, settings, Metrics(), default_pipeline(settings, TopologyHolder([]).get))
    calls: list[float] = []

    def refresh() -> list[str]:
        calls.append(time.monotonic())
        raise RuntimeError("permission denied for table traces")

    monkeypatch.setattr(store, "refresh_statistics", refresh)
    assembler._housekeeping()
    assembler._housekeeping()  # within the interval: not again
    assert len(calls) == 1
    assert "could not refresh table statistics" in caplog.text
    assembler._last_statistics -= assembler_module.STATISTICS_INTERVAL_S
    assembler._housekeeping()
    assert len(calls) == 2
    store.engine.dispose()


def test_checking_speculative_traces_locks_them_until_commit(db_url: str) -> None:
    """The check before storing a group assembled ahead (`_unchanged`) reads each trace's last
    arrival and holds a lock on it to the end of the storing transaction: an ingest commit
    touching one of those traces meanwhile waits (here: gives up after its lock timeout)."""
    from sqlalchemy import create_engine, update
    from sqlalchemy.exc import OperationalError

    from railtrace.store.leases import _unchanged

    store = _store(db_url)
    with store.engine.begin() as conn:
        conn.execute(insert(traces), _trace_rows(range(2), arrival_ns=5))
    # Another writer, as the ingest writer would be, that gives up after 0.2 s of waiting.
    other = create_engine(db_url, connect_args={"timeout": 0.2}) if store.sqlite else make_engine(db_url)
    with store.engine.begin() as conn:
        assert _unchanged(conn, {trace_id(0): 5, trace_id(1): 4}) == {trace_id(0)}
        with pytest.raises(OperationalError), other.begin() as ingest:
            if not store.sqlite:
                ingest.exec_driver_sql("SET LOCAL lock_timeout = '200ms'")
            ingest.execute(
                update(traces).where(traces.c.trace_id == trace_id(0)).values(last_arrival_ns=9, dirty=True)
            )
    with other.begin() as ingest:  # once committed, the ingest write goes through
        ingest.execute(update(traces).where(traces.c.trace_id == trace_id(0)).values(last_arrival_ns=9))
    other.dispose()
    store.engine.dispose()
