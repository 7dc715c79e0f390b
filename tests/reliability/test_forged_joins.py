"""A holder of the ingest token cannot change another request's verdict by reusing its ids.

Each test sends a real request as llm-d emits it (tests/server/release_corpus.py: the
official OpenTelemetry SDK and OTLP/HTTP exporter, each process forwarded for its pod's
address by a trusted proxy, the cluster's objects as topology), waits for its summary, then
attacks it from another sender address with the request's ids, and checks that the summary's
verdict, primary trace and stitching are unchanged and the evidence names what was rejected.

Two shapes of resource: emitter-shaped (what the processes emit, no `k8s.*`: identity by
sender address) and collector-shaped (every process exports through a trusted collector
whose k8sattributes adds `k8s.pod.name`, `k8s.pod.ip` and the rest). Claims an attacker
makes about itself (`k8s.pod.name`, `k8s.pod.ip`) count only where its sender address agrees
or a trusted collector vouches for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import tests.server.release_corpus as corpus
from railtrace.scheduling.grouping import MAX_KEY_FANOUT
from railtrace.server.runner import Service
from tests.reliability.reliability_helpers import post
from tests.service_helpers import get_request, settings_for, wait_for

ATTACKER = "10.66.6.6"
FORGER = "10.99.99.99"  # an address no pod has
COLLECTOR = "10.250.0.10"  # the trusted collector every process of the collector shape exports through
SHAPES = ("collector", "emitter")
HEAD = next(r for r in corpus.RELEASES if r.name == "HEAD")
V0_9 = next(r for r in corpus.RELEASES if r.name == "v0.9.0")
VERDICT = ("flags", "kv_transfer", "ttft_s", "prefill", "decode", "trace_id", "trace_ids")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("cluster")
    return folder, corpus.live_cluster(folder)


def _victim(
    svc: Service, fleet: Any, rel: corpus.Release, shape: str = "emitter", transport: str = "rdma"
) -> tuple[dict[str, Any], dict[str, Any]]:
    prefill = fleet.pods_of("topology-aware", "prefill")[0]
    decode = fleet.pods_of("topology-aware", "decode")[0]
    collector = COLLECTOR if shape == "collector" else None
    ids = corpus.emit(_endpoints(svc), rel, "full", prefill, decode, collector=collector, transport=transport)

    def stitched() -> dict[str, Any] | None:
        body = get_request(svc, ids["traces"][0])
        return body if body and len(body["trace_ids"]) == len(ids["traces"]) else None

    before = wait_for(stitched, what="the victim's request assembled")
    assert before["kv_transfer"]["transport"] == transport, before
    want = ["tcp_fallback"] if transport == "tcp" else []
    assert [f["name"] for f in before["flags"]] == want, before
    return ids, before


def _endpoints(svc: Service) -> corpus.Endpoints:
    return corpus.Endpoints(svc.http_url, svc.grpc_endpoint)


def _attacker(svc: Service) -> corpus.Process:
    return corpus.Process(
        _endpoints(svc),
        {**corpus.vllm_resource("vllm-decode"), "vllm.process_kind": "worker"},
        "railtrace.kv_transfer",
        ATTACKER,
    )


def _rejected_once(svc: Service, trace_id: str, forged: str) -> dict[str, Any]:
    def noted() -> dict[str, Any] | None:
        body = get_request(svc, trace_id)
        rejected = " ".join((body or {}).get("coverage", {}).get("rejected", []))
        return body if forged in rejected or (forged == "" and rejected) else None

    return wait_for(noted, what="the forged candidate reported")


def _same_verdict(before: dict[str, Any], after: dict[str, Any]) -> None:
    for key in VERDICT:
        assert after[key] == before[key], (key, before[key], after[key])


def test_forged_kv_span_from_another_sender_changes_no_verdict(
    db_url: str, cluster: tuple[Path, Any]
) -> None:
    folder, fleet = cluster
    with Service(settings_for(db_url, topology=[str(folder)], trusted_proxies=["127.0.0.1/32"])) as svc:
        ids, before = _victim(svc, fleet, HEAD)
        attacker = _attacker(svc)
        forged = attacker.span(
            "llm_d.kv_transfer",
            61,
            900,
            {
                "llm_d.kv_transfer.request_id": ids["engine"],
                "llm_d.kv_transfer.transport": "tcp",
                "llm_d.kv_transfer.operation": "read",
            },
        )
        attacker.close()
        after = _rejected_once(svc, ids["traces"][0], format(forged.context.trace_id, "032x"))
        _same_verdict(before, after)
        assert "tcp_fallback" not in {f["name"] for f in after["flags"]}
        assert ATTACKER in " ".join(after["coverage"]["rejected"])


def test_forged_earlier_gateway_request_is_not_the_primary_trace(
    db_url: str, cluster: tuple[Path, Any]
) -> None:
    folder, fleet = cluster
    with Service(settings_for(db_url, topology=[str(folder)], trusted_proxies=["127.0.0.1/32"])) as svc:
        ids, before = _victim(svc, fleet, HEAD)
        attacker = corpus.Process(
            _endpoints(svc),
            {"service.name": "llm-d-router/epp"},
            "llm-d-router/pkg/epp/handlers",
            ATTACKER,
            grpc=True,  # the EPP exports OTLP/gRPC
        )
        forged = attacker.span(
            "gateway.request",
            -1000,
            5000,
            {"gen_ai.request.id": ids["epp_id"], "http.request.header.x-request-id": [ids["epp_id"]]},
            kind=trace.SpanKind.SERVER,
        )
        attacker.close()
        forged_trace = format(forged.context.trace_id, "032x")
        after = _rejected_once(svc, ids["traces"][0], forged_trace)
        _same_verdict(before, after)
        assert after["trace_id"] == ids["traces"][0] and forged_trace not in after["trace_ids"]
        # Found by its own ids, the request is still the victim's.
        assert get_request(svc, ids["epp_id"])["trace_id"] == ids["traces"][0]


def test_junk_traces_past_the_cap_keep_the_stitch_and_kv_verdict(
    db_url: str, cluster: tuple[Path, Any]
) -> None:
    folder, fleet = cluster
    with Service(settings_for(db_url, topology=[str(folder)], trusted_proxies=["127.0.0.1/32"])) as svc:
        ids, before = _victim(svc, fleet, V0_9)  # orphan engine traces: stitched by the ids
        assert len(before["trace_ids"]) > 1
        attacker = _attacker(svc)
        for i in range(MAX_KEY_FANOUT + 1):
            attacker.span(
                "junk",
                i,
                i + 1,
                {
                    "gen_ai.request.id": ids["public"],
                    "llm_d.pd_proxy.request_id": ids["sidecar_id"],
                    "llm_d.kv_transfer.request_id": ids["engine"],
                },
            )
        attacker.close()
        after = _rejected_once(svc, ids["traces"][0], "later traces carrying request id")
        _same_verdict(before, after)
        assert after["kv_transfer"]["transport"] == "rdma" and sorted(after["trace_ids"]) == sorted(
            before["trace_ids"]
        )


def _junk_chain(trace_ids: list[int], first_key: str) -> bytes:
    """Junk traces linked pairwise by ids (trace i carries chain-i and chain-i+1), the first
    also carrying `first_key`: one group with the request that holds that key."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "junk"
    ss = rs.scope_spans.add()
    for i, tid in enumerate(trace_ids):
        for j, key in enumerate([f"junk-chain-{i}", f"junk-chain-{i + 1}", first_key][: 3 if i == 0 else 2]):
            s = ss.spans.add()
            s.trace_id = tid.to_bytes(16, "big")
            s.span_id = (i * 10 + j + 1).to_bytes(8, "big")
            s.name = "junk"
            s.start_time_unix_nano = corpus.T0 + i * 10**6 + j
            s.end_time_unix_nano = corpus.T0 + i * 10**6 + j + 500
            s.attributes.add(key="gen_ai.request.id").value.string_value = key
    return req.SerializeToString()


def test_a_junk_chain_past_the_group_bound_keeps_the_victim_whole(
    db_url: str, cluster: tuple[Path, Any]
) -> None:
    """A chain of junk traces linked to a stitched request by its id, long enough to split the
    group (`max_group_traces`), trace ids sorting between the victim's own: the victim's traces
    stay one request with its verdict (before: parts by trace id cut the victim apart)."""
    folder, fleet = cluster
    settings = settings_for(
        db_url, topology=[str(folder)], trusted_proxies=["127.0.0.1/32"], max_group_traces=6
    )
    with Service(settings) as svc:
        ids, before = _victim(svc, fleet, V0_9)  # orphan engine traces: stitched by the ids
        assert len(before["trace_ids"]) > 1
        victim = sorted(int(t, 16) for t in before["trace_ids"])
        junk = [t + d for t in victim for d in (-2, -1, 1, 2)] + [victim[-1] + 3 + i for i in range(12)]
        with httpx.Client(base_url=svc.http_url, timeout=30) as client:
            assert post(client, _junk_chain(junk, ids["public"])).status_code == 200

        def split() -> dict[str, Any] | None:
            body = get_request(svc, ids["traces"][0])
            rejected = " ".join((body or {}).get("coverage", {}).get("rejected", []))
            return body if "max_group_traces" in rejected else None

        after = wait_for(split, what="the victim re-assembled in a split group")
        _same_verdict(before, after)
        assert after["kv_transfer"]["transport"] == "rdma"


# -- Claimed identities: k8s.pod.name and k8s.pod.ip are the sender's word --------------------


def _settings(db_url: str, folder: Path, shape: str) -> Any:
    """Every process arrives through loopback as a trusted proxy naming its sender; in the
    collector shape that sender is the trusted collector."""
    collectors = [f"{COLLECTOR}/32"] if shape == "collector" else []
    return settings_for(
        db_url, topology=[str(folder)], trusted_proxies=["127.0.0.1/32"], trusted_collectors=collectors
    )


def _claims(fleet: Any, claim: str) -> dict[str, Any]:
    """The resource attributes a forger adds to pass for the victim's decode pod."""
    decode = fleet.pods_of("topology-aware", "decode")[0]
    return {
        "none": {},
        "pod_name": {
            "k8s.pod.name": decode.name,
            "k8s.namespace.name": "llm-d",
            "k8s.node.name": decode.node.name,
        },
        "pod_ip": {"k8s.pod.ip": decode.ip},
    }[claim]


def _forger(svc: Service, resource: dict[str, Any], sender: str | None, scope: str) -> corpus.Process:
    return corpus.Process(_endpoints(svc), resource, scope, sender)


def _worker_resource() -> dict[str, Any]:
    return {**corpus.vllm_resource("vllm-decode"), "vllm.process_kind": "worker"}


def _kv(process: corpus.Process, engine_id: str, transport: str) -> str:
    span = process.span(
        "llm_d.kv_transfer",
        61,
        900,
        {
            "llm_d.kv_transfer.request_id": engine_id,
            "llm_d.kv_transfer.transport": transport,
            "llm_d.kv_transfer.operation": "read",
        },
    )
    return format(span.context.trace_id, "032x")


def _forged_request(process: corpus.Process, ids: dict[str, Any]) -> str:
    """A whole request of the forger's own with the victim's ids: a `gateway.request` with a
    decode `llm_request` under it (so it is never merged into the victim's)."""
    gateway = process.tracer.start_span(
        "gateway.request",
        kind=trace.SpanKind.SERVER,
        attributes={"gen_ai.request.id": ids["epp_id"]},
        start_time=corpus.T0 + 10 * corpus.MS,
    )
    process.span(
        "llm_request",
        11,
        2900,
        corpus.llm_request(512, 200, 0.3, 0.2, 2.8, ids["public"]),
        gateway,
        trace.SpanKind.SERVER,
    )
    gateway.end(end_time=corpus.T0 + 2901 * corpus.MS)
    return format(gateway.context.trace_id, "032x")


def _flagged(svc: Service, flag: str) -> set[str]:
    items = httpx.get(f"{svc.http_url}/api/v1/requests", params={"flag": flag, "limit": 500}).json()["items"]
    return {item["trace_id"] for item in items}


def _settled(svc: Service, trace_id: str, done: Any, what: str) -> dict[str, Any]:
    return wait_for(lambda: (lambda b: b if b and done(b) else None)(get_request(svc, trace_id)), what=what)


@pytest.mark.parametrize(
    ("shape", "claim", "sender"),
    [
        # Through the trusted collector, which found no pod for the forger: no identity at all.
        ("collector", "none", COLLECTOR),
        # From an address no pod has, claiming the decode pod's name or address.
        ("collector", "pod_name", FORGER),
        ("collector", "pod_ip", FORGER),
        ("emitter", "pod_ip", FORGER),
    ],
)
def test_forged_tcp_kv_span_claiming_the_decode_pod_changes_no_verdict(
    db_url: str, cluster: tuple[Path, Any], shape: str, claim: str, sender: str
) -> None:
    folder, fleet = cluster
    with Service(_settings(db_url, folder, shape)) as svc:
        ids, before = _victim(svc, fleet, HEAD, shape)
        resource = {**_worker_resource(), **_claims(fleet, claim)}
        forger = _forger(svc, resource, sender, "railtrace.kv_transfer")
        forged = _kv(forger, ids["engine"], "tcp")
        forger.close()
        after = _rejected_once(svc, ids["traces"][0], forged)
        _same_verdict(before, after)
        assert ids["traces"][0] not in _flagged(svc, "tcp_fallback")
        rejected = " ".join(after["coverage"]["rejected"])
        assert sender in rejected or "no identity" in rejected, rejected


@pytest.mark.parametrize("shape", SHAPES)
def test_forged_rdma_request_does_not_hide_a_real_tcp_fallback(
    db_url: str, cluster: tuple[Path, Any], shape: str
) -> None:
    """The forger sends a request of its own with the victim's ids, claiming the decode pod,
    and an RDMA KV span claiming it too: the victim's own TCP transfer stays the victim's."""
    folder, fleet = cluster
    with Service(_settings(db_url, folder, shape)) as svc:
        ids, before = _victim(svc, fleet, HEAD, shape, transport="tcp")
        claims = _claims(fleet, "pod_name" if shape == "collector" else "pod_ip")
        engine = _forger(svc, {**corpus.vllm_resource("vllm-decode"), **claims}, FORGER, "vllm.tracing.otel")
        forged_request = _forged_request(engine, ids)
        engine.close()
        worker = _forger(svc, {**_worker_resource(), **claims}, FORGER, "railtrace.kv_transfer")
        forged_kv = _kv(worker, ids["engine"], "rdma")
        worker.close()
        after = _rejected_once(svc, ids["traces"][0], forged_kv)
        _same_verdict(before, after)
        assert after["kv_transfer"]["transport"] == "tcp"
        assert ids["kv_trace"] in after["trace_ids"] and forged_kv not in after["trace_ids"]
        assert ids["traces"][0] in _flagged(svc, "tcp_fallback")
        forged = _settled(svc, forged_request, lambda b: True, "the forger's own request")
        assert ids["kv_trace"] not in forged["trace_ids"]


@pytest.mark.parametrize("shape", SHAPES)
def test_forged_request_without_identity_keeps_the_victims_kv_hop(
    db_url: str, cluster: tuple[Path, Any], shape: str
) -> None:
    """A request of the forger's own with the victim's ids and no identity (through the
    collector, which found no pod for it; or from an address the service does not record)
    cannot take the victim's verified KV hop away (before: the hop fitted both requests and
    was dropped from each, the victim's path class became unknown)."""
    folder, fleet = cluster
    with Service(_settings(db_url, folder, shape)) as svc:
        ids, before = _victim(svc, fleet, HEAD, shape)
        sender = COLLECTOR if shape == "collector" else None  # loopback, no X-Forwarded-For
        engine = _forger(svc, corpus.vllm_resource("vllm-decode"), sender, "vllm.tracing.otel")
        forged_request = _forged_request(engine, ids)
        engine.close()
        # Both requests are assembled together (they share ids): once the forger's says where
        # the KV hop went, the victim's is final too.
        forged = _settled(
            svc,
            forged_request,
            lambda b: any(ids["kv_trace"] in note for note in b["coverage"].get("rejected", [])),
            "the KV hop reported in the forger's request",
        )
        after = get_request(svc, ids["traces"][0])
        assert after is not None
        _same_verdict(before, after)
        assert after["kv_transfer"]["path_class"] == before["kv_transfer"]["path_class"] != "unknown"
        assert ids["kv_trace"] not in forged["trace_ids"]


@pytest.mark.parametrize("claim", ["pod_name", "pod_ip"])
def test_forged_request_claiming_a_pod_is_not_placed_on_it(
    db_url: str, cluster: tuple[Path, Any], claim: str
) -> None:
    """A request of the forger's own (fresh ids) whose decode engine claims a real decode pod's
    `k8s.pod.name` or `k8s.pod.ip` from an address no pod has: its decode leg is not that pod, so
    the pod's and node's lists and stats never show it, and the claim is in `coverage.rejected`
    (before: the leg was read from the claimed name whoever sent it)."""
    folder, fleet = cluster
    decode = fleet.pods_of("topology-aware", "decode")[0]
    with Service(_settings(db_url, folder, "emitter")) as svc:
        resource = {**corpus.vllm_resource("vllm-decode"), **_claims(fleet, claim)}
        engine = _forger(svc, resource, FORGER, "vllm.tracing.otel")
        forged = _forged_request(engine, {"epp_id": "forged-epp-1", "public": "forged-public-1"})
        engine.close()
        body = _settled(svc, forged, lambda b: True, "the forger's request")
        assert body["decode"]["pod"] != decode.name, body["decode"]
        assert body["decode"]["node"] != decode.node.name, body["decode"]
        if claim == "pod_name":
            rejected = " ".join(body["coverage"].get("rejected", []))
            assert f"k8s.pod.name {decode.name} claimed without a trusted collector" in rejected, body
            assert FORGER in rejected
        listed = httpx.get(f"{svc.http_url}/api/v1/requests", params={"pod": decode.name}).json()["items"]
        assert forged not in {item["trace_id"] for item in listed}
