"""Verdict latency and resident memory of `railtrace serve` under ingest load.

    .venv/bin/python -m benchmarks.verdicts.run [--db sqlite|postgresql] [--seconds 60] [--rate SPANS_S]
    .venv/bin/python -m benchmarks.verdicts.run --memory [--memory-seconds 180] [--quiet-period 30]

Latency mode: finds the maximum ingest rate (realistic 8-span P/D requests, 512 spans per
export call, `--clients` connections flat out for `--calibrate-seconds`; or takes `--rate`),
then offers half of it open loop (each export call sent at its scheduled time, whatever the
server does) for `--seconds`. For every `--sample`-th request it records when the export call
carrying its spans was acknowledged and polls `GET /api/v1/requests/{trace_id}` until the
summary is there. Verdict latency = queryable - acknowledged. It also reads
`llm_d_tracing_assembly_lag_seconds` and `llm_d_tracing_requests_total` from `/metrics`.

Memory mode: the maximum ingest flat out for `--memory-seconds` with a long quiet period (the
assembly window), sampling the server's resident memory every second, then while the backlog
drains.

Each run starts its own server process on a throwaway database. Not a test: the figures depend
on the machine and its load, which are printed with them.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import http.client
import json
import os
import platform
import random
import re
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sqlalchemy import text

from benchmarks.common.databases import Database
from benchmarks.common.harness import PROTOBUF, cpu_seconds, export, rss_mb, serve_process
from benchmarks.common.payload import SPANS_PER_TRACE, export_calls
from railtrace.cli import assembly_process_arg
from railtrace_tracing import semconv

SPANS_PER_CALL = 512
TRACES_PER_CALL = SPANS_PER_CALL // SPANS_PER_TRACE
LAG = semconv.M_ASSEMBLY_LAG
REQUESTS = semconv.M_REQUESTS
PENDING = semconv.M_PENDING
QUEUE = semconv.M_INGEST_QUEUE
FLAGS = semconv.M_FLAGS


# -- payload -----------------------------------------------------------------------------------


class Calls:
    """An endless supply of distinct export calls, cut from a few of the ingest benchmark's
    calls by giving every request a new trace id and request id (same lengths, so the protobuf
    stays valid). Building one costs about a millisecond, so calls can be made while sending.
    """

    def __init__(self, seed: int = 1, templates: int = 16) -> None:
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.templates = [
            self._template(call) for call in export_calls(templates * SPANS_PER_CALL, seed=seed)
        ]
        self.n = 0

    @staticmethod
    def _template(call: bytes) -> tuple[list[bytes], list[tuple[int, int]]]:
        """The call cut into pieces around every trace id and request id: (pieces, holes) where
        hole i is (request index, 0 for the trace id or 1 for the request id)."""
        req = ExportTraceServiceRequest.FromString(call)
        tids: dict[bytes, int] = {}
        rids: dict[bytes, int] = {}
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    i = tids.setdefault(span.trace_id, len(tids))
                    for kv in span.attributes:
                        if kv.key == "llm_d.pd_proxy.request_id":
                            rids[kv.value.string_value.encode()] = i
        if len(tids) != TRACES_PER_CALL or len(rids) != TRACES_PER_CALL:
            raise RuntimeError("unexpected payload shape")
        spots: list[tuple[int, int, int, int]] = []
        for tokens, kind in ((tids, 0), (rids, 1)):
            for token, i in tokens.items():
                at = call.find(token)
                while at >= 0:
                    spots.append((at, len(token), i, kind))
                    at = call.find(token, at + len(token))
        spots.sort()
        pieces, holes, pos = [], [], 0
        for at, length, i, kind in spots:
            if at < pos:
                raise RuntimeError("overlapping ids in the payload")
            pieces.append(call[pos:at])
            holes.append((i, kind))
            pos = at + length
        pieces.append(call[pos:])
        return pieces, holes

    def next(self) -> tuple[bytes, list[str]]:
        """(serialised call, trace ids of its requests in hex)."""
        with self.lock:
            pieces, holes = self.templates[self.n % len(self.templates)]
            self.n += 1
            tids = [self.rng.getrandbits(128).to_bytes(16, "big") for _ in range(TRACES_PER_CALL)]
            rids = [f"{self.rng.getrandbits(128):032x}".encode() for _ in range(TRACES_PER_CALL)]
        out = [pieces[0]]
        for (i, kind), piece in zip(holes, pieces[1:], strict=True):
            out.append(tids[i] if kind == 0 else rids[i])
            out.append(piece)
        return b"".join(out), [t.hex() for t in tids]


# -- measuring -----------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between closest ranks; nan for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": pct(values, 50),
        "p90": pct(values, 90),
        "p99": pct(values, 99),
        "max": max(values) if values else float("nan"),
    }


def scrape(client: httpx.Client) -> dict[str, Any]:
    """The figures this benchmark reads from `/metrics`.

    Only the lines of these five families are parsed (text format: `name{labels} value`):
    parsing the whole exposition ten times a second cost this process more CPU than
    anything else it does, on the machine whose CPU it measures.
    """
    out: dict[str, Any] = {"requests": 0.0, "pending": None, "queue": None, "lag": {}, "flags": {}}
    body = client.get("/metrics").text
    for line in body.splitlines():
        if not line.startswith(WANTED):
            continue
        name, labels, value = _sample(line)
        if name == REQUESTS:
            out["requests"] += value
        elif name == PENDING:
            out["pending"] = value
        elif name == QUEUE:
            out["queue"] = value
        elif name == LAG + "_bucket":
            le = float(labels["le"])
            out["lag"][le] = out["lag"].get(le, 0.0) + value
        elif name == FLAGS:
            flag = labels.get("flag", "?")
            out["flags"][flag] = out["flags"].get(flag, 0.0) + value
    return out


WANTED = (REQUESTS, PENDING, QUEUE, LAG + "_bucket", FLAGS)
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _sample(line: str) -> tuple[str, dict[str, str], float]:
    """One sample line of the Prometheus text format (no timestamps or exemplars here)."""
    if "{" in line:
        name, _, rest = line.partition("{")
        labels_text, _, value = rest.rpartition("}")
        labels = dict(LABEL.findall(labels_text))
    else:
        name, _, value = line.partition(" ")
        labels = {}
    return name, labels, float(value.split()[0])


def histogram_quantile(buckets: dict[float, float], q: float) -> float:
    """Quantile q (0-1) from cumulative buckets, linear within a bucket (as Prometheus does)."""
    edges = sorted(buckets)
    total = buckets.get(float("inf"), 0.0)
    if not total:
        return float("nan")
    rank = q * total
    prev_edge, prev_count = 0.0, 0.0
    for edge in edges:
        count = buckets[edge]
        if count >= rank:
            if edge == float("inf"):
                return prev_edge  # above the top bucket: its lower edge, as Prometheus does
            if count == prev_count:
                return edge
            return prev_edge + (edge - prev_edge) * (rank - prev_count) / (count - prev_count)
        prev_edge, prev_count = edge, count
    return float("nan")


def histogram_bucket(buckets: dict[float, float], q: float) -> list[float]:
    """The bucket (lower edge, upper edge] holding quantile q: how far to trust the estimate."""
    total = buckets.get(float("inf"), 0.0)
    prev = 0.0
    for edge in sorted(buckets):
        if total and buckets[edge] >= q * total:
            return [prev, edge]
        prev = edge
    return [float("nan"), float("nan")]


def histogram_fraction_over(buckets: dict[float, float], limit: float) -> float:
    """Share of observations above `limit`, linear within the bucket holding it."""
    total = buckets.get(float("inf"), 0.0)
    if not total:
        return float("nan")
    prev_edge, prev_count = 0.0, 0.0
    for edge in sorted(buckets):
        count = buckets[edge]
        if edge >= limit:
            if edge == float("inf"):
                below = prev_count
            else:
                below = prev_count + (count - prev_count) * (limit - prev_edge) / (edge - prev_edge)
            return 1 - below / total
        prev_edge, prev_count = edge, count
    return 0.0


def load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def tree(pid: int) -> list[int]:
    """The process and its descendants (the service's assembly children, if any)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return out


def assembly_children(pid: int) -> int:
    """The service's assembly processes: its descendants started by multiprocessing's spawn
    (not its resource tracker), by their command line."""
    n = 0
    for p in tree(pid)[1:]:
        with contextlib.suppress(OSError):
            n += b"multiprocessing.spawn" in Path(f"/proc/{p}/cmdline").read_bytes()
    return n


def status_mb(pid: int) -> dict[str, float]:
    """RSS and its parts (anonymous, file-backed, shared memory) and the peak, in MB, summed over
    the process and its children (the peak as the sum of each one's peak: an upper bound), and
    `Pss`: the sum of each process's proportional share, which counts a page the processes share
    (the interpreter, libraries) once, as a container's memory accounting does; summed RSS
    counts it once per process."""
    out: dict[str, float] = {}
    for p in tree(pid):
        for source, keys in (
            ("status", ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")),
            ("smaps_rollup", ("Pss",)),
        ):
            try:
                for line in Path(f"/proc/{p}/{source}").read_text().splitlines():
                    key = line.split(":", 1)[0]
                    if key in keys:
                        out[key] = out.get(key, 0.0) + int(line.split()[1]) / 1024
            except OSError:
                pass
    return out


def tree_rss(pid: int) -> float:
    return status_mb(pid).get("VmRSS", 0.0)


def tree_cpu(pid: int) -> float:
    """CPU seconds of the process and its live children."""
    total = 0.0
    for p in tree(pid):
        with contextlib.suppress(OSError):
            total += cpu_seconds(p)
    return total


def serve(database: Any, quiet: float, args: argparse.Namespace) -> Any:
    """`railtrace serve` on the database, with `--assembly-processes` if given (else its default)."""
    given = args.assembly_processes is not None
    env = {"RAILTRACE_ASSEMBLY_PROCESSES": str(args.assembly_processes)} if given else None
    return serve_process(database.url, database.tmp, quiet, extra_env=env)


def sqlite_connections(pid: int, db_file: str) -> int:
    """Open SQLite connections of the process: descriptors on the database file itself."""
    n = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == db_file:
                    n += 1
            except OSError:
                pass
    except OSError:
        pass
    return n


def flat_out(
    base: str,
    calls: Calls,
    clients: int,
    seconds: float,
    tick: Callable[[float, int], None] | None = None,
) -> dict[str, Any]:
    """`clients` connections sending calls back to back for `seconds`; acknowledgement times."""
    acks: list[float] = []
    retries = [0]
    errors: list[str] = []
    t0 = time.monotonic()
    stop = t0 + seconds

    def worker() -> None:
        try:
            with httpx.Client(base_url=base, timeout=300, headers={"content-type": PROTOBUF}) as client:
                while time.monotonic() < stop:
                    body, _ = calls.next()
                    retries[0] += export(client, body)
                    acks.append(time.monotonic() - t0)
        except Exception as exc:  # reported below; the other clients go on
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(clients)]
    for th in threads:
        th.start()
    while any(th.is_alive() for th in threads):
        time.sleep(1.0)
        if tick:
            tick(time.monotonic() - t0, len(acks))
    if errors:
        raise RuntimeError(f"export failed: {errors[:3]}")
    return {"acks": sorted(acks), "retries": retries[0], "elapsed": time.monotonic() - t0}


def acked_rate(acks: list[float], start: float, end: float) -> float:
    """Spans/s acknowledged in [start, end) seconds of a flat-out run (`acks` sorted)."""
    n = bisect.bisect_left(acks, end) - bisect.bisect_left(acks, start)
    return n * SPANS_PER_CALL / (end - start)


def max_rate(db: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Spans/s acknowledged with `clients` connections flat out (assembly on, as configured),
    counted after `--warmup`: the rate the service sustains, not the one it starts at.

    Why a long warm-up: flat out on a fresh database, both stores start far faster than they
    go on. On PostgreSQL the rate drops after 25-35 s, when checkpoints requested by WAL
    volume begin and the backends start writing out buffers themselves; SQLite's keeps
    falling for the whole two minutes as the file and the backlog grow. A maximum taken over
    the first half minute was 5-78 % above what the same server sustained in the second
    minute (benchmarks/verdicts/README.md, 2026-12-03)."""
    calls = Calls(seed=seed)
    database = Database(db)
    try:
        with serve(database, args.quiet_period, args) as (proc, base):
            print(f"[max rate] {db}: {args.clients} clients flat out for {args.calibrate_seconds:.0f} s")

            last = [0.0, 0]

            def tick(t: float, n: int) -> None:
                if int(t) % 5 == 0 and t > last[0]:
                    recent = (n - last[1]) * SPANS_PER_CALL / (t - last[0])
                    print(
                        f"  {t:5.0f} s  {n * SPANS_PER_CALL / t:8,.0f} spans/s so far,"
                        f" {recent:8,.0f} in the last {t - last[0]:.0f} s  load {load()}"
                    )
                    last[:] = [t, n]

            cpu0 = tree_cpu(proc.pid)
            out = flat_out(base, calls, args.clients, args.calibrate_seconds, tick)
            cpu = tree_cpu(proc.pid) - cpu0
    finally:
        database.drop()
    warm = args.warmup
    counted = [t for t in out["acks"] if t >= warm]
    window = (counted[-1] - warm) if counted else 0.0
    rate = len(counted) * SPANS_PER_CALL / window if window > 0 else 0.0
    step = 5.0
    windows = [
        acked_rate(out["acks"], k * step, (k + 1) * step) for k in range(int(args.calibrate_seconds // step))
    ]
    res = {
        "spans_per_s": rate,
        "spans_per_s_by_5s": windows,
        "seconds": args.calibrate_seconds,
        "warmup_s": warm,
        "calls": len(out["acks"]),
        "retries": out["retries"],
        "server_cpu_s": cpu,
        "load": load(),
    }
    # What the 30 s calibration used before 2026-12-03 would have seen, for comparison.
    head = min(30.0, args.calibrate_seconds)
    res["spans_per_s_first_30s"] = acked_rate(out["acks"], 0.0, head)
    print(
        f"[max rate] {db}: {rate:,.0f} spans/s sustained after {warm:.0f} s"
        f" ({res['spans_per_s_first_30s']:,.0f} in the first {head:.0f} s;"
        f" {res['calls']} calls, {res['retries']} retries)"
    )
    return res


@dataclass(eq=False)
class Probe:
    """One sampled request: when its call went out and was acknowledged, when it was found."""

    trace_id: str
    sent: float
    acked: float
    start: float  # first poll not before this
    polls: int = 0
    last_sent: float | None = None  # when the last poll was sent
    last_miss: float | None = None  # when the last poll that found nothing was sent
    found: float | None = None  # when the poll that found it was answered
    flags: int | None = None
    kick: bool = False  # poll again now: the one ahead of it was just found
    rtt: float | None = None  # how long the poll that found it took


@dataclass
class LightResponse:
    """What the pollers read of an answer."""

    status_code: int
    body: bytes


class LightClient:
    """One kept-alive HTTP/1.1 connection from the standard library, for the pollers' GETs.

    Why not httpx here: its per-request machinery made the pollers the largest cost of this
    process, on the two cores whose use by the service the benchmark measures (py-spy: two
    thirds of its samples in httpx). At 15,000 spans/s, 145 GETs a second, the benchmark
    process used 0.24 cores with httpx pollers and 0.14 with these (2026-12-02). The senders
    keep httpx: their cost is per export call, not per poll.
    """

    def __init__(self, base: str, timeout: float) -> None:
        parts = urlsplit(base)
        self._host, self._port, self._timeout = parts.hostname or "127.0.0.1", parts.port, timeout
        self._conn: http.client.HTTPConnection | None = None

    def get(self, path: str) -> LightResponse:
        try:
            return self._get(path)
        except (OSError, http.client.HTTPException):  # the server closed the kept connection
            return self._get(path)  # once more, on a new one

    def _get(self, path: str) -> LightResponse:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        try:
            self._conn.request("GET", path)
            r = self._conn.getresponse()
            return LightResponse(r.status, r.read())
        except (OSError, http.client.HTTPException):
            self._conn.close()
            self._conn = None
            raise

    def __enter__(self) -> LightClient:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._conn is not None:
            self._conn.close()


class Poller:
    """Threads polling `GET /api/v1/requests/{id}` for the sampled requests, oldest first.

    Requests are assembled oldest arrival first, so polling every waiting request would mostly
    ask for ones that cannot be there yet and load the service it measures. Instead the oldest
    waiting probe (the head) is polled every `interval`; the next `window - 1` are polled when
    they enter the window, then every `slow`, and at once whenever a probe is found (a batch of
    summaries lands together), so each is found within a round trip or two. Each probe's
    resolution is the time between its last unanswered poll and the answer that found it;
    probes found on their first poll have none.
    """

    def __init__(self, base: str, threads: int, interval: float, window: int, slow: float, give_up: float):
        self.base, self.interval, self.window, self.slow, self.give_up = base, interval, window, slow, give_up
        self.waiting: list[tuple[float, int, Probe]] = []  # by acknowledgement time
        self.busy: set[int] = set()
        self.done: list[Probe] = []
        self.missing: list[Probe] = []
        self.gets = 0
        self.errors: list[str] = []
        self.cond = threading.Condition()
        self.closing = False
        self.seq = 0
        self.workers = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for w in self.workers:
            w.start()

    def add(self, probe: Probe) -> None:
        with self.cond:
            self.seq += 1
            bisect.insort(self.waiting, (probe.acked, self.seq, probe))
            self.cond.notify()

    def pending(self) -> int:
        with self.cond:
            return len(self.waiting)

    def close(self, timeout: float) -> None:
        """Wait up to `timeout` for the waiting probes; the rest count as never found."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.pending():
            time.sleep(0.1)
        with self.cond:
            self.closing = True
            self.missing += [p for _, _, p in self.waiting]
            self.waiting.clear()
            self.cond.notify_all()
        for w in self.workers:
            w.join(10)

    def _pick(self, now: float) -> tuple[Probe | None, float]:
        """The next probe due (under the lock), else how long until one is."""
        wait = 0.05
        for rank, (_, _, p) in enumerate(self.waiting[: self.window]):
            if id(p) in self.busy:
                continue
            if now - p.start > self.give_up:
                self.waiting.pop(rank)
                self.missing.append(p)
                return None, 0.0
            due = p.start
            if p.last_sent is not None and not p.kick:
                due = max(due, p.last_sent + (self.interval if rank == 0 else self.slow))
            if due <= now:
                return p, 0.0
            wait = min(wait, due - now)
        return None, wait

    def _run(self) -> None:
        with LightClient(self.base, timeout=30) as client:
            while True:
                with self.cond:
                    while True:
                        if self.closing:
                            return
                        probe, wait = self._pick(time.monotonic())
                        if probe is not None:
                            probe.kick = False
                            self.busy.add(id(probe))
                            break
                        if wait > 0:
                            self.cond.wait(wait)
                sent = time.monotonic()
                try:
                    r = client.get(f"/api/v1/requests/{probe.trace_id}")
                except (OSError, http.client.HTTPException) as exc:
                    self.errors.append(repr(exc))
                    r = None
                answered = time.monotonic()
                with self.cond:
                    self.busy.discard(id(probe))
                    self.gets += 1
                    probe.polls += 1
                    probe.last_sent = sent
                    if r is not None and r.status_code == 200:
                        probe.found = answered
                        probe.rtt = answered - sent
                        probe.flags = len(json.loads(r.body).get("flags") or [])
                        self.done.append(probe)
                        self.waiting = [w for w in self.waiting if w[2] is not probe]
                        for _, _, p in self.waiting[: self.window]:
                            p.kick = True  # likely in the same batch: ask at once
                        self.cond.notify_all()
                        continue
                    if r is not None and r.status_code != 404:
                        self.errors.append(f"{r.status_code} {r.body[:200]!r}")
                    probe.last_miss = sent


def latency_run(db: str, args: argparse.Namespace, rate: float, seed: int) -> dict[str, Any]:
    """Offer `rate` spans/s open loop for `args.seconds`; verdict latency of sampled requests."""
    quiet = args.quiet_period
    target = quiet + 0.25
    period = SPANS_PER_CALL / rate
    n_calls = max(1, round(args.seconds / period))
    supply = Calls(seed=seed)
    calls = [supply.next() for _ in range(n_calls)]
    database = Database(db)
    series: list[dict[str, Any]] = []
    try:
        with serve(database, quiet, args) as (proc, base):
            metrics = httpx.Client(base_url=base, timeout=30)
            poller = Poller(
                base, args.pollers, args.poll_interval, args.poll_window, args.poll_slow, args.drain_timeout
            )
            lock = threading.Lock()
            nxt = [0]
            acks: list[tuple[float, int]] = []  # (ack time, call index)
            late: list[float] = []
            retries = [0]
            errors: list[str] = []
            sampled = 0
            cpu0 = tree_cpu(proc.pid)
            print(
                f"[latency] {db}: {rate:,.0f} spans/s offered ({1 / period:.1f} calls/s, {n_calls} calls) "
                f"for {args.seconds:.0f} s, quiet period {quiet:g} s, every {args.sample}th request polled"
            )
            t0 = time.monotonic() + 0.5

            def sender() -> None:
                nonlocal sampled
                try:
                    with httpx.Client(base_url=base, timeout=300, headers={"content-type": PROTOBUF}) as c:
                        while True:
                            with lock:
                                i = nxt[0]
                                nxt[0] += 1
                            if i >= n_calls:
                                return
                            due = t0 + i * period
                            time.sleep(max(0.0, due - time.monotonic()))
                            sent = time.monotonic()
                            late.append(sent - due)
                            body, tids = calls[i]
                            retries[0] += export(c, body)
                            acked = time.monotonic()
                            acks.append((acked, i))
                            for k, tid in enumerate(tids):
                                if (i * TRACES_PER_CALL + k) % args.sample == 0:
                                    with lock:
                                        sampled += 1
                                    poller.add(
                                        Probe(tid, sent, acked, acked + max(0.0, quiet - args.poll_lead))
                                    )
                except Exception as exc:
                    errors.append(repr(exc))

            senders = [threading.Thread(target=sender, daemon=True) for _ in range(args.senders)]
            for th in senders:
                th.start()
            last_print = 0.0
            total_traces = n_calls * TRACES_PER_CALL
            drain_deadline = None
            while True:
                time.sleep(args.scrape_interval)
                now = time.monotonic()
                try:
                    m = scrape(metrics)
                except httpx.HTTPError:
                    continue
                series.append(
                    {
                        "t": now - t0,
                        "requests": m["requests"],
                        "pending": m["pending"],
                        "queue": m["queue"],
                        "rss_mb": tree_rss(proc.pid),
                    }
                )
                sending = any(th.is_alive() for th in senders)
                if now - last_print >= args.progress:
                    last_print = now
                    lat = [p.found - p.acked for p in list(poller.done)]
                    print(
                        f"  {now - t0:6.1f} s  sent {len(acks) * SPANS_PER_CALL:>9,} spans"
                        f"  counted {m['requests']:>8,.0f}/{len(acks) * TRACES_PER_CALL:,} requests"
                        f"  pending {m['pending'] if m['pending'] is not None else '-'}"
                        f"  probes found {len(lat)} (p50 {pct(lat, 50):.2f} s, p99 {pct(lat, 99):.2f} s)"
                        f"  waiting {poller.pending()}  rss {series[-1]['rss_mb']:.0f} MB  load {load()}"
                    )
                if sending:
                    continue
                if drain_deadline is None:
                    send_end = now
                    drain_deadline = now + args.drain_timeout
                if m["requests"] >= total_traces and not poller.pending():
                    break
                if now > drain_deadline:
                    print(f"  drain timeout: {m['requests']:,.0f} of {total_traces:,} requests counted")
                    break
            counted_at = time.monotonic()
            server_cpu = tree_cpu(proc.pid) - cpu0
            poller.close(timeout=1.0)
            missing = poller.missing
            final = scrape(metrics)
            metrics.close()
            peak = status_mb(proc.pid).get("VmHWM", 0.0)
    finally:
        database.drop()
    if errors or poller.errors:
        raise RuntimeError(f"errors: {(errors + poller.errors)[:3]}")

    probes = poller.done
    lat = [p.found - p.acked for p in probes]
    # Each summary became queryable between its last unanswered poll and the answer that found
    # it: `lat` is the upper bound, this the lower (0 for one found on its first poll).
    lat_lower = [max(0.0, (p.last_miss if p.last_miss is not None else p.acked) - p.acked) for p in probes]
    from_send = [p.found - p.sent for p in probes]
    resolution = [p.found - p.last_miss for p in probes if p.last_miss is not None]
    first_poll_hits = sum(1 for p in probes if p.polls == 1)
    over = sum(1 for x in lat if x > target) + len(missing)
    ack_times = sorted(a for a, _ in acks)
    # Counted in /metrics: the k-th acknowledged request against the first scrape whose
    # requests_total reached k (requests are assembled oldest arrival first, so FIFO matching
    # holds to within one call; resolution is --scrape-interval).
    counted_lat: list[float] = []
    j = 0
    per_trace_acks = [a for a in ack_times for _ in range(TRACES_PER_CALL)]
    for k, a in enumerate(per_trace_acks, 1):
        while j < len(series) and series[j]["requests"] < k:
            j += 1
        if j == len(series):
            break
        counted_lat.append(series[j]["t"] + t0 - a)

    def assembled_per_s(a: float, b: float) -> float:
        """Requests counted in /metrics per second between times a and b (since t0)."""
        inside = [x for x in series if a <= x["t"] <= b]
        if len(inside) < 2 or inside[-1]["t"] <= inside[0]["t"]:
            return float("nan")
        return (inside[-1]["requests"] - inside[0]["requests"]) / (inside[-1]["t"] - inside[0]["t"])

    sending_until = send_end - t0
    res = {
        "db": db,
        "offered_spans_per_s": rate,
        "assembled_requests_per_s_while_sending": assembled_per_s(quiet + 1.0, sending_until),
        "assembled_requests_per_s_after_sending": assembled_per_s(sending_until, counted_at - t0),
        "seconds": args.seconds,
        "quiet_period_s": quiet,
        "target_s": target,
        "calls": n_calls,
        "requests_sent": total_traces,
        "achieved_spans_per_s": len(acks) * SPANS_PER_CALL / (max(ack_times) - t0) if acks else 0.0,
        "send_lateness_s": summary(late),
        "retries": retries[0],
        "probes": sampled,
        "probes_found": len(probes),
        "probes_never_found": len(missing),
        "verdict_latency_s": summary(lat),
        "verdict_latency_lower_bound_s": summary(lat_lower),
        "verdict_latency_from_send_s": summary(from_send),
        "over_target_fraction": over / sampled if sampled else float("nan"),
        "poll_interval_s": args.poll_interval,
        "poll_resolution_s": summary(resolution),
        "found_on_first_poll": first_poll_hits,
        "finding_poll_round_trip_s": summary([p.rtt for p in probes if p.rtt is not None]),
        "poll_gets": poller.gets,
        "poll_gets_per_s": poller.gets / (counted_at - t0),
        "flags_on_probes": sum(p.flags or 0 for p in probes),
        "requests_counted": final["requests"],
        "flags_counted": final["flags"],
        "counted_in_metrics_latency_s": summary(counted_lat),
        "drain_s_after_last_send": counted_at - send_end,
        "assembly_lag_histogram": {str(k): v for k, v in sorted(final["lag"].items())},
        "assembly_lag_quantiles_s": {
            q: histogram_quantile(final["lag"], float(q)) for q in ("0.5", "0.9", "0.99")
        },
        "assembly_lag_quantile_buckets_s": {
            q: histogram_bucket(final["lag"], float(q)) for q in ("0.5", "0.9", "0.99")
        },
        "assembly_lag_over_target_fraction": histogram_fraction_over(final["lag"], target),
        "max_pending": max((s["pending"] or 0) for s in series) if series else None,
        "server_cpu_s": server_cpu,
        "server_peak_rss_mb": peak,
        "load_end": load(),
    }
    print_latency(res)
    return res


def print_latency(r: dict[str, Any]) -> None:
    v, lag = r["verdict_latency_s"], r["assembly_lag_quantiles_s"]
    low = r.get("verdict_latency_lower_bound_s") or {"p50": float("nan"), "p99": float("nan")}
    print(
        f"[latency] {r['db']}: offered {r['offered_spans_per_s']:,.0f} spans/s, achieved "
        f"{r['achieved_spans_per_s']:,.0f}; {r['probes_found']}/{r['probes']} probes found\n"
        f"  verdict latency (ack -> queryable): p50 {v['p50']:.3f}  p90 {v['p90']:.3f}  p99 {v['p99']:.3f}"
        f"  max {v['max']:.3f} s; over {r['target_s']:.2f} s: {100 * r['over_target_fraction']:.1f} %\n"
        f"  lower bound (ack -> last unanswered poll): p50 {low['p50']:.3f}  p99 {low['p99']:.3f} s\n"
        f"  poll resolution p50 {r['poll_resolution_s']['p50'] * 1000:.0f} ms"
        f" p99 {r['poll_resolution_s']['p99'] * 1000:.0f} ms (round trip of the finding GET p50"
        f" {r['finding_poll_round_trip_s']['p50'] * 1000:.0f} ms); {r['poll_gets_per_s']:.0f} GET/s;"
        f" {r['found_on_first_poll']} found on the first poll\n"
        f"  /metrics: {r['requests_counted']:,.0f} of {r['requests_sent']:,} requests counted;"
        f" counted latency p50 {r['counted_in_metrics_latency_s']['p50']:.2f}"
        f" p99 {r['counted_in_metrics_latency_s']['p99']:.2f} s; assembly lag histogram p50 {lag['0.5']:.2f}"
        f" p90 {lag['0.9']:.2f} p99 {lag['0.99']:.2f} s"
        f" (p99 bucket {r['assembly_lag_quantile_buckets_s']['0.99']}),"
        f" over target"
        f" {100 * r['assembly_lag_over_target_fraction']:.1f} %\n"
        f"  assembled {r['assembled_requests_per_s_while_sending']:.0f} requests/s while sending,"
        f" {r['assembled_requests_per_s_after_sending']:.0f} after;"
        f" drained {r['drain_s_after_last_send']:.1f} s after the last send; max pending {r['max_pending']};"
        f" server peak RSS {r['server_peak_rss_mb']:.0f} MB; load {r['load_end']}"
    )


# -- memory ----------------------------------------------------------------------------------------


def memory_terms(seed: int = 7, n_calls: int = 8) -> dict[str, float]:
    """Sizes behind the memory formula, measured in this process on the same calls: bytes per
    accepted-but-uncommitted span (its row), per parsed call, and per span as the assembler
    holds it (decoded from the store)."""
    import gc
    import tracemalloc

    from railtrace.otlp.decode import parse_protobuf
    from railtrace.otlp.export import prepare
    from railtrace.store import Store, make_engine, migrate

    supply = Calls(seed=seed, templates=2)
    bodies = [supply.next()[0] for _ in range(n_calls)]
    n = n_calls * SPANS_PER_CALL
    gc.collect()
    tracemalloc.start()
    batches = [prepare(b) for b in bodies]
    row_bytes = tracemalloc.get_traced_memory()[0] / n
    tracemalloc.stop()
    gc.collect()
    before = rss_mb(os.getpid())
    parsed = [parse_protobuf(b) for b in bodies]
    parse_mb = (rss_mb(os.getpid()) - before) / n_calls
    del parsed
    database = Database("sqlite")
    try:
        engine = make_engine(database.url)
        migrate(engine)
        store = Store(engine)
        store.insert_batches(batches)
        tids = {r[0] for b in batches for r in b.chunks}
        del batches
        gc.collect()
        tracemalloc.start()
        spans = store.load_spans(tids, normalize=False)
        decoded_bytes = tracemalloc.get_traced_memory()[0] / len(spans)
        tracemalloc.stop()
        del spans
        engine.dispose()
    finally:
        database.drop()
    return {
        "body_mb_per_call": sum(map(len, bodies)) / n_calls / 2**20,
        "parse_mb_per_call": parse_mb,
        "row_kb_per_pending_span": row_bytes / 1024,
        "decoded_kb_per_assembled_span": decoded_bytes / 1024,
    }


def memory_run(db: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Flat-out ingest with the long assembly window; RSS every second, then while draining."""
    terms = memory_terms()
    calls = Calls(seed=seed)
    database = Database(db)
    samples: list[dict[str, Any]] = []
    db_mb = None
    try:
        with serve(database, args.quiet_period, args) as (proc, base):
            metrics = httpx.Client(base_url=base, timeout=30)
            time.sleep(5.0)  # assembly children, if any, have imported what they use
            idle = status_mb(proc.pid)
            processes, children = len(tree(proc.pid)), assembly_children(proc.pid)
            db_file = str(database.tmp / "bench.db")
            stop = threading.Event()
            t0 = time.monotonic()
            phase = ["load"]

            def sample() -> None:
                k = 0
                scraped: dict[str, Any] = {}
                while not stop.is_set():
                    s: dict[str, Any] = {"t": time.monotonic() - t0, "phase": phase[0], **status_mb(proc.pid)}
                    if db == "sqlite":
                        s["sqlite_connections"] = sqlite_connections(proc.pid, db_file)
                    if k % 2 == 0:  # /metrics every other second (the pending gauge moves every 2 s)
                        try:
                            m = scrape(metrics)
                            scraped = {
                                "requests": m["requests"],
                                "pending": m["pending"],
                                "queue": m["queue"],
                            }
                        except httpx.HTTPError:
                            pass
                    s.update(scraped)
                    samples.append(s)
                    k += 1
                    stop.wait(1.0)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            print(
                f"[memory] {db}: {args.clients} clients flat out for {args.memory_seconds:.0f} s, "
                f"quiet period {args.quiet_period:g} s; {processes} process(es), idle RSS"
                f" {idle.get('VmRSS', 0):.0f} MB, PSS {idle.get('Pss', 0):.0f} MB"
            )
            last = [0.0]

            def tick(t: float, n: int) -> None:
                if t - last[0] >= args.progress and samples:
                    last[0] = t
                    s = samples[-1]
                    print(
                        f"  {t:6.0f} s  {n * SPANS_PER_CALL / t:8,.0f} spans/s"
                        f"  rss {s.get('VmRSS', 0):.0f} MB, pss {s.get('Pss', 0):.0f} MB"
                        f" (anon {s.get('RssAnon', 0):.0f}, file {s.get('RssFile', 0):.0f},"
                        f" shm {s.get('RssShmem', 0):.0f})  pending {s.get('pending', '-')}"
                        f"  queue {s.get('queue', '-')}  conns {s.get('sqlite_connections', '-')}"
                        f"  load {load()}"
                    )

            cpu0 = tree_cpu(proc.pid)
            out = flat_out(base, calls, args.clients, args.memory_seconds, tick)
            load_cpu = tree_cpu(proc.pid) - cpu0
            phase[0] = "drain"
            sent = len(out["acks"]) * TRACES_PER_CALL
            deadline = time.monotonic() + args.memory_drain
            print(f"[memory] load done; sampling while assembly drains (up to {args.memory_drain:.0f} s)")
            while time.monotonic() < deadline:
                time.sleep(args.progress)
                s = samples[-1]
                print(
                    f"  drain {s['t']:6.0f} s  rss {s.get('VmRSS', 0):.0f} MB  counted"
                    f" {s.get('requests', 0):,.0f}/{sent:,}  pending {s.get('pending', '-')}  load {load()}"
                )
                if (s.get("requests") or 0) >= sent:
                    break
            stop.set()
            sampler.join(5)
            final = scrape(metrics)
            metrics.close()
            hwm = status_mb(proc.pid).get("VmHWM", 0.0)
            if db == "sqlite":
                db_mb = sum(f.stat().st_size for f in database.tmp.glob("bench.db*")) / 2**20
    finally:
        database.drop()
    during = [s for s in samples if s["phase"] == "load"]
    drain = [s for s in samples if s["phase"] == "drain"]

    def col(rows: list[dict[str, Any]], key: str) -> list[float]:
        return [s[key] for s in rows if s.get(key) is not None]

    steady = [s for s in during if s["t"] >= args.memory_seconds / 3]
    rate = len(out["acks"]) * SPANS_PER_CALL / out["elapsed"]
    res = {
        "db": db,
        "seconds": args.memory_seconds,
        "quiet_period_s": args.quiet_period,
        "clients": args.clients,
        "spans_per_s": rate,
        "spans_sent": len(out["acks"]) * SPANS_PER_CALL,
        "retries": out["retries"],
        "idle": idle,
        "rss_mb_median_steady": statistics.median(col(steady, "VmRSS")) if steady else None,
        "rss_mb_max_load": max(col(during, "VmRSS"), default=None),
        "rss_mb_max_drain": max(col(drain, "VmRSS"), default=None),
        "processes": processes,
        "assembly_children": children,
        "pss_mb_median_steady": statistics.median(col(steady, "Pss")) if steady else None,
        "pss_mb_max": max(col(samples, "Pss"), default=None),
        "rss_anon_mb_max": max(col(samples, "RssAnon"), default=None),
        "rss_file_mb_max": max(col(samples, "RssFile"), default=None),
        "rss_shmem_mb_max": max(col(samples, "RssShmem"), default=None),
        "peak_rss_mb": hwm,
        "max_pending_traces": max(col(samples, "pending"), default=None),
        "final_pending_traces": final["pending"],
        "max_queue_spans": max(col(samples, "queue"), default=None),
        "max_sqlite_connections": max(col(samples, "sqlite_connections"), default=None),
        "requests_counted_at_end": final["requests"],
        "requests_sent": sent,
        "server_cpu_s_load": load_cpu,
        "database_mb_at_end": db_mb,
        "formula": formula(
            idle.get("VmRSS", 0.0), max(col(samples, "queue"), default=0.0), args, terms, children
        ),
        "load_end": load(),
        "samples": samples,
    }
    print(
        f"[memory] {db}: {rate:,.0f} spans/s for {args.memory_seconds:.0f} s; RSS idle"
        f" {idle.get('VmRSS', 0):.0f} MB, median (after the first third)"
        f" {res['rss_mb_median_steady']:.0f} MB,"
        f" max under load {res['rss_mb_max_load']:.0f} MB, max while draining"
        f" {res['rss_mb_max_drain'] or 0:.0f} MB; PSS median {res['pss_mb_median_steady'] or 0:.0f} MB,"
        f" max {res['pss_mb_max'] or 0:.0f} MB"
        f" ({processes} processes; summed RSS counts their shared pages once each)"
        f", peak (VmHWM) {hwm:.0f} MB; max pending traces"
        f" {res['max_pending_traces']}, max queued spans {res['max_queue_spans']},"
        f" max SQLite connections {res['max_sqlite_connections']}; load {res['load_end']}"
    )
    f = res["formula"]
    print(
        f"  formula with these inputs: base {f['base_mb']:.0f} + queued rows {f['pending_rows_mb']:.1f}"
        f" + bodies held {f['bodies_held_mb']:.1f} (+ parses <= {f['parses_at_most_mb']:.1f})"
        f" + assembly batch {f['assembly_batch_mb']:.1f} = {f['predicted_mb']:.0f}"
        f"-{f['predicted_with_parses_mb']:.0f} MB;"
        f" as docs/performance.md writes it {f['doc_predicted_mb']:.0f} MB"
        f" (row {f['row_kb_per_pending_span']:.2f} KB/span, decoded {f['decoded_kb_per_assembled_span']:.2f}"
        f" KB/span, body {f['body_mb_per_call']:.2f} MB and parse {f['parse_mb_per_call']:.2f} MB per call);"
        f" database {res['database_mb_at_end'] or 0:.0f} MB at the end"
    )
    return res


def formula(
    base: float, queue: float, args: argparse.Namespace, terms: dict[str, float], children: int = 0
) -> dict[str, float]:
    """The memory formula term by term with this run's measured inputs: as docs/performance.md
    writes it (receivers: at most AnyIO's 40 threads, each with one body and its parse), and as
    the code holds memory (every export awaiting its commit keeps its body twice -- the bytearray
    it was read into and the bytes copy -- next to its rows in the writer's queue; parses are
    transient, at most one per worker thread). `base` is the idle tree's RSS, children included;
    each assembly child holds its own batch, and without children the serve process holds one."""
    try:
        from railtrace.scheduling.assembler import FULL_BATCH
    except ImportError:
        FULL_BATCH = 500
    threads = min(args.clients, 40)
    rows = queue * terms["row_kb_per_pending_span"] / 1024
    assemblers = max(1, children)
    batch = assemblers * FULL_BATCH * SPANS_PER_TRACE * terms["decoded_kb_per_assembled_span"] / 1024
    doc_receivers = threads * (terms["body_mb_per_call"] + terms["parse_mb_per_call"])
    bodies = args.clients * 2 * terms["body_mb_per_call"]
    parses = threads * terms["parse_mb_per_call"]
    return {
        "base_mb": base,
        "pending_rows_mb": rows,
        "assembly_batch_mb": batch,
        "doc_receivers_in_flight_mb": doc_receivers,
        "doc_predicted_mb": base + rows + doc_receivers + batch,
        "bodies_held_mb": bodies,
        "parses_at_most_mb": parses,
        "predicted_mb": base + rows + bodies + batch,
        "predicted_with_parses_mb": base + rows + bodies + parses + batch,
        **terms,
    }


# -- the run ---------------------------------------------------------------------------------------


def meta(dbs: list[str]) -> dict[str, Any]:
    def git(*a: str) -> str:
        try:
            return subprocess.run(
                ["git", *a], cwd=Path(__file__).resolve().parent, capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "?"

    out: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "railtrace": version("railtrace"),
        "commit": git("log", "-1", "--format=%h %s"),
        "service_files_changed_since_commit": len(
            git("status", "--porcelain", "--", "../../api").splitlines()
        ),
        "sqlite": sqlite3.sqlite_version,
        "httpx": httpx.__version__,
        "load_start": load(),
    }
    if "postgresql" in dbs:
        database = Database("postgresql")
        try:
            with database.admin.connect() as c:
                out["postgresql"] = c.execute(text("SHOW server_version")).scalar_one()
        finally:
            database.drop()
    return out


def spread(values: list[float]) -> dict[str, float]:
    values = [v for v in values if v == v]
    if not values:
        return {}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="sqlite")
    ap.add_argument("--repeat", type=int, default=1, help="independent runs per database (median, spread)")
    ap.add_argument("--clients", type=int, default=4, help="connections sending flat out")
    ap.add_argument("--quiet-period", type=float, default=None, help="seconds; default 2, 30 with --memory")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument(
        "--assembly-processes",
        type=assembly_process_arg,
        help="the service's assembly child processes: N, 0 for a thread, or auto"
        " (default: the service's own default, auto)",
    )
    ap.add_argument("--progress", type=float, default=5.0, help="seconds between progress lines")
    lat = ap.add_argument_group("verdict latency")
    lat.add_argument("--rate", type=float, help="maximum ingest rate in spans/s (default: measure it)")
    lat.add_argument("--fraction", type=float, default=0.5, help="share of the maximum rate offered")
    lat.add_argument("--calibrate-seconds", type=float, default=120.0, help="flat-out run for the maximum")
    lat.add_argument(
        "--recalibrate",
        action="store_true",
        help="measure the maximum again after each latency run and report both",
    )
    lat.add_argument(
        "--warmup",
        type=float,
        default=60.0,
        help="first seconds of the flat-out run left out of the maximum (30 s run, 5 s before 2026-12-03)",
    )
    lat.add_argument("--seconds", type=float, default=60.0, help="seconds of paced load")
    lat.add_argument("--senders", type=int, default=8, help="threads sending the paced calls")
    lat.add_argument("--sample", type=int, default=128, help="poll every Nth request")
    lat.add_argument("--pollers", type=int, default=4, help="threads polling the API")
    lat.add_argument("--poll-interval", type=float, default=0.02, help="seconds between polls of one request")
    lat.add_argument("--poll-window", type=int, default=4, help="oldest waiting probes being polled")
    lat.add_argument("--poll-slow", type=float, default=0.1, help="poll interval behind the oldest probe")
    lat.add_argument(
        "--poll-lead", type=float, default=0.15, help="start polling this long before the quiet period ends"
    )
    lat.add_argument(
        "--scrape-interval",
        type=float,
        default=0.1,
        help="seconds between /metrics scrapes: the resolution of the 'counted in /metrics' latency",
    )
    lat.add_argument("--drain-timeout", type=float, default=300.0, help="wait this long after sending")
    mem = ap.add_argument_group("memory")
    mem.add_argument("--memory", action="store_true", help="measure resident memory instead of latency")
    mem.add_argument("--memory-seconds", type=float, default=180.0, help="seconds of flat-out load")
    mem.add_argument("--memory-drain", type=float, default=60.0, help="seconds sampled after the load")
    args = ap.parse_args()
    if args.recalibrate and (args.rate or args.memory):
        ap.error("--recalibrate measures the maximum again: not with --rate (a given maximum) or --memory")
    if not 0 <= args.warmup < args.calibrate_seconds:
        ap.error("--warmup must be at least 0 and shorter than --calibrate-seconds")
    if args.quiet_period is None:
        args.quiet_period = 30.0 if args.memory else 2.0
    dbs = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    info = meta(dbs)
    given = args.assembly_processes is not None
    info["assembly_processes"] = args.assembly_processes if given else "the service's default (auto)"
    print(f"railtrace verdict benchmark: {json.dumps(info)}")
    runs: list[dict[str, Any]] = []
    for db in dbs:
        for rep in range(args.repeat):
            seed = 1 + rep
            started = {"started": time.strftime("%H:%M:%S UTC", time.gmtime()), "load_start": load()}
            if args.memory:
                runs.append({**started, **memory_run(db, args, seed)})
                continue
            calib = {"spans_per_s": args.rate, "given": True} if args.rate else max_rate(db, args, seed)
            rate = args.fraction * calib["spans_per_s"]
            run = {**started, "max_rate": calib, **latency_run(db, args, rate, seed + 100)}
            if args.recalibrate:
                # The machine's speed can move by a fifth within minutes: measured again, a
                # maximum far from the first says the offered rate was not half of what the
                # machine could do while the latency was measured.
                run["max_rate_after"] = max_rate(db, args, seed)
            runs.append(run)
    out = {"meta": info, "args": {k: str(v) for k, v in vars(args).items() if k != "json"}, "runs": runs}
    if not args.memory:
        for db in dbs:
            rs = [r for r in runs if r["db"] == db]
            out[f"summary_{db}"] = {
                "max_rate": spread([r["max_rate"]["spans_per_s"] for r in rs]),
                "max_rate_first_30s": spread(
                    [r["max_rate"]["spans_per_s_first_30s"] for r in rs if not r["max_rate"].get("given")]
                ),
                "max_rate_after": spread(
                    [r["max_rate_after"]["spans_per_s"] for r in rs if r.get("max_rate_after")]
                ),
                "p50": spread([r["verdict_latency_s"]["p50"] for r in rs]),
                "p99": spread([r["verdict_latency_s"]["p99"] for r in rs]),
                "over_target_fraction": spread([r["over_target_fraction"] for r in rs]),
                "lag_histogram_p99": spread([r["assembly_lag_quantiles_s"]["0.99"] for r in rs]),
            }
            print(f"summary {db}: {json.dumps(out[f'summary_{db}'])}")
    else:
        for db in dbs:
            rs = [r for r in runs if r["db"] == db]
            out[f"summary_{db}"] = {
                "rss_median": spread([r["rss_mb_median_steady"] for r in rs]),
                "peak": spread([r["peak_rss_mb"] for r in rs]),
            }
            print(f"summary {db}: {json.dumps(out[f'summary_{db}'])}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
