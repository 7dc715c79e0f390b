"""The per-hour stats rollup, on SQLite and PostgreSQL: after random sequences of assemblies,
re-assemblies (late spans), stitched traces superseding others and retention deletes,
`Store.stats` over random windows equals a plain aggregation of the stored request rows; the
migration's backfill of a database that already holds requests gives the same answers.

Means are compared with a relative tolerance of 1e-9: the rollup keeps float sums that are
added to and subtracted from, so they may differ from a fresh AVG in the last bits.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, insert, select

from railtrace.model import Flag, KVSummary, RequestSummary, rfc3339
from railtrace.store import Store, make_engine, migrate
from railtrace.store import rollup as rollup_module
from railtrace.store.engine import alembic_config
from railtrace.store.quantiles import quantile, ttft_quantiles
from railtrace.store.rollup import HOUR_NS, RELATIVE_ERROR
from railtrace.store.schema import request_flags, requests, stats_hourly, traces, ttft_hourly

T0 = 1_790_000_000 // 86_400 * 86_400 * 10**9  # a midnight, UTC
DAYS = 3
FLAGS = ["tcp_fallback", "cross_rail", "slow_kv_transfer", "broken_trace"]
NODES = [None, "", "node-a", "node-b"]
LEVELS = [None, "host", "rail"]
PATHS = ["tcp", "rdma_same_rail", "nvlink"]
GROUPS = ("flag", "path_class", "pair")
LATER_REQUEST_COLUMNS = frozenset({"coverage", "resolution", "trace_of"})  # 0009, 0012


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    e = make_engine(db_url)
    migrate(e)
    yield e
    e.dispose()


def random_start(rng: random.Random) -> int:
    """Mostly random instants in a few busy hours, some exactly on an hour boundary."""
    hour = (
        T0 + rng.randrange(DAYS * 24) * HOUR_NS
        if rng.random() < 0.5
        else T0 + rng.choice([5, 6, 30]) * HOUR_NS
    )
    if rng.random() < 0.15:
        return hour
    return hour + rng.randrange(HOUR_NS // 10**6) * 10**6


def random_summary(rng: random.Random, trace_id: str, trace_ids: list[str] | None = None) -> RequestSummary:
    path = rng.choice(PATHS)
    kv = (
        None
        if rng.random() < 0.2
        else KVSummary(
            transport="tcp" if path == "tcp" else "rdma",
            path_class=path,
            bytes=1 << 20,
            duration_s=None if rng.random() < 0.2 else rng.uniform(0.001, 2.0),
        )
    )
    return RequestSummary(
        trace_id=trace_id,
        request_id=f"req-{trace_id[-6:]}",
        model="llama",
        start=rfc3339(random_start(rng)),
        ttft_s=None if rng.random() < 0.2 else rng.uniform(0.01, 3.0),
        e2e_s=1.0,
        breakdown_s={},
        prefill={"pod": "p", "node": rng.choice(NODES), "gpu": None, "nic": None, "rail": None},
        decode={"pod": "d", "node": rng.choice(NODES), "gpu": None, "nic": None, "rail": None},
        kv_transfer=kv,
        flags=[Flag(f, "evidence", None) for f in FLAGS if rng.random() < 0.35],
        trace_ids=trace_ids or [trace_id],
        pairing_level=rng.choice(LEVELS),
    )


def add_traces(engine: Engine, ids: list[str], arrival_ns: int) -> None:
    """Trace rows for retention to find (as ingest would have written them)."""
    with engine.begin() as conn:
        conn.execute(
            insert(traces),
            [
                {
                    "trace_id": tid,
                    "first_arrival_ns": arrival_ns,
                    "last_arrival_ns": arrival_ns,
                    "span_count": 1,
                    "has_root": True,
                    "dirty": True,
                    "late_spans": 0,
                }
                for tid in ids
            ],
        )


def run_history(engine: Engine, rng: random.Random, steps: int = 40) -> None:
    """A random sequence of what the assembler and retention do to the request rows."""
    store = Store(engine)
    live: list[str] = []
    last: dict[str, RequestSummary] = {}
    serial = 0
    for step in range(steps):
        op = rng.random()
        if op < 0.45 or len(live) < 4:  # new requests (sometimes two under one primary trace)
            ids = [f"{serial + i:032x}" for i in range(rng.randint(1, 25))]
            serial += len(ids)
            add_traces(engine, ids, step)
            summaries = [random_summary(rng, tid) for tid in ids]
            if rng.random() < 0.2:
                summaries.append(random_summary(rng, ids[0]))
            store.save_assembly(summaries, {tid: step for tid in ids}, (), step)
            live += ids
            last.update((x.trace_id, x) for x in reversed(summaries))
        elif op < 0.7:  # late spans: the same requests assembled again, some values changed
            again = rng.sample(live, min(len(live), rng.randint(1, 10)))
            summaries = [last[t] if rng.random() < 0.3 else random_summary(rng, t) for t in again]
            store.save_assembly(summaries, {}, (), step)  # (30 %: nothing changed but the spans)
            last.update((x.trace_id, x) for x in summaries)
        elif op < 0.85:  # a trace stitched into another request: its own row is superseded
            primary, other = rng.sample(live, 2)
            last[primary] = random_summary(rng, primary, [primary, other])
            store.save_assembly([last[primary]], {}, [other], step)
            live.remove(other)
        else:  # retention: every trace that arrived before some step
            cutoff = rng.randint(0, step)
            while store.delete_older_than(cutoff, batch=rng.randint(1, 30)):
                pass
            with engine.connect() as conn:
                kept = set(conn.execute(select(traces.c.trace_id)).scalars())
            live = [t for t in live if t in kept]


def reference(engine: Engine, group_by: str, since: int | None, until: int | None) -> dict[Any, Any]:
    """The answer from the request rows themselves, aggregated in Python."""
    with engine.connect() as conn:
        reqs = {r.trace_id: r for r in conn.execute(select(requests))}
        flag_rows = conn.execute(select(request_flags)).all()
    items: list[tuple[tuple[Any, ...], int, Any]] = []
    if group_by == "flag":
        items = [((f.flag,), f.start_ns, reqs[f.trace_id]) for f in flag_rows if f.trace_id in reqs]
    else:
        for r in reqs.values():
            key = (
                (r.path_class,)
                if group_by == "path_class"
                else (r.prefill_node, r.decode_node, r.pairing_level)
            )
            items.append((key, r.start_ns, r))
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for key, start, r in items:
        if (since is None or start >= since) and (until is None or start < until):
            g = groups.setdefault(key, [0, [], []])
            g[0] += 1
            if r.ttft_s is not None:
                g[1].append(r.ttft_s)
            if r.kv_duration_s is not None:
                g[2].append(r.kv_duration_s)
    return {
        k: (n, sum(t) / len(t) if t else None, sum(v) / len(v) if v else None)
        for k, (n, t, v) in groups.items()
    }


def answered(store: Store, group_by: str, since: int | None, until: int | None) -> dict[Any, Any]:
    out = store.stats(group_by, since, until)
    counts = [g["requests"] for g in out]
    assert counts == sorted(counts, reverse=True), "largest groups first"
    names = ("prefill_node", "decode_node", "pairing_level") if group_by == "pair" else (group_by,)
    got = {
        tuple(g[n] for n in names): (g["requests"], g["ttft_s_mean"], g["kv_duration_s_mean"]) for g in out
    }
    assert len(got) == len(out), "one entry per group"
    return got


def close(a: float | None, b: float | None) -> bool:
    return a == b if a is None or b is None else a == pytest.approx(b, rel=1e-9, abs=1e-12)


def same(got: dict[Any, Any], want: dict[Any, Any]) -> bool:
    return got.keys() == want.keys() and all(
        got[k][0] == want[k][0] and close(got[k][1], want[k][1]) and close(got[k][2], want[k][2])
        for k in want
    )


def windows(rng: random.Random) -> Iterator[tuple[int | None, int | None]]:
    """Edges inside hours, on hour boundaries, whole days, open ends, empty and one-hour windows."""
    span = (DAYS + 1) * 24 * HOUR_NS
    yield None, None
    yield T0, None
    yield None, T0 + 30 * HOUR_NS
    yield T0 + 5 * HOUR_NS, T0 + 5 * HOUR_NS  # empty
    yield T0 + DAYS * 86_400 * 10**9, T0 + (DAYS + 1) * 86_400 * 10**9  # a day with nothing in it
    for d in range(DAYS):
        yield T0 + d * 86_400 * 10**9, T0 + (d + 1) * 86_400 * 10**9
    yield T0 + 5 * HOUR_NS + 1, T0 + 6 * HOUR_NS - 1  # inside one hour
    yield T0 + 5 * HOUR_NS + HOUR_NS // 2, T0 + 6 * HOUR_NS + HOUR_NS // 3  # across one boundary
    for _ in range(12):
        a, b = sorted(T0 - HOUR_NS + rng.randrange(span) for _ in range(2))
        yield a, b
        yield a - a % HOUR_NS, b  # since on an hour boundary
        yield a, None
        yield None, b


def mismatches(engine: Engine, rng: random.Random) -> list[str]:
    store = Store(engine)
    bad = []
    for since, until in windows(rng):
        for g in GROUPS:
            got, want = answered(store, g, since, until), reference(engine, g, since, until)
            if not same(got, want):
                bad.append(f"{g} [{since}, {until}): got {got}, want {want}")
    return bad


def ttft_reference(engine: Engine, dim: str, since: int | None, until: int | None) -> dict[Any, Any]:
    """Per group: requests, with a TTFT, and the exact nearest-rank p50/p90/p99 of the rows."""
    with engine.connect() as conn:
        rows = conn.execute(select(requests.c.start_ns, requests.c.ttft_s, requests.c[dim])).all()
    groups: dict[Any, list[Any]] = {}
    for start, ttft, key in rows:
        if (since is None or start >= since) and (until is None or start < until):
            g = groups.setdefault(key, [0, []])
            g[0] += 1
            if ttft is not None:
                g[1].append(ttft)
    return {
        k: (n, len(v), *(quantile(sorted(v), q) if v else None for q in (0.5, 0.9, 0.99)))
        for k, (n, v) in groups.items()
    }


def ttft_mismatches(engine: Engine, rng: random.Random) -> list[str]:
    store = Store(engine)
    bad = []
    for since, until in windows(rng):
        body = ttft_quantiles(store, since, until)
        for dim in ("path_class", "pairing_level"):
            got = {
                g[dim]: (g["requests"], g["with_ttft"], g["ttft_s_p50"], g["ttft_s_p90"], g["ttft_s_p99"])
                for g in body[dim]
            }
            want = ttft_reference(engine, dim, since, until)
            ok = got.keys() == want.keys() and all(
                got[k][:2] == want[k][:2]
                and all(
                    (a is None) == (b is None) and (a is None or abs(a - b) <= RELATIVE_ERROR * b)
                    for a, b in zip(got[k][2:], want[k][2:], strict=True)
                )
                for k in want
            )
            if not ok:
                bad.append(f"{dim} [{since}, {until}): got {got}, want {want}")
    return bad


def ttft_rows(engine: Engine) -> dict[tuple[Any, ...], int]:
    t = ttft_hourly
    with engine.connect() as conn:
        return {tuple(r[:5]): r[5] for r in conn.execute(select(t))}


def rollup_rows(engine: Engine) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    t = stats_hourly
    with engine.connect() as conn:
        return {tuple(r[:6]): tuple(r[6:]) for r in conn.execute(select(t))}


def before_coverage(rows: dict[tuple[Any, ...], tuple[Any, ...]]) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    return {k: v for k, v in rows.items() if k[0] != "coverage"}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_stats_from_the_rollup_equal_the_request_rows(engine: Engine, seed: int) -> None:
    rng = random.Random(seed)
    run_history(engine, rng)
    with engine.connect() as conn:
        assert conn.execute(select(requests.c.trace_id)).first() is not None, "the history left requests"
    assert mismatches(engine, rng) == []
    kept = rollup_rows(engine)
    assert all(v[0] > 0 for v in kept.values()), "rows that reached zero requests are gone"
    with engine.begin() as conn:
        rollup_module.rebuild(conn)
    rebuilt = rollup_rows(engine)
    assert kept.keys() == rebuilt.keys()
    for k, (n, ttft, ttft_n, kv, kv_n) in rebuilt.items():
        assert kept[k][0::2] == (n, ttft_n, kv_n)
        assert close(kept[k][1], ttft) and close(kept[k][3], kv)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ttft_quantiles_from_the_histograms_match_the_request_rows(engine: Engine, seed: int) -> None:
    """Counts exactly, p50/p90/p99 within 1 % of the rows' own nearest rank, over the same
    windows (edges inside hours, whole days, open ends); the kept histograms equal a rebuild."""
    rng = random.Random(seed)
    run_history(engine, rng)
    assert ttft_mismatches(engine, rng) == []
    kept = ttft_rows(engine)
    assert kept and all(n > 0 for n in kept.values()), "buckets that reached zero are gone"
    with engine.begin() as conn:
        assert rollup_module.rebuild_ttft(conn) > 0
    assert ttft_rows(engine) == kept


def test_the_comparison_fails_when_replaced_rows_are_not_subtracted(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above can fail: a rollup that never subtracts disagrees with the rows."""
    monkeypatch.setattr(rollup_module.RollupDelta, "removed", lambda self, requests, flags: None)
    rng = random.Random(1)
    run_history(engine, rng)
    assert mismatches(engine, rng)
    assert ttft_mismatches(engine, rng)


def test_a_removed_group_leaves_no_row(engine: Engine) -> None:
    rng = random.Random(5)
    store = Store(engine)
    add_traces(engine, ["a" * 32], 0)
    store.save_assembly([random_summary(rng, "a" * 32)], {}, (), 1)
    assert rollup_rows(engine)
    assert store.delete_older_than(1) == 1
    assert rollup_rows(engine) == {} and ttft_rows(engine) == {}
    assert all(store.stats(g, None, None) == [] for g in GROUPS)


def test_backfill_of_a_database_with_requests(new_database: Callable[[str], str], db_url: str) -> None:
    """Upgrade from 0002 with request rows already stored: the rollup is built from them, and
    the answers are those of a database that kept it from the start; downgrade drops it."""
    kind = "sqlite" if db_url.startswith("sqlite") else "postgresql"
    rng = random.Random(11)
    kept = make_engine(db_url)
    migrate(kept)
    run_history(kept, rng, steps=25)
    with kept.connect() as conn:
        # Columns added after 0002 (0009: coverage, resolution; 0012: trace_of) are not there yet.
        req_rows = [
            {k: v for k, v in r._mapping.items() if k not in LATER_REQUEST_COLUMNS}
            for r in conn.execute(select(requests))
        ]
        # 0010 repeats the sort keys in the flag rows (and fills them from the requests).
        flag_rows = [
            {k: v for k, v in r._mapping.items() if k not in ("ttft_s", "kv_duration_s")}
            for r in conn.execute(select(request_flags))
        ]
    old = make_engine(new_database(kind))
    cfg = alembic_config()
    with old.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0002")
        conn.execute(insert(requests), req_rows)
        conn.execute(insert(request_flags), flag_rows)
    migrate(old)
    try:
        # Rows stored before 0009 have no coverage, so only the older dimensions can match.
        assert before_coverage(rollup_rows(old)).keys() == before_coverage(rollup_rows(kept)).keys()
        assert ttft_rows(old) == ttft_rows(kept)  # 0011's backfill: what upkeep kept all along
        for since, until in windows(rng):
            for g in GROUPS:
                got = answered(Store(old), g, since, until)
                assert same(got, answered(Store(kept), g, since, until))
                assert same(got, reference(old, g, since, until))
        with old.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0002")
        with old.connect() as conn:
            assert not old.dialect.has_table(conn, "stats_hourly")
            assert not old.dialect.has_table(conn, "ttft_hourly")
    finally:
        old.dispose()
        kept.dispose()


def test_replicas_updating_the_same_hours_lose_nothing_and_never_deadlock(db_url: str) -> None:
    """Four replicas sharing one database add to the same rollup rows at once (the busy hours):
    every increment lands, and none waits on another in a cycle (PostgreSQL would raise a
    deadlock; with the rows upserted in any other than one fixed order it does here)."""
    engines = [make_engine(db_url) for _ in range(4)]
    migrate(engines[0])
    errors: list[BaseException] = []

    def replica(i: int) -> None:
        rng, store, mine = random.Random(i), Store(engines[i]), []
        try:
            for step in range(30):
                ids = [f"{i:02x}{step:04x}{j:026x}" for j in range(20)]
                again = rng.sample(mine, min(5, len(mine)))
                store.save_assembly([random_summary(rng, t) for t in ids + again], {}, (), step)
                mine += ids
        except BaseException as exc:  # reported below, in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=replica, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert mismatches(engines[0], random.Random(0)) == []
    finally:
        for e in engines:
            e.dispose()
