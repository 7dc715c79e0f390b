"""Forged identities against a real service (SQLite) on 127.0.0.1: what `?flag=tcp_fallback`
and the victim's summary show after each attack.

    .venv/bin/python -m benchmarks.reliability.forged_identity [--json]

Each attack gets a fresh service and database. The victim is one llm-d request as HEAD emits
it (tests/server/release_corpus.py, the official OTLP exporters), emitter-shaped (each process
forwarded for its pod's address by a trusted proxy, no `k8s.*`) or collector-shaped (every
process through a trusted collector whose k8sattributes adds `k8s.*`). The attacks are those of
tests/reliability/test_forged_joins.py; the printed row is the victim after the service has
settled (`--settle-s` after the last span).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

import tests.reliability.test_forged_joins as forged
import tests.server.release_corpus as corpus
from railtrace.server.runner import Service
from tests.service_helpers import get_request

Attack = Callable[[Service, Any, dict[str, Any], str], None]


def _kv_claiming(claim: str, sender: str) -> Attack:
    def attack(svc: Service, fleet: Any, ids: dict[str, Any], shape: str) -> None:
        process = forged._forger(
            svc,
            {**forged._worker_resource(), **forged._claims(fleet, claim)},
            sender,
            "railtrace.kv_transfer",
        )
        forged._kv(process, ids["engine"], "tcp")
        process.close()

    return attack


def _request_without_identity(svc: Service, fleet: Any, ids: dict[str, Any], shape: str) -> None:
    sender = forged.COLLECTOR if shape == "collector" else None
    process = forged._forger(svc, corpus.vllm_resource("vllm-decode"), sender, "vllm.tracing.otel")
    forged._forged_request(process, ids)
    process.close()


def _rdma_request_claiming(svc: Service, fleet: Any, ids: dict[str, Any], shape: str) -> None:
    claims = forged._claims(fleet, "pod_name" if shape == "collector" else "pod_ip")
    engine = forged._forger(
        svc, {**corpus.vllm_resource("vllm-decode"), **claims}, forged.FORGER, "vllm.tracing.otel"
    )
    forged._forged_request(engine, ids)
    engine.close()
    worker = forged._forger(
        svc, {**forged._worker_resource(), **claims}, forged.FORGER, "railtrace.kv_transfer"
    )
    forged._kv(worker, ids["engine"], "rdma")
    worker.close()


# (name, shape, the victim's own transport, attack)
ATTACKS: list[tuple[str, str, str, Attack]] = [
    ("tcp KV span from 10.66.6.6, no claims", "emitter", "rdma", _kv_claiming("none", forged.ATTACKER)),
    (
        "tcp KV span via the collector, no pod found",
        "collector",
        "rdma",
        _kv_claiming("none", forged.COLLECTOR),
    ),
    (
        "tcp KV span from 10.99.99.99 claiming the decode k8s.pod.name",
        "collector",
        "rdma",
        _kv_claiming("pod_name", forged.FORGER),
    ),
    (
        "tcp KV span from 10.99.99.99 claiming the decode k8s.pod.name",
        "emitter",
        "rdma",
        _kv_claiming("pod_name", forged.FORGER),
    ),
    (
        "tcp KV span from 10.99.99.99 claiming the decode k8s.pod.ip",
        "collector",
        "rdma",
        _kv_claiming("pod_ip", forged.FORGER),
    ),
    (
        "tcp KV span from 10.99.99.99 claiming the decode k8s.pod.ip",
        "emitter",
        "rdma",
        _kv_claiming("pod_ip", forged.FORGER),
    ),
    ("forged request claiming the decode pod + rdma KV span", "collector", "tcp", _rdma_request_claiming),
    ("forged request claiming the decode pod + rdma KV span", "emitter", "tcp", _rdma_request_claiming),
    ("forged request without identity", "collector", "rdma", _request_without_identity),
    ("forged request without identity", "emitter", "rdma", _request_without_identity),
]


def _row(svc: Service, trace_id: str) -> dict[str, Any]:
    body = get_request(svc, trace_id) or {}
    kv = body.get("kv_transfer") or {}
    listed = httpx.get(
        f"{svc.http_url}/api/v1/requests", params={"flag": "tcp_fallback", "limit": 500}
    ).json()
    flagged = {item["trace_id"] for item in listed["items"]}
    return {
        "flags": [f["name"] for f in body.get("flags", [])],
        "transport": kv.get("transport"),
        "path_class": kv.get("path_class"),
        "victim_in_tcp_fallback_list": trace_id in flagged,
        "tcp_fallback_list": len(flagged),
        "rejected_notes": len(body.get("coverage", {}).get("rejected", [])),
    }


def run(settle_s: float) -> list[dict[str, Any]]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "cluster"
        fleet = corpus.live_cluster(folder)
        for n, (name, shape, transport, attack) in enumerate(ATTACKS):
            db = f"sqlite:///{Path(tmp) / f'railtrace-{n}.db'}"
            with Service(forged._settings(db, folder, shape)) as svc:
                ids, _ = forged._victim(svc, fleet, forged.HEAD, shape, transport=transport)
                victim = ids["traces"][0]
                before = _row(svc, victim)
                attack(svc, fleet, ids, shape)
                time.sleep(settle_s)
                out.append(
                    {
                        "attack": name,
                        "shape": shape,
                        "victim": transport,
                        "before": before,
                        "after": _row(svc, victim),
                    }
                )
    return out


def _text(side: dict[str, Any]) -> str:
    listed = "listed" if side["victim_in_tcp_fallback_list"] else "not listed"
    flags = ",".join(side["flags"]) or "no flags"
    return (
        f"{side['transport']}/{side['path_class']}, {flags}; {listed} in ?flag=tcp_fallback "
        f"({side['tcp_fallback_list']} listed); {side['rejected_notes']} rejected"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = run(args.settle_s)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(f"{r['attack']} [{r['shape']}, victim {r['victim']}]")
        print(f"  victim alone: {_text(r['before'])}")
        print(f"  after attack: {_text(r['after'])}")


if __name__ == "__main__":
    main()
