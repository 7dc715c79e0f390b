#!/usr/bin/env python3
"""Web UI speed on an existing database: first byte of each page and its data, complete render.

    .venv/bin/python -m benchmarks.ui.run --db-url sqlite:////tmp/railtrace-bench-XXXX/bench.db \
        --topology /tmp/railtrace-bench-XXXX/topology [--repeat 20] [--json out.json]

`railtrace serve` runs on the database in its own process (as in production); Debian's chromium,
driven by Playwright, opens each page `--repeat` times (warm: after one unmeasured visit) and
reads, from the browser's own timings:

- `shell first byte`: the page's HTML, navigation start to its first byte (`responseStart`);
- `data first byte`: each `/api/...` call the page makes, request start to first byte, the
  slowest call of the visit;
- `complete render`: navigation start to the `railtrace:rendered` mark the page sets once every
  figure is on screen.

Pages: the fleet overview over the last hour and the last day, the request list unfiltered and
filtered by the busiest flag and node over one hour, a page deep in that list, random request
pages, the topology page.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import sync_playwright
from sqlalchemy import create_engine, text

from benchmarks.common.harness import serve_process

ROOT = Path(__file__).resolve().parents[2]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def busiest(db_url: str) -> dict[str, Any]:
    """The flag/node pair with the most requests in the latest hour of history, and ids to open."""
    engine = create_engine(db_url)
    with engine.connect() as conn:
        end_ns = int(conn.execute(text("SELECT max(start_ns) FROM requests")).scalar_one())
        spans = conn.execute(text("SELECT count(*) FROM requests")).scalar_one()
        since = end_ns - 3600 * 10**9
        row = conn.execute(
            text(
                "SELECT f.flag, r.decode_node, count(*) n FROM request_flags f JOIN requests r"
                " ON r.trace_id = f.trace_id WHERE f.start_ns >= :s GROUP BY f.flag, r.decode_node"
                " ORDER BY n DESC LIMIT 1"
            ),
            {"s": since},
        ).one()
        ids = [
            r[0]
            for r in conn.execute(
                text("SELECT trace_id FROM requests WHERE start_ns >= :s ORDER BY trace_id LIMIT 2000"),
                {"s": end_ns - 86400 * 10**9},
            )
        ]
    engine.dispose()
    return {"end_ns": end_ns, "requests": spans, "flag": row[0], "node": row[1], "count": row[2], "ids": ids}


def visit(page: Any, url: str) -> dict[str, float]:
    page.goto(url)
    page.wait_for_selector("main[aria-busy=false]", timeout=30_000)
    t = page.evaluate(
        """() => {
          const nav = performance.getEntriesByType('navigation')[0];
          const mark = performance.getEntriesByName('railtrace:rendered')[0];
          const api = performance.getEntriesByType('resource').filter(r => r.name.includes('/api/')
            || r.name.includes('/readyz'));
          return {shell: nav.responseStart - nav.startTime, render: mark ? mark.startTime : -1,
                  data: Math.max(0, ...api.map(r => r.responseStart - r.requestStart)), calls: api.length};
        }"""
    )
    if page.locator("main [role=alert]").count():
        raise RuntimeError(f"{url}: {page.inner_text('main')[:300]}")
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db-url", required=True)
    ap.add_argument("--topology", required=True)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    info = busiest(args.db_url)
    rng = random.Random(7)
    until = info["end_ns"] / 1e9
    since = until - 3600
    filtered = f"/requests?flag={info['flag']}&node={info['node']}&since={since:.0f}&until={until + 1:.0f}"
    workdir = Path(tempfile.mkdtemp(prefix="railtrace-ui-bench-"))
    env = {"RAILTRACE_TOPOLOGY": json.dumps([args.topology])}
    out: dict[str, Any] = {
        "db": args.db_url.split(":", 1)[0],
        "requests": info["requests"],
        "filter": {"flag": info["flag"], "node": info["node"], "requests_in_hour": info["count"]},
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "load_avg_start": os.getloadavg()[0],
        "pages": {},
    }
    with serve_process(args.db_url, workdir, None, env) as (_proc, base), sync_playwright() as p:
        # The deep page: follow the filtered list's cursor ten pages down.
        cursor = None
        with httpx.Client(base_url=base, timeout=60) as client:
            for _ in range(10):
                q = {"flag": info["flag"], "node": info["node"], "limit": 50, "since": f"{since:.0f}"}
                body = client.get(
                    "/api/v1/requests", params={**q, **({"cursor": cursor} if cursor else {})}
                ).json()
                if not body["next_cursor"]:
                    break
                cursor = body["next_cursor"]
        pages: dict[str, list[str]] = {
            "overview, last hour": ["/"],
            "overview, last day": ["/?window=24h"],
            "requests, newest": ["/requests"],
            "requests, flag + node + 1 h": [filtered],
            "requests, 10 pages deep": [f"{filtered}&cursor={cursor}" if cursor else filtered],
            # Slowest first over the whole history kept (migration 0010's partial indexes).
            "requests, slowest TTFT": ["/requests?order=ttft"],
            "requests, flag, slowest KV time": [f"/requests?flag={info['flag']}&order=kv_time"],
            "one request": [
                f"/requests/{t}" for t in rng.sample(info["ids"], min(len(info["ids"]), args.repeat))
            ],
            "topology": ["/topology"],
            "contract audit": ["/contract"],
        }
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        for name, urls in pages.items():
            visit(page, base + urls[0])  # warm: module, stylesheet and server caches
            rows = [visit(page, base + urls[i % len(urls)]) for i in range(args.repeat)]
            shell = [r["shell"] for r in rows]
            data = [r["data"] for r in rows]
            render = [r["render"] for r in rows]
            out["pages"][name] = {
                "calls": rows[0]["calls"],
                **{f"shell_{k}": round(pct(shell, q), 1) for k, q in (("p50", 0.5), ("p99", 0.99))},
                **{f"data_{k}": round(pct(data, q), 1) for k, q in (("p50", 0.5), ("p99", 0.99))},
                **{f"render_{k}": round(pct(render, q), 1) for k, q in (("p50", 0.5), ("p99", 0.99))},
                "render_max": round(max(render), 1),
                "render_mean": round(statistics.fmean(render), 1),
            }
            print(f"{name:<30} {json.dumps(out['pages'][name])}", flush=True)
        browser.close()
    out["load_avg_end"] = os.getloadavg()[0]
    out["finished_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    print(json.dumps({k: v for k, v in out.items() if k != "pages"}))


if __name__ == "__main__":
    main()
