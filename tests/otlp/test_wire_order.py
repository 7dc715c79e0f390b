"""Spans encoded by the OpenTelemetry Collector, not only by the SDK.

The Collector's pdata writes a message's fields in descending order, so a KeyValue's value comes
before its key (tests/fixtures/wire/PROVENANCE.md). Ingest reads join keys and spots content
attributes in a span's bytes without decoding it; before, both looked only for the key followed
by its value: through a collector no join key was recorded (a KV transfer in a trace of its own
never joined its request) and the cheap content check missed `gen_ai.prompt`.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from railtrace.otlp import accelerators
from railtrace.otlp.export import prepare
from railtrace.otlp.rows import rows_from_request
from railtrace.server.runner import Service
from tests.reliability.reliability_helpers import post
from tests.service_helpers import settings_for, wait_for

WIRE = Path(__file__).resolve().parents[1] / "fixtures" / "wire"
PUBLIC = "0b8f2c1e-6a51-4d7a-9c3e-2f4d8e1a7b90"
PROMPT = b"PROMPT TEXT THAT MUST NOT BE STORED"
ORDERS = ("sdk-order", "collector-order")


def _raw(order: str, call: str = "all") -> bytes:
    """The `request`, `kv` or `content` call, or all three merged into one call."""
    if call != "all":
        return (WIRE / f"{order}-{call}.bin").read_bytes()
    return b"".join(_raw(order, c) for c in ("request", "kv", "content"))  # repeated fields concatenate


def _traces(raw: bytes) -> dict[str, str]:
    """Trace id of the first span of each name."""
    req = ExportTraceServiceRequest.FromString(raw)
    out: dict[str, str] = {}
    for s in (s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans):
        out.setdefault(s.name, s.trace_id.hex())
    return out


def test_the_fixtures_are_the_same_spans_in_another_field_order() -> None:
    sdk, col = (ExportTraceServiceRequest.FromString(_raw(o)) for o in ORDERS)
    assert sdk == col and len(sdk.resource_spans) == 3
    assert _raw("sdk-order") != _raw("collector-order")
    key = b"\x0a\x11gen_ai.request.id"
    at = _raw("collector-order").find(key)
    assert at > 0 and _raw("collector-order")[at + len(key)] != 0x12  # the value is not after the key


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("path", ["bytes", "parsed"])
def test_join_keys_are_read_in_either_field_order(order: str, path: str) -> None:
    raw = _raw(order, "request") + _raw(order, "kv")  # no content: the bytes path's usual call
    if path == "bytes" and accelerators.wirescan is None:
        pytest.skip("the C accelerator is not built")
    batch = (
        prepare(raw, content_free=True)
        if path == "bytes"
        else rows_from_request(ExportTraceServiceRequest.FromString(raw), raw=raw, content_free=True)
    )
    traces = _traces(raw)
    assert (PUBLIC, traces["llm_request"]) in batch.keys
    assert (PUBLIC, traces["llm_d.kv_transfer"]) in batch.keys  # the engine id's public form


@pytest.mark.parametrize("order", ORDERS)
def test_a_content_attribute_is_dropped_in_either_field_order(order: str) -> None:
    batch = prepare(_raw(order, "content"))
    assert batch.dropped_content_attributes == 1
    assert all(PROMPT not in chunk[4] for chunk in batch.chunks)


def test_through_the_collector_a_kv_trace_joins_its_request(db_url: str) -> None:
    """The collector's encoding through a running service: the request is assembled first, the
    KV transfer's own trace arrives later and is stitched into it by the ids (the store's
    `trace_keys` found the request's trace: before, neither call recorded a key), and a prompt
    in another call is not stored."""
    traces = _traces(_raw("collector-order", "request") + _raw("collector-order", "kv"))
    with Service(settings_for(db_url)) as svc, httpx.Client(base_url=svc.http_url, timeout=30) as client:
        assert post(client, _raw("collector-order", "request")).status_code == 200

        def assembled(n: int) -> dict[str, object] | None:
            r = client.get(f"/api/v1/requests/{traces['llm_request']}")
            body = r.json() if r.status_code == 200 else None
            return body if body and len(body["trace_ids"]) == n else None

        wait_for(lambda: assembled(1), what="the request assembled alone")
        time.sleep(10 * svc.settings.quiet_period_s + 1)  # and final: its trace no longer waits
        assert post(client, _raw("collector-order", "kv")).status_code == 200
        body = wait_for(lambda: assembled(2), what="the KV trace stitched into the request")
        assert sorted(body["trace_ids"]) == sorted(traces.values())  # type: ignore[arg-type]
        assert post(client, _raw("collector-order", "content")).status_code == 200
        other = _traces(_raw("collector-order", "content"))["llm_request"]
        wait_for(lambda: client.get(f"/api/v1/traces/{other}").status_code == 200, what="the other request")
        assert PROMPT.decode() not in client.get(f"/api/v1/traces/{other}").text
