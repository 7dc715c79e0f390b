"""Bulk load for the scale benchmark: the database `railtrace serve` would build from the same
export calls, without HTTP in between.

What runs is the service's own code, in worker processes instead of the server's threads:

- **Insert workers** take the export-call bytes, drop content attributes with the server's
  content filter, build rows with `railtrace.otlp.export.prepare` (the receiver's step, with the
  sender and claims stamp the receiver gives a call from loopback) and
  commit them with `Store.insert_batches` in groups of at most `write_batch_spans` spans (the
  writer's group commit). These are exactly the rows the server's writer commits; only
  `received_ns` (the commit's own clock) differs, as it does between any two server runs.
- **Assembler processes** run `railtrace.scheduling.assembler.Assembler.run_once` with the real
  pipeline (`default_pipeline(settings, topology)`, the simulated fleet's topology, the same
  quiet period), like replicas sharing one database: they lease ready traces with
  `Store.claim_ready`, so each trace is assembled once.

`tests/scale/test_bulk_load.py` loads the same calls once through a running server and once
through this path, on SQLite and PostgreSQL, and compares every stored summary.

Copies of the captured traffic are made by patching bytes (`CopyPlan`): the replay's id and
time rewriting changes only fixed-length fields, so the offsets are found once and each copy
is a handful of vectorised operations instead of a protobuf parse and re-encode per call.
`CopyPlan.copy` returns the same bytes as `copy_calls` in `run.py` (checked at start).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

MASK64 = 2**64 - 1
# Placeholder for the copy's tag while offsets are located (never inside a UUID).
_MARK = "@@@@@@@@"


def salt_of(k: int) -> int:
    return ((k + 1) * 0x9E3779B97F4A7C15) & MASK64


# -- protobuf wire walking (only what the copy needs) -----------------------------------------


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value start, value end) of one message's fields."""
    i = start
    while i < end:
        tag, i = _varint(buf, i)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            _, j = _varint(buf, i)
        elif wire == 1:
            j = i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            j = i + n
        elif wire == 5:
            j = i + 4
        else:
            raise ValueError(f"unexpected wire type {wire}")
        yield field, wire, i, j
        i = j


class CopyPlan:
    """Byte offsets that differ between the captured calls and a copy of them."""

    def __init__(self, calls: Sequence[bytes], retag: Callable[[str, str], str]) -> None:
        self.blob = np.frombuffer(b"".join(calls), dtype=np.uint8)
        self.bounds: list[tuple[int, int]] = []
        xor: list[int] = []  # 8 bytes XORed with the copy's salt (big-endian)
        times: list[int] = []  # fixed64 little-endian times shifted by the copy's offset
        tags: list[int] = []  # 8 ASCII characters replaced by the copy's tag
        self.spans = 0
        trace_ids: set[bytes] = set()
        at = 0
        for raw in calls:
            self.bounds.append((at, at + len(raw)))
            for f, _, a, b in _fields(raw, 0, len(raw)):
                if f != 1:
                    continue
                for f2, _, a2, b2 in _fields(raw, a, b):  # ResourceSpans
                    if f2 != 2:
                        continue
                    for f3, _, a3, b3 in _fields(raw, a2, b2):  # ScopeSpans
                        if f3 == 2:
                            self.spans += 1
                            trace_ids.add(self._span(raw, a3, b3, at, xor, times, tags, retag))
            at += len(raw)
        self.traces = len(trace_ids)
        self.xor = np.asarray(xor, dtype=np.int64)[:, None] + np.arange(8)
        self.times = np.asarray(times, dtype=np.int64)[:, None] + np.arange(8)
        self.tags = np.asarray(tags, dtype=np.int64)[:, None] + np.arange(8)

    @staticmethod
    def _span(
        raw: bytes,
        a: int,
        b: int,
        at: int,
        xor: list[int],
        times: list[int],
        tags: list[int],
        retag: Callable[[str, str], str],
    ) -> bytes:
        """Collect one span's offsets; returns its trace id."""
        trace_id = b""
        for f, wire, s, e in _fields(raw, a, b):
            if f == 1:
                trace_id = raw[s:e]
            if (f == 1 and e - s == 16) or (f in (2, 4) and e - s == 8):
                xor.append(at + s)  # trace_id (its high 64 bits), span_id, parent_span_id
            elif f in (7, 8) and wire == 1:  # start and end time
                times.append(at + s)
            elif f == 11:  # event: its time
                for f2, w2, s2, _ in _fields(raw, s, e):
                    if f2 == 1 and w2 == 1:
                        times.append(at + s2)
            elif f == 9:  # attribute: string values and arrays of them
                for f2, _, s2, e2 in _fields(raw, s, e):
                    if f2 == 2:
                        CopyPlan._value(raw, s2, e2, at, tags, retag, depth=0)
        return trace_id

    @staticmethod
    def _value(
        raw: bytes, a: int, b: int, at: int, tags: list[int], retag: Callable[[str, str], str], depth: int
    ) -> None:
        for f, _, s, e in _fields(raw, a, b):
            if f == 1:  # string_value
                old = raw[s:e].decode()
                new = retag(old, _MARK).encode()
                if len(new) != e - s:
                    raise ValueError("retagging must keep the length")
                i = new.find(_MARK.encode())
                while i >= 0:
                    tags.append(at + s + i)
                    i = new.find(_MARK.encode(), i + 8)
            elif f == 5 and depth == 0:  # array_value: its values
                for f2, _, s2, e2 in _fields(raw, s, e):
                    if f2 == 1:
                        CopyPlan._value(raw, s2, e2, at, tags, retag, depth=1)

    def copy(self, k: int, shift_ns: int) -> list[bytes]:
        """Copy k: ids made unique to it, times shifted by `shift_ns` (as `copy_calls` does)."""
        arr = self.blob.copy()
        salt = np.frombuffer(salt_of(k).to_bytes(8, "big"), dtype=np.uint8)
        arr[self.xor] ^= salt
        if len(self.times):
            t = np.ascontiguousarray(arr[self.times]).view("<u8")
            t += np.uint64(shift_ns & MASK64)
            arr[self.times] = t.view(np.uint8)
        if len(self.tags):
            arr[self.tags] = np.frombuffer(f"{k:08x}".encode(), dtype=np.uint8)
        blob = arr.tobytes()
        return [blob[a:b] for a, b in self.bounds]


# -- the load ---------------------------------------------------------------------------------


def settings_for(db_url: str, topo: Path, quiet_period_s: float) -> Any:
    from railtrace.settings import Settings

    return Settings(db=db_url, topology=[str(topo)], quiet_period_s=quiet_period_s)


def migrate_db(db_url: str) -> None:
    from railtrace.store import make_engine, migrate

    engine = make_engine(db_url)
    try:
        migrate(engine)
    finally:
        engine.dispose()


class Inserter:
    """The receiver's and the writer's steps for a list of export calls, in this process."""

    def __init__(self, db_url: str, batch_spans: int = 4096) -> None:
        from railtrace.otlp.content import content_filter
        from railtrace.server.senders import sender_of, trusted_networks
        from railtrace.settings import Settings
        from railtrace.store import Store, make_engine

        settings = Settings(db=db_url)
        self.engine = make_engine(db_url)
        self.store = Store(self.engine)
        self.filter = content_filter(settings.drop_attributes)
        self.batch_spans = batch_spans or settings.write_batch_spans
        # Who the receiver would say sent the calls, and who vouches for their k8s.* claims: a
        # loader on this machine posts from loopback, under the service's settings.
        self.sender = sender_of(
            "127.0.0.1",
            (),
            trusted_networks(settings.trusted_proxies),
            trusted_networks(settings.trusted_collectors),
        )

    def insert(self, calls: Sequence[bytes]) -> tuple[int, int]:
        """Commit the calls' spans (group commits of up to `batch_spans`); (inserted, duplicates)."""
        from railtrace.otlp.export import prepare

        media = "application/x-protobuf"
        inserted = duplicates = 0
        group: list[Any] = []
        size = 0
        for raw in calls:
            batch = prepare(
                self.filter.apply(raw, media),
                media,
                content_free=self.filter.covers_content,
                sender=self.sender.address,
                claims=self.sender.claims,
            )
            if group and size + len(batch) > self.batch_spans:
                r = self.store.insert_batches(group)
                inserted, duplicates = inserted + r.inserted, duplicates + r.duplicates
                group, size = [], 0
            group.append(batch)
            size += len(batch)
        if group:
            r = self.store.insert_batches(group)
            inserted, duplicates = inserted + r.inserted, duplicates + r.duplicates
        return inserted, duplicates

    def close(self) -> None:
        self.engine.dispose()


def assemble_until(db_url: str, topo: Path, quiet_period_s: float, stop: Callable[[], bool]) -> None:
    """Run the real assembler's rounds (`run_once`, full batches) until `stop()` is true."""
    from railtrace.metrics import Metrics
    from railtrace.scheduling.assembler import FULL_BATCH, Assembler, default_pipeline
    from railtrace.store import Store, make_engine
    from railtrace.topology import TopologyHolder

    settings = settings_for(db_url, topo, quiet_period_s)
    holder = TopologyHolder([str(topo)])
    engine = make_engine(db_url)
    assembler = Assembler(Store(engine), settings, Metrics(), default_pipeline(settings, holder.get))
    try:
        while not stop():
            if not assembler.run_once(limit=FULL_BATCH):
                time.sleep(assembler.look_interval_s)  # the service's own pace between looks
    finally:
        engine.dispose()


def _assembler_main(db_url: str, topo: str, quiet: float, stop: Any) -> None:
    assemble_until(db_url, Path(topo), quiet, stop.is_set)


_WORKER: dict[str, Any] = {}


def _worker_init(db_url: str, plan: CopyPlan, halt: Any, max_backlog: int) -> None:
    _WORKER["inserter"] = Inserter(db_url)
    _WORKER["plan"] = plan
    _WORKER["halt"] = halt
    _WORKER["max_backlog"] = max_backlog


def _worker_copy(job: tuple[int, int]) -> tuple[int, int, int]:
    k, shift = job
    if _WORKER["halt"].is_set():  # past the deadline: copies not started are skipped
        return k, 0, 0
    # Insert no further ahead of assembly than `max_backlog` traces, as a server that keeps up
    # would; a deadline then never leaves a long tail of assembly behind it.
    while dirty_count(_WORKER["inserter"].engine) > _WORKER["max_backlog"] and not _WORKER["halt"].is_set():
        time.sleep(0.5)
    inserted, dup = _WORKER["inserter"].insert(_WORKER["plan"].copy(k, shift))
    return k, inserted, dup


def dirty_count(engine: Any) -> int:
    from railtrace.store import Store

    return Store(engine).count_dirty()


def rss_tree_mb(pids: Sequence[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
        except OSError:
            pass
    return total


def autovacuum_off(engine: Any) -> bool:
    """True when `engine` is a PostgreSQL server whose autovacuum daemon is switched off."""
    if engine.dialect.name != "postgresql":
        return False
    from sqlalchemy import text

    with engine.connect() as conn:
        return str(conn.execute(text("SHOW autovacuum")).scalar_one()).lower() == "off"


def vacuum_analyze(engine: Any) -> None:
    """What autovacuum would do after a large load: VACUUM ANALYZE every railtrace table."""
    from railtrace.store.schema import metadata

    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in metadata.sorted_tables:
            conn.exec_driver_sql(f"VACUUM (ANALYZE) {table.name}")


class BulkLoad:
    """Insert workers and assembler processes on one database, driven segment by segment.

    On a PostgreSQL server with autovacuum off (as test servers often are) the loader runs
    `VACUUM (ANALYZE)` itself every `vacuum_every_s` while it loads, standing in for the daemon
    a production server runs: without it the planner has no statistics for tables that grew
    from empty, and the heavily updated `traces` table keeps its dead rows.
    """

    def __init__(
        self,
        db_url: str,
        topo: Path,
        plan: CopyPlan,
        *,
        workers: int,
        assemblers: int,
        quiet_period_s: float,
        start_method: str = "spawn",
        vacuum_every_s: float = 60.0,
        max_backlog: int = 10_000,
    ) -> None:
        from railtrace.store import make_engine

        migrate_db(db_url)
        self.db_url, self.topo, self.plan, self.quiet = db_url, topo, plan, quiet_period_s
        self.ctx = mp.get_context(start_method)
        self.stop = self.ctx.Event()
        self.assemblers = [
            self.ctx.Process(target=_assembler_main, args=(db_url, str(topo), quiet_period_s, self.stop))
            for _ in range(assemblers)
        ]
        for p in self.assemblers:
            p.start()
        self.halt = self.ctx.Event()
        self.pool = self.ctx.Pool(
            workers, initializer=_worker_init, initargs=(db_url, plan, self.halt, max_backlog)
        )
        self.engine = make_engine(db_url)
        self.vacuum = autovacuum_off(self.engine)
        self.vacuum_every_s = vacuum_every_s
        self.vacuums = 0
        self._last_vacuum = time.monotonic()
        self.inserted = self.duplicates = self.copies = 0
        self.peak_rss_mb = 0.0
        self.t0 = time.perf_counter()

    def pids(self) -> list[int]:
        kids = [p.pid for p in self.assemblers if p.pid]
        kids += [p.pid for p in getattr(self.pool, "_pool", []) if p.pid]
        return [os.getpid(), *kids]

    def load(
        self,
        jobs: Sequence[tuple[int, int]],
        total_copies: int,
        label: str,
        report_every: float = 0.05,
        deadline: float | None = None,
    ) -> bool:
        """Insert these copies, then wait until every trace is assembled; progress every few %.
        Past `deadline` (epoch seconds) copies not yet started are skipped; returns False then.
        With one worker the copies go in order, so the ones loaded are always the first ones."""
        step = max(1, int(total_copies * report_every))
        complete = True
        for _, inserted, dup in self.pool.imap_unordered(_worker_copy, jobs):
            if deadline is not None and time.time() > deadline and not self.halt.is_set():
                print(f"  {label}: deadline reached, loading no further copies", flush=True)
                self.halt.set()
            if not inserted and not dup:
                complete = False
                continue
            self.inserted += inserted
            self.duplicates += dup
            self.copies += 1
            if self.copies % step == 0:
                self._progress(label, total_copies)
            self.maybe_vacuum()
        last = 0.0
        while True:
            dirty = dirty_count(self.engine)
            if dirty == 0:
                break
            if time.monotonic() - last >= 30:
                last = time.monotonic()
                self._progress(label, total_copies, dirty)
            self.maybe_vacuum()
            time.sleep(1)
        self.maybe_vacuum(force=True)
        self._progress(label, total_copies, 0)
        return complete

    def maybe_vacuum(self, force: bool = False) -> None:
        if self.vacuum and (force or time.monotonic() - self._last_vacuum >= self.vacuum_every_s):
            vacuum_analyze(self.engine)
            self.vacuums += 1
            self._last_vacuum = time.monotonic()

    def _progress(self, label: str, total: int, dirty: int | None = None) -> None:
        el = time.perf_counter() - self.t0
        rss = rss_tree_mb(self.pids())
        self.peak_rss_mb = max(self.peak_rss_mb, rss)
        rate = self.inserted / el if el else 0.0
        waiting = dirty if dirty is not None else dirty_count(self.engine)
        done_traces = self.copies * self.plan.traces - waiting
        trace_rate = done_traces / el if el else 0.0
        left_traces = total * self.plan.traces - done_traces
        eta = left_traces / trace_rate if trace_rate else 0.0
        print(
            f"  {label}: {self.copies}/{total} copies, {self.inserted:,} spans inserted "
            f"({rate:,.0f}/s), {done_traces:,} traces assembled ({trace_rate:,.0f}/s), {el:.0f} s, "
            f"{waiting:,} waiting, ETA {eta:.0f} s, RSS {rss:.0f} MB (all load processes), "
            f"load {os.getloadavg()[0]:.1f}",
            flush=True,
        )

    def close(self) -> None:
        self.stop.set()
        self.pool.close()
        self.pool.join()
        for p in self.assemblers:
            p.join(60)
            if p.is_alive():
                p.terminate()
        self.engine.dispose()
