"""Single-trace latency side by side with Arize Phoenix, on the identical payload.

    .venv/bin/python -m benchmarks.scale.phoenix_trace --phoenix PATH-TO-PHOENIX-EXECUTABLE \
        [--sizes 2048,10240,51200] [--queries 500]

Both services run as their own processes on SQLite: `railtrace serve` through the ingest
harness, `phoenix serve` from its own venv (the path of its `phoenix` executable is the
argument). They are loaded in steps up to each size with the same spans: the ingest
benchmark's 8-span llm-d P/D requests (`benchmarks/common/payload.py`, 512 spans per OTLP/HTTP
protobuf call). After each step the loading waits until railtrace has assembled every request
and until Phoenix's database holds every span (Phoenix answers 200 before it stores), and
records both ingest rates on this payload.

Then one keep-alive client per service fetches random traces `--queries` times. Each round
takes one trace id and asks, in turn:

- railtrace `GET /api/v1/traces/{trace_id}`: the trace's normalised spans with their
  attributes, and the request summary;
- railtrace `GET /api/v1/requests/{trace_id}`: the request summary;
- Phoenix `GET /v1/projects/default/spans?trace_id=...`: the trace's spans with their
  attributes (its REST API);
- Phoenix GraphQL `trace(traceId)` on the project node: the span tree its trace view draws
  (ids, names, kinds, status, times, latency and token counts of every span; no attributes).

so both services see the same machine load. Every answer is checked: all 8 spans of the asked
trace (or the summary of that trace). Reported per size: p50, p99 and max per query, the
Phoenix / railtrace ratios, the load average, and the versions. Not a test: figures depend
on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from sqlalchemy import create_engine

from benchmarks.common.harness import free_port, latency_ms, post_all, serve_process
from benchmarks.common.payload import SPANS_PER_TRACE, export_calls
from railtrace.store import Store

ROOT = Path(__file__).resolve().parents[2]

SPANS_PER_CALL = 512
WARMUP = 20
PHOENIX_PROJECT = "default"

# Written for this benchmark against Phoenix's GraphQL schema: the fields a trace view needs to
# draw one trace's span tree.
TRACE_QUERY = """
query OneTrace($projectId: ID!, $traceId: ID!) {
  node(id: $projectId) {
    ... on Project {
      trace(traceId: $traceId) {
        traceId
        numSpans
        latencyMs
        spans(first: 1000) {
          edges {
            node { spanId parentId name spanKind statusCode startTime endTime latencyMs tokenCountTotal }
          }
        }
      }
    }
  }
}
"""
PROJECTS_QUERY = "query { projects { edges { node { id name } } } }"


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def trace_ids_of(call: bytes) -> list[str]:
    """The distinct trace ids in one export call, in order."""
    seen: dict[str, None] = {}
    for rs in ExportTraceServiceRequest.FromString(call).resource_spans:
        for ss in rs.scope_spans:
            for s in ss.spans:
                seen.setdefault(s.trace_id.hex(), None)
    return list(seen)


class Phoenix:
    """`phoenix serve` in its own process on a throwaway SQLite working directory."""

    def __init__(self, executable: str) -> None:
        self.executable = executable
        self.workdir = Path(tempfile.mkdtemp(prefix="phoenix-trace-bench-"))
        self.port = free_port()
        env = dict(
            os.environ,
            PHOENIX_WORKING_DIR=str(self.workdir),
            PHOENIX_PORT=str(self.port),
            PHOENIX_GRPC_PORT=str(free_port()),
            PHOENIX_HOST="127.0.0.1",
            PHOENIX_TELEMETRY_ENABLED="false",
        )
        self.log = open(self.workdir / "phoenix.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [executable, "serve"], env=env, cwd=self.workdir, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(self.base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("Phoenix did not start")
            time.sleep(0.5)

    def version(self) -> str:
        python = Path(self.executable).with_name("python")
        out = subprocess.run(
            [str(python), "-c", "import importlib.metadata as m; print(m.version('arize-phoenix'))"],
            capture_output=True,
            text=True,
            check=False,
        )
        return out.stdout.strip() or "unknown"

    def stored_spans(self) -> int:
        db = self.workdir / "phoenix.db"
        if not db.exists():
            return 0
        conn = sqlite3.connect(db, timeout=30)
        try:
            return conn.execute("SELECT count(*) FROM spans").fetchone()[0]
        except sqlite3.OperationalError:  # tables not created yet
            return 0
        finally:
            conn.close()

    def project_id(self) -> str:
        r = httpx.post(self.base + "/graphql", json={"query": PROJECTS_QUERY}, timeout=60)
        r.raise_for_status()
        for edge in r.json()["data"]["projects"]["edges"]:
            if edge["node"]["name"] == PHOENIX_PROJECT:
                return edge["node"]["id"]
        raise RuntimeError(f"Phoenix has no project {PHOENIX_PROJECT!r}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def load_railtrace(
    base: str, db_url: str, calls: Sequence[bytes], total: int, clients: int
) -> dict[str, float]:
    """Post the calls; spans/s until acknowledged (= committed) and until every request is assembled."""
    n = SPANS_PER_CALL * len(calls)
    t = time.perf_counter()
    acked, retries = post_all(base, calls, clients)
    engine = create_engine(db_url)
    try:
        store = Store(engine)
        stored = store.count_spans()
        if stored != total:
            raise RuntimeError(f"railtrace holds {stored} spans, {total} acknowledged")
        while True:
            if store.count_dirty() == 0:
                break
            time.sleep(0.2)
    finally:
        engine.dispose()
    assembled = time.perf_counter() - t
    return {
        "spans": float(n),
        "durable_spans_per_s": n / acked,
        "assembled_spans_per_s": n / assembled,
        "retries": float(retries),
    }


def load_phoenix(phoenix: Phoenix, calls: Sequence[bytes], total: int, clients: int) -> dict[str, float]:
    """Post the calls; spans/s until accepted (200) and until Phoenix's database holds them all."""
    n = SPANS_PER_CALL * len(calls)
    t = time.perf_counter()
    accepted, retries = post_all(phoenix.base, calls, clients)
    deadline = time.monotonic() + 3600
    last, last_change = -1, time.monotonic()
    while True:
        stored = phoenix.stored_spans()
        if stored >= total:
            break
        if stored != last:
            last, last_change = stored, time.monotonic()
        if time.monotonic() > deadline or time.monotonic() - last_change > 300:
            raise RuntimeError(f"Phoenix holds {stored} of {total} spans and stopped storing")
        time.sleep(0.5)
    durable = time.perf_counter() - t
    return {
        "spans": float(n),
        "accepted_spans_per_s": n / accepted,
        "durable_spans_per_s": n / durable,
        "retries": float(retries),
    }


def _check(cond: bool, what: str, answer: Any) -> None:
    if not cond:
        raise RuntimeError(f"{what}: unexpected answer {str(answer)[:500]}")


def query_round(
    rt: httpx.Client, ph: httpx.Client, project_id: str, tid: str
) -> list[tuple[str, Callable[[], Any]]]:
    """The four fetches of one trace, each returning its checked answer."""

    def rt_trace() -> Any:
        r = rt.get(f"/api/v1/traces/{tid}")
        r.raise_for_status()
        body = r.json()
        spans = body["spans"]
        _check(
            len(spans) == SPANS_PER_TRACE and all(s["trace_id"] == tid for s in spans) and body["summary"],
            "railtrace trace",
            body,
        )
        return body

    def rt_request() -> Any:
        r = rt.get(f"/api/v1/requests/{tid}")
        r.raise_for_status()
        body = r.json()
        _check(body.get("trace_id") == tid, "railtrace request", body)
        return body

    def ph_rest() -> Any:
        r = ph.get(f"/v1/projects/{PHOENIX_PROJECT}/spans", params={"trace_id": tid, "limit": 1000})
        r.raise_for_status()
        body = r.json()
        spans = body["data"]
        _check(
            len(spans) == SPANS_PER_TRACE
            and all(s["context"]["trace_id"] == tid for s in spans)
            and all(s["attributes"] for s in spans),
            "Phoenix REST spans",
            body,
        )
        return body

    def ph_graphql() -> Any:
        r = ph.post(
            "/graphql", json={"query": TRACE_QUERY, "variables": {"projectId": project_id, "traceId": tid}}
        )
        r.raise_for_status()
        body = r.json()
        _check("errors" not in body, "Phoenix GraphQL trace", body)
        trace = body["data"]["node"]["trace"]
        _check(
            trace is not None
            and trace["traceId"] == tid
            and trace["numSpans"] == SPANS_PER_TRACE
            and len(trace["spans"]["edges"]) == SPANS_PER_TRACE,
            "Phoenix GraphQL trace",
            body,
        )
        return body

    return [
        ("railtrace GET /api/v1/traces/{id} (8 spans with attributes + summary)", rt_trace),
        ("railtrace GET /api/v1/requests/{id} (summary)", rt_request),
        ("Phoenix GET /v1/projects/default/spans?trace_id= (8 spans with attributes)", ph_rest),
        ("Phoenix GraphQL trace(traceId) span tree (8 spans, no attributes)", ph_graphql),
    ]


def measure(
    rt_base: str, ph_base: str, project_id: str, tids: Sequence[str], queries: int, seed: int
) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {}
    with (
        httpx.Client(base_url=rt_base, timeout=60) as rt,
        httpx.Client(base_url=ph_base, timeout=60) as ph,
    ):
        for i in range(WARMUP + queries):
            fetches = query_round(rt, ph, project_id, rng.choice(tids))
            if i % 2:  # alternate which service goes first
                fetches.reverse()
            for label, fetch in fetches:
                t = time.perf_counter()
                fetch()
                elapsed = time.perf_counter() - t
                if i >= WARMUP:
                    samples.setdefault(label, []).append(elapsed)
    return {k: latency_ms(v) for k, v in samples.items()}


def git_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout

    commit = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "api").strip()
    return commit + (" (with uncommitted changes in api/)" if dirty else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phoenix", required=True, help="path of `phoenix` in its own venv")
    ap.add_argument("--sizes", default="2048,10240,51200", help="spans loaded at each step (x512)")
    ap.add_argument("--queries", type=int, default=500, help="random traces fetched per size")
    ap.add_argument("--clients", type=int, default=4, help="concurrent exporting connections")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    sizes = sorted({-(-int(s) // SPANS_PER_CALL) * SPANS_PER_CALL for s in args.sizes.split(",")})
    calls = export_calls(sizes[-1])
    tids_per_call = [trace_ids_of(c) for c in calls]

    meta: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "railtrace": git_commit(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "queries": args.queries,
        "clients": args.clients,
    }
    steps: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="railtrace-trace-bench-"))
    db_url = f"sqlite:///{tmp / 'bench.db'}"
    phoenix = Phoenix(args.phoenix)
    try:
        meta["arize-phoenix"] = phoenix.version()
        print(f"single-trace latency, railtrace vs Phoenix: {meta}", flush=True)
        with serve_process(db_url, tmp) as (_proc, rt_base):
            loaded = 0
            for size in sizes:
                new = calls[loaded // SPANS_PER_CALL : size // SPANS_PER_CALL]
                step: dict[str, Any] = {"spans": size, "traces": size // SPANS_PER_TRACE}
                step["load_before_loading"] = load_average()
                step["railtrace_ingest"] = load_railtrace(rt_base, db_url, new, size, args.clients)
                print(f"  {size:,} spans: railtrace {step['railtrace_ingest']}", flush=True)
                step["phoenix_ingest"] = load_phoenix(phoenix, new, size, args.clients)
                print(f"  {size:,} spans: Phoenix {step['phoenix_ingest']}", flush=True)
                loaded = size
                tids = [t for ids in tids_per_call[: size // SPANS_PER_CALL] for t in ids]
                step["load_before_queries"] = load_average()
                t = time.perf_counter()
                step["queries"] = measure(
                    rt_base, phoenix.base, phoenix.project_id(), tids, args.queries, args.seed + size
                )
                step["query_seconds"] = time.perf_counter() - t
                step["load_after_queries"] = load_average()
                step["utc"] = time.strftime("%H:%M", time.gmtime())
                steps.append(step)
                print(json.dumps(step, indent=2), flush=True)
    finally:
        phoenix.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\nsingle-trace latency, railtrace vs Phoenix: {meta}")
    for step in steps:
        print(
            f"\n{step['spans']:,} spans ({step['traces']:,} traces) loaded, {step['utc']} UTC, "
            f"load average {step['load_before_queries']} -> {step['load_after_queries']}"
        )
        print("| query | p50 ms | p99 ms | max ms |\n|---|---:|---:|---:|")
        for q, p in step["queries"].items():
            print(f"| {q} | {p['p50_ms']:.1f} | {p['p99_ms']:.1f} | {p['max_ms']:.1f} |")
        q = step["queries"]
        rt_trace = next(v for k, v in q.items() if "/api/v1/traces/" in k)
        for k, v in q.items():
            if k.startswith("Phoenix"):
                print(
                    f"| ratio {k.split(' (')[0]} / railtrace trace | {v['p50_ms'] / rt_trace['p50_ms']:.1f}x "
                    f"| {v['p99_ms'] / rt_trace['p99_ms']:.1f}x | {v['max_ms'] / rt_trace['max_ms']:.1f}x |"
                )
    print("\nIngest on this payload (spans added at each step):")
    print(
        "| spans loaded | Phoenix accepted | Phoenix durable | railtrace durable "
        "| railtrace assembled | ratio durable |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for step in steps:
        ph, rt = step["phoenix_ingest"], step["railtrace_ingest"]
        print(
            f"| {step['spans']:,} | {ph['accepted_spans_per_s']:,.0f} | {ph['durable_spans_per_s']:,.0f} "
            f"| {rt['durable_spans_per_s']:,.0f} | {rt['assembled_spans_per_s']:,.0f} "
            f"| {rt['durable_spans_per_s'] / ph['durable_spans_per_s']:,.1f}x |"
        )
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "steps": steps}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
