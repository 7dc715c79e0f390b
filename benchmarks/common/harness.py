"""Shared pieces of the ingest-side benchmarks: run `railtrace serve` as its own process and
post pre-built export calls at it the way an OTLP exporter does (keep-alive, retry on
429/503 after `Retry-After`)."""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

PROTOBUF = "application/x-protobuf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_process(
    db_url: str, cwd: Path, quiet_period: float | None = None, extra_env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`railtrace serve` on `db_url` in its own process until the block ends: (process, base URL)."""
    port, grpc_port = free_port(), free_port()
    env = dict(os.environ, RAILTRACE_DB=db_url, **(extra_env or {}))
    cmd = [sys.executable, "-m", "railtrace.cli", "serve", "--port", str(port), "--grpc-port", str(grpc_port)]
    if quiet_period is not None:
        cmd += ["--quiet-period", str(quiet_period)]
    log = open(cwd / f"serve-{port}.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "service did not start: " + (cwd / f"serve-{port}.log").read_text()[-2000:]
                )
            time.sleep(0.1)
        yield proc, base
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def export(client: httpx.Client, body: bytes) -> int:
    """POST one export call as an OTLP exporter does: on 429/503 wait `Retry-After` and send it
    again; any other refusal raises. `client` carries the content type. Returns how many times
    the call was throttled."""
    throttled = 0
    while True:
        r = client.post("/v1/traces", content=body)
        if r.status_code == 200:
            return throttled
        if r.status_code not in (429, 503):
            raise RuntimeError(f"export failed: {r.status_code} {r.text[:200]}")
        throttled += 1
        time.sleep(float(r.headers.get("retry-after", "1")))


def latency_ms(samples: Sequence[float]) -> dict[str, float]:
    """p50, p99 (nearest rank) and max in milliseconds of latencies in seconds, and their count."""
    s = sorted(samples)
    if not s:
        return {"n": 0.0}
    return {
        "p50_ms": statistics.median(s) * 1e3,
        "p99_ms": s[min(len(s) - 1, int(len(s) * 0.99))] * 1e3,
        "max_ms": s[-1] * 1e3,
        "n": float(len(s)),
    }


def uptime() -> str:
    """The machine's load, to print beside every figure taken on a shared machine."""
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def post_all(
    base: str | Sequence[str], calls: Sequence[bytes], clients: int, route: Sequence[int] | None = None
) -> tuple[float, int]:
    """POST every call (to `base`, or to `base[route[i]]` for call i) from `clients` threads per
    target; (seconds until the last acknowledgement, 429/503 retries)."""
    bases = [base] if isinstance(base, str) else list(base)
    queues: list[list[int]] = [[] for _ in bases]
    for i in range(len(calls)):
        queues[route[i] if route is not None else 0].append(i)
    for q in queues:
        q.reverse()
    lock = threading.Lock()
    retries = [0]
    errors: list[str] = []

    def worker(target: int) -> None:
        with httpx.Client(base_url=bases[target], timeout=300, headers={"content-type": PROTOBUF}) as client:
            while True:
                with lock:
                    if not queues[target]:
                        return
                    i = queues[target].pop()
                try:
                    throttled = export(client, calls[i])
                except RuntimeError as exc:
                    errors.append(str(exc))
                    return
                with lock:
                    retries[0] += throttled

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(len(bases)) for _ in range(clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"export failed: {errors[:3]}")
    return elapsed, retries[0]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int, peak: bool = False) -> float:
    """Resident (or peak resident) memory of a process in MB."""
    key = "VmHWM:" if peak else "VmRSS:"
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    return 0.0
