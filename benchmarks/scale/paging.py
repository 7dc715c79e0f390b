"""Deep pages of the filtered request list: the store's list query at a git revision against the
working tree's, on one database (for example one kept by `run.py --keep-db`).

    .venv/bin/python -m benchmarks.scale.paging --db-url URL --before REV

Picks the flag + node + one-hour window with the most requests (as `run.py` does), follows the
keyset cursors from page 1 to collect the cursor of each `--depths` page, then times each of
those pages `--repeat` times with `Store.list_requests` from `api/store/store.py` at `--before`
and as it is now, interleaved, in this process (no HTTP). Reports p50/p99/max per depth.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import types
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import text

from benchmarks.common.harness import latency_ms
from railtrace.store import Store, make_engine
from railtrace.store.queries import Cursor, RequestQuery

ROOT = Path(__file__).resolve().parents[2]

HOUR_NS = 3_600 * 10**9


def store_at(rev: str) -> type:
    """`Store` as `api/store/store.py` defines it at git revision `rev`.

    Only revisions whose store is that one file: since the split by job the facade imports its
    job modules from the working tree, so loading store.py alone would measure today's code."""
    # Since the move into api/railtrace/ every revision's store is split, so a store.py alone is only
    # ever found at its old place, api/store/store.py.
    split = any(
        subprocess.run(
            ["git", "cat-file", "-e", f"{rev}:{path}"], cwd=ROOT, capture_output=True, check=False
        ).returncode
        == 0
        for path in ("api/store/reads.py", "api/railtrace/store/reads.py")
    )
    if split:
        raise SystemExit(
            f"--before {rev}: its store is split into modules (api/store/reads.py, ...); this benchmark "
            "loads one store.py and cannot compare such a revision: run it from a checkout of that revision"
        )
    src = subprocess.run(
        ["git", "show", f"{rev}:api/store/store.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    module = types.ModuleType(f"railtrace.store.store_at_{rev}")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    try:
        exec(compile(src, f"store.py@{rev}", "exec"), module.__dict__)
    except ImportError as e:
        raise SystemExit(
            f"--before {rev}: its store.py imports what has moved since ({e}); "
            "run the benchmark from a checkout of that revision instead"
        ) from e
    return module.Store


def pick(engine: Any) -> tuple[str, str, int, int]:
    """(flag, node, since_ns, until_ns) of the busiest flag + node + hour."""
    with engine.connect() as conn:
        now = conn.execute(text("SELECT max(start_ns) FROM requests")).scalar_one() + 1
        rows = conn.execute(
            text(
                "SELECT f.flag, f.start_ns, r.prefill_node, r.decode_node FROM request_flags f "
                "JOIN requests r ON r.trace_id = f.trace_id"
            )
        ).all()
    counts: Counter[tuple[str, str, int]] = Counter()
    for flag, start_ns, pnode, dnode in rows:
        for node in {pnode, dnode} - {None}:
            counts[(flag, node, (now - start_ns) // HOUR_NS)] += 1
    (flag, node, hour), n = counts.most_common(1)[0]
    print(f"{flag} on {node}, hour {hour} before the newest request: {n} requests", flush=True)
    return flag, node, now - (hour + 1) * HOUR_NS, now - hour * HOUR_NS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db-url", required=True)
    ap.add_argument("--before", required=True, help="git revision of the store to compare against")
    ap.add_argument("--depths", default="1,10,25,50,75,100")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    depths = sorted({int(d) for d in args.depths.split(",")})
    engine = make_engine(args.db_url)
    stores = {"before": store_at(args.before)(engine), "now": Store(engine)}
    flag, node, since, until = pick(engine)
    query = {"flag": flag, "node": node, "since_ns": since, "until_ns": until, "limit": 100}
    cursors: dict[int, Cursor | None] = {}
    cursor: Cursor | None = None
    for depth in range(1, max(depths) + 1):
        if depth in depths:
            cursors[depth] = cursor
        page = stores["now"].list_requests(RequestQuery(cursor=cursor, **query))
        if not page.next_cursor:
            cursors.setdefault(depth, cursor)
            break
        cursor = Cursor.decode(page.next_cursor)
    out: dict[str, Any] = {"filter": {"flag": flag, "node": node}, "depths": {}}
    print("| page | before p50 ms | before p99 ms | now p50 ms | now p99 ms |\n|---:|---:|---:|---:|---:|")
    for depth, cur in sorted(cursors.items()):
        times: dict[str, list[float]] = {"before": [], "now": []}
        pages: dict[str, Any] = {}
        for _ in range(args.repeat):
            for label, store in stores.items():
                t = time.perf_counter()
                pages[label] = store.list_requests(RequestQuery(cursor=cur, **query))
                times[label].append(time.perf_counter() - t)
        if pages["before"].items != pages["now"].items:
            raise AssertionError(f"page {depth} differs between the two stores")
        res = {k: latency_ms(v) for k, v in times.items()}
        out["depths"][depth] = res
        b, n = res["before"], res["now"]
        print(
            f"| {depth} | {b['p50_ms']:.1f} | {b['p99_ms']:.1f} | {n['p50_ms']:.1f} | {n['p99_ms']:.1f} |",
            flush=True,
        )
    engine.dispose()
    if args.json:
        args.json.write_text(json.dumps({"command": sys.argv, **out}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
