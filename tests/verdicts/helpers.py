"""RequestFacts built directly (assembly is not under test here) for verdict tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from railtrace.model import Candidate, Endpoint, KVFacts, RequestFacts, RouterPick

FLEET = Path(__file__).with_name("fleet.yaml")
T0 = 1_700_000_000_000_000_000


def kv(**kw: Any) -> KVFacts:
    base: dict[str, Any] = {
        "span_id": "00000000000000aa",
        "operation": "read",
        "connector": "nixl",
        "backend": "UCX",
        "bytes": 48_000_000,
        "duration_s": 0.0066,
        "transport": "rdma",
        "devices": ["rc_mlx5/mlx5_0:1"],
        "local_gpu": "0",
        "remote_host": "10.0.0.1",
        "pod": "decode-b",
        "node": "node-b",
    }
    base.update(kw)
    return KVFacts(**base)


def pick(
    chosen: str, cands: list[tuple[str, float | None]], profile: str = "decode", **kw: Any
) -> RouterPick:
    return RouterPick(
        profile=profile,
        chosen=chosen,
        candidates=[Candidate(endpoint=e, score=s, **kw) for e, s in cands],
        span_id="00000000000000bb",
        source="router_shim",
    )


def facts(
    prefill: str | None = "10.0.0.1:8000",
    decode: str | None = "10.0.0.2:8000",
    kvf: KVFacts | None = None,
    picks: list[RouterPick] | None = None,
    **kw: Any,
) -> RequestFacts:
    base: dict[str, Any] = {
        "trace_id": "0" * 31 + "1",
        "trace_ids": ["0" * 31 + "1"],
        "request_id": "req-1",
        "model": "m",
        "start_ns": T0,
        "end_ns": T0 + 10**9,
        "ttft_s": 0.3,
        "e2e_s": 1.0,
        "breakdown_s": {"kv_transfer": 0.0066},
        "prefill": Endpoint(address=prefill, span_id="00000000000000c1"),
        "decode": Endpoint(address=decode, span_id="00000000000000c2"),
        "kv": kvf,
        "picks": picks or [],
        "flags": [],
        "span_count": 8,
        "complete": True,
    }
    base.update(kw)
    return RequestFacts(**base)
