"""A hostile TraceQL search against a real `railtrace serve` on a store the demo filled, on
127.0.0.1, bounded in time.

    .venv/bin/python -m benchmarks.reliability.hostile_query [--db URL] [--requests 400]

Without `--db` the demo's simulator fills a fresh SQLite store first (`railtrace demo`).
Phases (each prints one JSON line):
- search: `GET /api/search?q={ name =~ "(.*.*)*Z" }` (a backtracking pattern), its answer and
  time; meanwhile `/healthz` and an export by the official OTLP/HTTP exporter every 0.5 s,
  with their answers and latency;
- sigterm: the same search again, SIGTERM 1 s after it was sent: how long the process took
  to exit (killed after 90 s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from tests.reliability.crash_harness import Server, pd_batch

HOSTILE = '{ name =~ "(.*.*)*Z" }'


def probes(server: Server, stop: threading.Event, out: dict[str, list[float | str]]) -> None:
    """/healthz and an official exporter's export every 0.5 s, each with its own timeout."""
    exporter = OTLPSpanExporter(endpoint=server.url + "/v1/traces", timeout=30)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        while not stop.is_set():
            for name in ("healthz", "export"):
                t = time.monotonic()
                try:
                    if name == "healthz":
                        answer: str = str(client.get("/healthz").status_code)
                    else:
                        ok = exporter.export(pd_batch(1)) == SpanExportResult.SUCCESS
                        answer = "SUCCESS" if ok else "FAILURE"
                except httpx.HTTPError as exc:
                    answer = type(exc).__name__
                out.setdefault(name, []).append(answer)
                out.setdefault(name + "_s", []).append(time.monotonic() - t)
            stop.wait(0.5)
    exporter.shutdown()


def summary(out: dict[str, list[float | str]]) -> dict[str, object]:
    res: dict[str, object] = {}
    for name in ("healthz", "export"):
        answers = [str(a) for a in out.get(name, [])]
        lat = sorted(float(x) for x in out.get(name + "_s", []))
        res[name] = {
            "answers": {a: answers.count(a) for a in sorted(set(answers))},
            "median_ms": round(statistics.median(lat) * 1000, 1) if lat else None,
            "max_ms": round(lat[-1] * 1000, 1) if lat else None,
        }
    return res


def search_phase(server: Server) -> dict[str, object]:
    out: dict[str, list[float | str]] = {}
    stop = threading.Event()
    prober = threading.Thread(target=probes, args=(server, stop, out), daemon=True)
    prober.start()
    time.sleep(1.0)
    t = time.monotonic()
    try:
        r = httpx.get(server.url + "/api/search", params={"q": HOSTILE, "limit": 20}, timeout=120)
        answer: object = {"status": r.status_code, "body": r.text[:300]}
    except httpx.HTTPError as exc:
        answer = type(exc).__name__
    took = time.monotonic() - t
    time.sleep(1.0)
    stop.set()
    prober.join(60)
    return {"phase": "search", "answer": answer, "search_s": round(took, 2), **summary(out)}


def sigterm_phase(server: Server) -> dict[str, object]:
    def search() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(server.url + "/api/search", params={"q": HOSTILE, "limit": 20}, timeout=120)

    threading.Thread(target=search, daemon=True).start()
    time.sleep(1.0)
    t = time.monotonic()
    server.proc.terminate()
    try:
        code: int | str = server.proc.wait(90)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        code = "killed after 90 s"
    took = time.monotonic() - t
    server.wait(10)
    return {"phase": "sigterm", "exit": code, "exit_after_s": round(took, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", help="a store to search (default: a fresh one the demo fills)")
    ap.add_argument("--requests", type=int, default=400, help="requests the demo simulates")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        db = args.db
        if db is None:
            from railtrace.demo import run_demo

            db = f"sqlite:///{work / 'railtrace.db'}"
            run_demo(
                requests=args.requests, seed=7, scenario_names=[], workdir=work, db=db, print_report=False
            )
        for phase in (search_phase, sigterm_phase):
            server = Server(db, work)
            try:
                server.wait_ready()
                print(json.dumps(phase(server)), flush=True)
            finally:
                if server.proc.poll() is None:
                    server.proc.kill()
                    server.wait(10)


if __name__ == "__main__":
    main()
