"""Gzip bodies of many members: inflation time against member count, and the HTTP attack.

    .venv/bin/python -m benchmarks.reliability.gzip_members [--bodies 40]

1. `inflate_bounded` (one step of input at a time) against the loop it replaced (each member
   handed zlib the rest of the body), on bodies of N empty members, the member limit lifted so
   both do the same work. The old loop is kept here, for the comparison only.
2. `--bodies` concurrent exports of 16 MB of empty gzip members to a real `railtrace serve`
   on 127.0.0.1 (each answered 400: over the member limit), while a small export, the official
   exporter and /readyz run every 0.5 s: their answers and latency, and the service's peak RSS.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import httpx

from benchmarks.reliability.edge_attacks import with_traffic
from railtrace.otlp.decode import inflate_bounded
from tests.reliability.crash_harness import Server

EMPTY = gzip.compress(b"", mtime=0)


def previous_inflate(data: bytes, limit: int) -> bytes:
    """The member loop before this change: `unused_data` (the rest of the body) per member."""
    out = bytearray()
    pending = data
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out += d.decompress(pending, limit + 1 - len(out))
        if not d.eof:
            raise zlib.error("truncated")
        pending = d.unused_data
        if not pending:
            return bytes(out)


def timings() -> list[dict[str, object]]:
    rows = []
    for n in (1_000, 10_000, 80_000, 800_000):
        body = EMPTY * n
        t = time.perf_counter()
        inflate_bounded(body, "gzip", 16 << 20, max_members=n)
        new = time.perf_counter() - t
        old = None
        if n <= 80_000:
            t = time.perf_counter()
            previous_inflate(body, 16 << 20)
            old = round(time.perf_counter() - t, 3)
        rows.append(
            {"members": n, "body_mb": round(len(body) / 1e6, 1), "now_s": round(new, 3), "before_s": old}
        )
    return rows


def attack(server: Server, bodies: int) -> dict[str, object]:
    body = EMPTY * 800_000
    answers: list[int | str] = []

    def one() -> None:
        try:
            r = httpx.post(
                server.url + "/v1/traces",
                content=body,
                headers={"content-type": "application/x-protobuf", "content-encoding": "gzip"},
                timeout=120,
            )
            answers.append(r.status_code)
        except httpx.HTTPError as exc:
            answers.append(type(exc).__name__)

    threads = [threading.Thread(target=one) for _ in range(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {str(a): answers.count(a) for a in set(answers)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bodies", type=int, default=40)
    args = ap.parse_args()
    for row in timings():
        print(json.dumps({"phase": "inflate", **row}), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(f"sqlite:///{Path(tmp) / 'gz.db'}", Path(tmp))
        server.wait_ready()
        try:
            res = with_traffic(server, lambda: attack(server, args.bodies))
            print(json.dumps({"phase": "http_attack", "bodies": args.bodies, **res}), flush=True)
        finally:
            server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
