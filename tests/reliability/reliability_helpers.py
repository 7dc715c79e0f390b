"""Shared helpers of the reliability tests: posting raw OTLP, reading the store, free ports."""

from __future__ import annotations

import os
import socket
from typing import Any

import httpx
from sqlalchemy import create_engine

from railtrace.store import Store

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
EXPORT_PATH = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def examples(default: int) -> int:
    """Hypothesis examples per fuzz test: small in CI, large in the documented long run."""
    return int(os.environ.get("RAILTRACE_FUZZ_EXAMPLES", default))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(client: httpx.Client, body: bytes, ctype: str = PROTOBUF, **headers: str) -> httpx.Response:
    return client.post("/v1/traces", content=body, headers={"content-type": ctype, **headers})


def stored_keys(db_url: str) -> set[tuple[str, str]]:
    """(trace_id, span_id) of every stored span, read with a connection of our own."""
    engine = create_engine(db_url)
    try:
        return Store(engine).span_ids()
    finally:
        engine.dispose()


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size from /proc (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def peak_rss_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def json_or_none(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return None
