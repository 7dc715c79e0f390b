#!/usr/bin/env python3
"""Cost of `GET /api/v1/stats/timeseries` and `/stats/transfers` queries at the 10 M-span rate.

    .venv/bin/python -m benchmarks.ui.timeseries [--db /tmp/railtrace-ts.db] [--hours 26]

Fills a SQLite store (once; kept for the next run) with request rows and flag rows at the rate of
benchmarks/ui's 10 M-span store (857,967 requests a day, 35,750 an hour; ~8 % of requests per
flag, four flags), written straight into the tables and their per-hour rollups rebuilt
(`rollup.rebuild`, `rebuild_ttft`), then times each query the overview and the topology page
make (`store.timeseries`), warm, median and max of 7 (3 for transfers). The rows' summaries are
900 bytes of filler: transfers read rows, the time series only index entries.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import insert, text

from railtrace.store import rollup
from railtrace.store import timeseries as ts
from railtrace.store.engine import make_engine, migrate
from railtrace.store.schema import request_flags, requests
from railtrace.store.store import Store

PER_HOUR = 35_750
HOUR_NS = 3_600 * 10**9


def fill(engine: Any, hours: int, end: int) -> None:
    rng = random.Random(1)
    pcs = ["rdma_same_rail"] * 6 + ["rdma_cross_rail"] * 3 + ["tcp"]
    nodes = [f"node-{i}" for i in range(8)]
    flags = ["cross_rail", "slow_kv_transfer", "tcp_fallback", "gpu_nic_mismatch"]
    total, start = hours * PER_HOUR, end - hours * HOUR_NS
    for chunk in range(0, total, 50_000):
        reqs, fl = [], []
        for i in range(chunk, min(total, chunk + 50_000)):
            s = start + (end - start) * i // total
            tid, ttft = f"{i:032x}", rng.lognormvariate(-0.7, 0.6)
            names = [x for x in flags if rng.random() < 0.08]
            reqs.append(
                {
                    "trace_id": tid,
                    "start_ns": s,
                    "ttft_s": ttft,
                    "e2e_s": ttft * 3,
                    "path_class": rng.choice(pcs),
                    "transport": "rdma",
                    "kv_duration_s": ttft / 2,
                    "kv_bytes": 10**9,
                    "prefill_node": rng.choice(nodes),
                    "decode_node": rng.choice(nodes),
                    "pairing_level": "subblock",
                    "flag_names": ",".join(names),
                    "summary": b"x" * 900,
                    "updated_ns": s,
                }
            )
            fl += [
                {"flag": x, "start_ns": s, "trace_id": tid, "ttft_s": ttft, "kv_duration_s": ttft / 2}
                for x in names
            ]
        with engine.begin() as conn:
            conn.execute(insert(requests), reqs)
            if fl:
                conn.execute(insert(request_flags), fl)
    with engine.begin() as conn:
        rollup.rebuild(conn)
        rollup.rebuild_ttft(conn)


def timed(fn: Callable[..., Any], *args: Any, k: int = 7) -> tuple[float, float]:
    fn(*args)
    xs = []
    for _ in range(k):
        t = time.perf_counter()
        fn(*args)
        xs.append((time.perf_counter() - t) * 1000)
    return statistics.median(xs), max(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="/tmp/railtrace-ts.db")
    ap.add_argument("--hours", type=int, default=26)
    args = ap.parse_args()
    engine = make_engine(f"sqlite:///{args.db}")
    migrate(engine)
    store = Store(engine)
    end = time.time_ns() // HOUR_NS * HOUR_NS
    with engine.begin() as conn:
        have = conn.execute(text("SELECT count(*), max(start_ns) FROM requests")).one()
    if have[0]:
        end = have[1] // HOUR_NS * HOUR_NS + HOUR_NS
    else:
        t0 = time.time()
        fill(engine, args.hours, end)
        print(f"filled {args.hours * PER_HOUR:,} requests in {time.time() - t0:.0f} s")
    now = end - 1_234_567_890  # a browser's "now", inside an hour
    print("| query | window | step | median ms | max ms |\n|---|---|---|---|---|")
    for label, win in (("15 min", 900), ("1 h", 3600), ("2 h", 7200), ("6 h", 21600), ("24 h", 86400)):
        since = now - win * 10**9
        step = ts.step_for(since, now, 60)
        p50, mx = timed(ts.timeseries, store, since, now, step)
        print(f"| timeseries | {label} | {step // 60_000_000_000} min | {p50:.1f} | {mx:.1f} |")
    for label, win in (("15 min", 900), ("1 h", 3600), ("3 h", 10800)):
        p50, mx = timed(ts.transfers, store, now - win * 10**9, now, k=3)
        print(f"| transfers | {label} | | {p50:.1f} | {mx:.1f} |")


if __name__ == "__main__":
    main()
