"""Attacks on the HTTP listener before authentication, against a real `railtrace serve` on
127.0.0.1, each bounded in connections, bytes and time.

    .venv/bin/python -m benchmarks.reliability.edge_attacks [--connections 1000] [--seconds 30]

Phases (each prints one JSON line):
- slowloris: `--connections` connections each sending one header byte a second for `--seconds`;
  meanwhile a small export (raw HTTP, and the official OTLP/HTTP exporter) and /readyz every
  0.5 s, with their answers and latency;
- header flood: 4 connections sending header bytes as fast as they can, up to 256 MiB each;
- long request line: one URL of up to 256 MiB;
- idle: 100 connections that send nothing, and 100 that stop half-way through their headers:
  how long the service keeps them (capped at 100 s).
Every phase reports the service's peak resident memory. Nothing but 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from tests.reliability.crash_harness import Server, pd_batch
from tests.reliability.reliability_helpers import rss_bytes


class Sampler:
    """Peak RSS of the service process, sampled every 0.1 s."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except (OSError, RuntimeError):
                return
            self._stop.wait(0.1)

    def __enter__(self) -> Sampler:
        self.peak = rss_bytes(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def normal_traffic(server: Server, stop: threading.Event, out: dict[str, list[float | int | str]]) -> None:
    """A small raw export, an export by the official exporter and /readyz every 0.5 s."""
    body = encode_spans(pd_batch(2)).SerializeToString()
    exporter = OTLPSpanExporter(endpoint=server.url + "/v1/traces", timeout=10)
    with httpx.Client(base_url=server.url, timeout=10) as client:
        while not stop.is_set():
            for name, call in (
                (
                    "export",
                    lambda: (
                        client.post(
                            "/v1/traces", content=body, headers={"content-type": "application/x-protobuf"}
                        ).status_code
                    ),
                ),
                ("readyz", lambda: client.get("/readyz").status_code),
                ("exporter", lambda: 200 if exporter.export(pd_batch(1)) == SpanExportResult.SUCCESS else 0),
            ):
                t = time.monotonic()
                try:
                    code: int | str = call()
                except httpx.HTTPError as exc:
                    code = type(exc).__name__
                out.setdefault(name, []).append(code)
                out.setdefault(name + "_s", []).append(time.monotonic() - t)
            stop.wait(0.5)
    exporter.shutdown()


def summary(out: dict[str, list[float | int | str]]) -> dict[str, object]:
    res: dict[str, object] = {}
    for name in ("export", "readyz", "exporter"):
        codes = out.get(name, [])
        lat = sorted(float(x) for x in out.get(name + "_s", []))
        res[name] = {
            "answers": {c: [str(x) for x in codes].count(c) for c in sorted({str(x) for x in codes})},
            "median_ms": round(statistics.median(lat) * 1000, 1) if lat else None,
            "max_ms": round(lat[-1] * 1000, 1) if lat else None,
        }
    return res


async def _slow_client(port: int, seconds: float, closed_at: list[float], start: float) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        closed_at.append(-1.0)
        return
    try:
        writer.write(b"POST /v1/traces HTTP/1.1\r\nHost: a\r\nX-Slow: ")
        await writer.drain()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await asyncio.sleep(1)
            if reader.at_eof():
                break
            writer.write(b"a")
            await writer.drain()
        if reader.at_eof() or writer.is_closing():
            closed_at.append(time.monotonic() - start)
    except OSError:
        closed_at.append(time.monotonic() - start)
    finally:
        writer.close()


async def _slowloris(port: int, n: int, seconds: float) -> list[float]:
    closed_at: list[float] = []
    start = time.monotonic()
    tasks = []
    for _ in range(n):
        tasks.append(asyncio.create_task(_slow_client(port, seconds, closed_at, start)))
        await asyncio.sleep(0.002)
    await asyncio.gather(*tasks)
    return closed_at


def with_traffic(server: Server, attack: object) -> dict[str, object]:
    out: dict[str, list[float | int | str]] = {}
    stop = threading.Event()
    thread = threading.Thread(target=normal_traffic, args=(server, stop, out), daemon=True)
    with Sampler(server.proc.pid) as rss:
        thread.start()
        t = time.monotonic()
        result = attack()  # type: ignore[operator]
        took = time.monotonic() - t
        stop.set()
        thread.join(30)
    return {
        "attack": result,
        "attack_s": round(took, 1),
        "peak_rss_mb": round(rss.peak / 2**20),
        **summary(out),
    }


def flood(port: int, first: bytes, filler: bytes, limit: int, seconds: float) -> dict[str, object]:
    """Send `first`, then `filler` repeatedly until `limit` bytes, `seconds`, or the server closes."""
    import socket

    sent = 0
    start = time.monotonic()
    how = "limit"
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(10)
        try:
            s.sendall(first)
            while sent < limit:
                if time.monotonic() - start > seconds:
                    how = "time"
                    break
                s.sendall(filler)
                sent += len(filler)
        except OSError as exc:
            how = f"closed by the service ({type(exc).__name__})"
        answer = b""
        with contextlib.suppress(OSError):
            answer = s.recv(200)
    return {
        "sent_mb": round(sent / 2**20, 1),
        "ended": how,
        "answer": answer.split(b"\r\n", 1)[0].decode(errors="replace"),
        "s": round(time.monotonic() - start, 1),
    }


def header_flood(port: int, seconds: float) -> list[dict[str, object]]:
    results: list[dict[str, object]] = [{} for _ in range(4)]

    def one(i: int) -> None:
        results[i] = flood(
            port,
            b"POST /v1/traces HTTP/1.1\r\nHost: a\r\n",
            b"X-Flood: " + b"a" * 65500 + b"\r\n",
            256 << 20,
            seconds,
        )

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def long_url(port: int, seconds: float) -> dict[str, object]:
    return flood(port, b"GET /", b"a" * 65536, 256 << 20, seconds)


async def _idle(port: int, n: int, half: bool, cap: float) -> list[float]:
    async def one() -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        start = time.monotonic()
        if half:
            writer.write(b"GET /readyz HTTP/1.1\r\nHost: a\r\n")
            await writer.drain()
        try:
            await asyncio.wait_for(reader.read(), cap)
            return round(time.monotonic() - start, 1)
        except (TimeoutError, OSError):
            return cap
        finally:
            writer.close()

    return list(await asyncio.gather(*(one() for _ in range(n))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--idle-cap", type=float, default=100)
    ap.add_argument("--phase", action="append", help="slowloris, headers, url, idle (default: all)")
    args = ap.parse_args()
    phases = args.phase or ["slowloris", "headers", "url", "idle"]
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(f"sqlite:///{Path(tmp) / 'edge.db'}", Path(tmp))
        server.wait_ready()
        port = server.port
        try:
            if "slowloris" in phases:
                res = with_traffic(
                    server, lambda: asyncio.run(_slowloris(port, args.connections, args.seconds))
                )
                closed = res.pop("attack")
                assert isinstance(closed, list)
                res["attack_connections_closed_by_service"] = len([c for c in closed if c >= 0])
                res["closed_after_s_median"] = round(statistics.median(closed), 1) if closed else None
                print(json.dumps({"phase": "slowloris", "connections": args.connections, **res}), flush=True)
            if "headers" in phases:
                res = with_traffic(server, lambda: header_flood(port, args.seconds))
                print(json.dumps({"phase": "header_flood", **res}), flush=True)
            if "url" in phases:
                res = with_traffic(server, lambda: long_url(port, args.seconds))
                print(json.dumps({"phase": "long_url", **res}), flush=True)
            if "idle" in phases:
                for half in (False, True):
                    kept = asyncio.run(_idle(port, 100, half, args.idle_cap))
                    print(
                        json.dumps(
                            {
                                "phase": "half_sent_headers" if half else "idle",
                                "connections": 100,
                                "closed_after_s_median": statistics.median(kept),
                                "closed_after_s_max": max(kept),
                                "cap_s": args.idle_cap,
                            }
                        ),
                        flush=True,
                    )
        finally:
            print(json.dumps({"sigterm_exit": server.terminate()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
