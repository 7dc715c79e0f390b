"""railtrace's Tempo query API, checked against Tempo's published message definitions and the way
Grafana's Tempo data source calls it and reads the answers.

Upstream (read, not copied): grafana/grafana pkg/tsdb/tempo/trace.go @ e75b5e7dd363 (v2 then v1 trace
by id, `Accept: application/protobuf`, `tempopb.TraceByIDResponse` / `tempopb.Trace`), pkg/tsdb/tempo/
search.go @ ca422244c079 (`GET /api/search?q&limit&spss&start&end`, JSON, `startTimeUnixNano` and
`durationNanos` as strings), public/app/plugins/datasource/tempo/SearchTraceQLEditor/utils.test.ts
@ 12e7d8e153a2 (TraceQL the search builder writes); grafana/tempo pkg/tempopb/tempo.proto
@ 903f05891979 (field numbers). The messages are declared here from those field numbers and the
bodies decoded with the protobuf runtime, as Grafana's Go client decodes them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.trace.v1 import trace_pb2

from railtrace_tracing import semconv
from railtrace_tracing.semconv import FlagName
from tests.ui.ui_helpers import first_with_flag

PROTOBUF = {"accept": "application/protobuf"}


def _tempopb() -> tuple[Any, Any]:
    """tempopb.Trace {repeated ResourceSpans batches = 1} and tempopb.TraceByIDResponse
    {Trace trace = 1; TraceByIDMetrics metrics = 2; PartialStatus status = 3; string message = 4}."""
    pool = descriptor_pool.DescriptorPool()
    # The OTLP files tempopb imports, from the OTLP package's own descriptors.
    default = trace_pb2.DESCRIPTOR.pool
    for name in (
        "opentelemetry/proto/common/v1/common.proto",
        "opentelemetry/proto/resource/v1/resource.proto",
        "opentelemetry/proto/trace/v1/trace.proto",
    ):
        fdp = descriptor_pb2.FileDescriptorProto()
        default.FindFileByName(name).CopyToProto(fdp)
        pool.Add(fdp)
    f = descriptor_pb2.FileDescriptorProto(
        name="tempopb/tempo.proto",
        package="tempopb",
        syntax="proto3",
        dependency=["opentelemetry/proto/trace/v1/trace.proto"],
    )
    t = f.message_type.add(name="Trace")
    t.field.add(
        name="batches", number=1, label=3, type=11, type_name=".opentelemetry.proto.trace.v1.ResourceSpans"
    )
    f.message_type.add(name="TraceByIDMetrics")
    r = f.message_type.add(name="TraceByIDResponse")
    r.field.add(name="trace", number=1, label=1, type=11, type_name=".tempopb.Trace")
    r.field.add(name="metrics", number=2, label=1, type=11, type_name=".tempopb.TraceByIDMetrics")
    e = r.enum_type.add(name="PartialStatus")
    e.value.add(name="COMPLETE", number=0)
    e.value.add(name="PARTIAL", number=1)
    r.field.add(
        name="status", number=3, label=1, type=14, type_name=".tempopb.TraceByIDResponse.PartialStatus"
    )
    r.field.add(name="message", number=4, label=1, type=9)
    pool.Add(f)
    get = message_factory.GetMessageClass
    return get(pool.FindMessageTypeByName("tempopb.Trace")), get(
        pool.FindMessageTypeByName("tempopb.TraceByIDResponse")
    )


TRACE, TRACE_BY_ID = _tempopb()


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _spans(batches: Any) -> list[Any]:
    return [s for rs in batches for ss in rs.scope_spans for s in ss.spans]


def _root_attrs(batches: Any) -> dict[str, Any]:
    spans = _spans(batches)
    ids = {s.span_id for s in spans}
    roots = [s for s in spans if not s.parent_span_id or s.parent_span_id not in ids]
    root = min(roots, key=lambda s: s.start_time_unix_nano)
    return {kv.key: _value(kv.value) for kv in root.attributes}


def test_trace_by_id_v2_is_a_tempopb_trace_by_id_response_with_the_verdict(any_api: httpx.Client) -> None:
    s = first_with_flag(any_api, "tcp_fallback")
    resp = any_api.get(f"/api/v2/traces/{s['trace_id']}", headers=PROTOBUF)
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/protobuf"
    msg = TRACE_BY_ID.FromString(resp.content)
    assert msg.status == 0  # COMPLETE
    spans = _spans(msg.trace.batches)
    assert len(spans) == s["span_count"]
    assert {sp.trace_id.hex() for sp in spans} == set(s["trace_ids"])
    root = _root_attrs(msg.trace.batches)
    assert set(root[semconv.VERDICT_FLAGS]) == {f["name"] for f in s["flags"]}
    assert root[semconv.VERDICT_PATH_CLASS] == "tcp"
    assert root[semconv.VERDICT_NODE] == [s["prefill"]["node"], s["decode"]["node"]]
    assert any(e.startswith("tcp_fallback: span ") for e in root[semconv.VERDICT_EVIDENCE])
    assert root[semconv.VERDICT_URL].endswith(f"/requests/{s['trace_id']}")
    # Service names travel as resources, one ResourceSpans per process.
    services = {
        kv.value.string_value
        for rs in msg.trace.batches
        for kv in rs.resource.attributes
        if kv.key == "service.name"
    }
    assert {"llm-d-router/epp"} <= services and len(services) >= 3


def test_trace_by_id_v1_is_a_tempopb_trace(any_api: httpx.Client) -> None:
    s = first_with_flag(any_api, "cross_rail")
    resp = any_api.get(f"/api/traces/{s['trace_id']}", params={"start": 0, "end": 0}, headers=PROTOBUF)
    msg = TRACE.FromString(resp.content)
    assert len(_spans(msg.batches)) == s["span_count"]
    assert "cross_rail" in _root_attrs(msg.batches)[semconv.VERDICT_FLAGS]
    kv_span = next(sp for sp in _spans(msg.batches) if sp.name == semconv.SPAN_KV_TRANSFER)
    assert kv_span.end_time_unix_nano > kv_span.start_time_unix_nano > 0
    # JSON when JSON is asked for: Tempo's `batches` (v1) and `trace.resourceSpans` (v2).
    assert any_api.get(f"/api/traces/{s['trace_id']}").json()["batches"]
    assert any_api.get(f"/api/v2/traces/{s['trace_id']}").json()["trace"]["resourceSpans"]


def test_trace_by_id_errors(any_api: httpx.Client) -> None:
    # Grafana retries v1 on a v2 404 and then shows the status and body.
    assert any_api.get("/api/v2/traces/" + "0" * 32, headers=PROTOBUF).status_code == 404
    assert any_api.get("/api/traces/" + "0" * 32, headers=PROTOBUF).status_code == 404
    assert any_api.get("/api/v2/traces/not-hex", headers=PROTOBUF).status_code == 400


def _search(api: httpx.Client, q: str, **params: Any) -> list[dict[str, Any]]:
    resp = api.get("/api/search", params={"q": q, **params}, headers={"accept": "application/json"})
    assert resp.status_code == 200, resp.text
    traces = resp.json()["traces"]
    for t in traces:  # the shape Grafana's search.go reads
        int(t["startTimeUnixNano"])
        assert isinstance(t["durationMs"], int) and len(t["traceID"]) == 32
        assert t["rootServiceName"] and t["rootTraceName"]
        for ss in t["spanSets"]:
            assert isinstance(ss["matched"], int)
            for sp in ss["spans"]:
                int(sp["startTimeUnixNano"]), int(sp["durationNanos"])
                assert all("key" in a and "value" in a for a in sp["attributes"])
    return traces


def _summary(api: httpx.Client, trace_id: str) -> dict[str, Any]:
    return api.get(f"/api/v1/requests/{trace_id}").json()


def test_search_by_railtraces_tags(any_api: httpx.Client) -> None:
    # As Grafana's search builder writes them: unscoped `.tag="value"`, joined by &&.
    found = _search(any_api, '{.railtrace.verdict.flags="tcp_fallback"}', limit=100)
    expected = any_api.get("/api/v1/requests", params={"flag": "tcp_fallback", "limit": 100}).json()["items"]
    assert [t["traceID"] for t in found] == [s["trace_id"] for s in expected] != []
    pc = _search(any_api, '{span.railtrace.verdict.path_class="rdma_cross_rail"}', limit=5)
    assert pc and all(
        _summary(any_api, t["traceID"])["kv_transfer"]["path_class"] == "rdma_cross_rail" for t in pc
    )
    node = expected[0]["decode"]["node"]
    by_node = _search(any_api, f'{{.railtrace.verdict.node="{node}"}}', limit=200)
    assert by_node and all(
        node
        in (
            _summary(any_api, t["traceID"])["prefill"]["node"],
            _summary(any_api, t["traceID"])["decode"]["node"],
        )
        for t in by_node
    )
    # Regex over flags (several values picked in the builder): checked on the request.
    either = _search(any_api, '{.railtrace.verdict.flags=~"tcp_fallback|cross_rail"}', limit=200)
    assert either and all(
        {"tcp_fallback", "cross_rail"} & {f["name"] for f in _summary(any_api, t["traceID"])["flags"]}
        for t in either
    )
    # The verdict shows on the result's root span.
    attrs = {a["key"] for a in found[0]["spanSets"][0]["spans"][0]["attributes"]}
    assert semconv.VERDICT_FLAGS in attrs and semconv.VERDICT_PATH_CLASS in attrs


def test_search_by_service_and_duration(any_api: httpx.Client) -> None:
    slow = _search(any_api, '{resource.service.name="vllm-decode" && duration>2s}', limit=50, spss=5)
    assert slow
    for t in slow:
        for sp in t["spanSets"][0]["spans"]:
            assert int(sp["durationNanos"]) > 2e9
            assert {"key": "service.name", "value": {"stringValue": "vllm-decode"}} in sp["attributes"]
    e2e = sorted(s["e2e_s"] for s in any_api.get("/api/v1/requests", params={"limit": 1000}).json()["items"])
    cut_ms = round(e2e[len(e2e) // 2] * 1000)  # the median request's duration
    fast = _search(any_api, f"{{traceDuration<{cut_ms}ms}}", limit=200)
    assert fast and all(t["durationMs"] <= cut_ms for t in fast)
    rest = _search(any_api, f"{{traceDuration>={cut_ms}ms}}", limit=200)
    assert not {t["traceID"] for t in fast} & {t["traceID"] for t in rest}
    assert len(fast) + len(rest) == len(e2e)
    legacy = any_api.get("/api/search", params={"minDuration": "5s", "limit": 50}).json()["traces"]
    assert legacy and all(t["durationMs"] >= 5000 for t in legacy)
    # Combined with a flag, and a time range that holds nothing.
    both = _search(
        any_api, '{.railtrace.verdict.flags="tcp_fallback" && duration>1s && status!=error}', limit=50
    )
    assert {t["traceID"] for t in both} <= {
        t["traceID"] for t in _search(any_api, '{.railtrace.verdict.flags="tcp_fallback"}', limit=100)
    }
    assert _search(any_api, "{}", start=1, end=2) == []
    assert len(_search(any_api, "{}", limit=3)) == 3


def test_search_refuses_what_it_cannot_answer(any_api: httpx.Client) -> None:
    for q in ('{.a="b" || .c="d"}', "{ .a = }", '{.a="b"} | count() > 2', "{nosuchfield=1}"):
        resp = any_api.get("/api/search", params={"q": q})
        assert resp.status_code == 400 and "TraceQL" in resp.json()["detail"], (q, resp.text)


def test_tags_and_values(any_api: httpx.Client) -> None:
    scopes = {s["name"]: s["tags"] for s in any_api.get("/api/v2/search/tags").json()["scopes"]}
    assert semconv.VERDICT_FLAGS in scopes["span"] and "service.name" in scopes["resource"]
    assert semconv.VERDICT_FLAGS in any_api.get("/api/search/tags").json()["tagNames"]
    flags = any_api.get(f"/api/v2/search/tag/span.{semconv.VERDICT_FLAGS}/values").json()["tagValues"]
    assert {v["value"] for v in flags} == {f.value for f in FlagName} and flags[0]["type"] == "string"
    services = any_api.get("/api/search/tag/service.name/values").json()["tagValues"]
    assert "vllm-decode" in services or any("decode" in s for s in services)
    nodes = any_api.get(f"/api/v2/search/tag/{semconv.VERDICT_NODE}/values").json()["tagValues"]
    assert len(nodes) == len(any_api.get("/api/v1/topology").json()["nodes"])


def test_connection_test_version_and_token(api: httpx.Client, service: Any) -> None:
    assert api.get("/api/echo").text == "echo"
    info = api.get("/api/status/buildinfo").json()
    assert datetime.strptime(info["buildDate"], "%Y-%m-%d") and info["version"].startswith("2.")
    # The data source sends the API token as a header (provisioned `httpHeaderName1`).
    for path in ("/api/echo", "/api/search", "/api/v2/traces/" + "0" * 32):
        assert httpx.get(service.http_url + path).status_code == 401


@pytest.mark.parametrize("accept", ["application/protobuf", "application/json"])
def test_every_request_opens(any_api: httpx.Client, accept: str) -> None:
    items = any_api.get("/api/v1/requests", params={"limit": 1000}).json()["items"]
    for s in items[:: max(1, len(items) // 10)]:
        assert any_api.get(f"/api/v2/traces/{s['trace_id']}", headers={"accept": accept}).status_code == 200


def test_short_trace_ids_are_padded_and_errors_carry_message(any_api: httpx.Client) -> None:
    """Tempo reads 1 to 32 hex digits, left-padded with zeros (grafana/tempo pkg/util/traceid.go
    `hexStringToID`, v2.9.0): a 64-bit id is looked up (404 when absent, so Grafana moves on)
    rather than refused. Errors carry `message`, which Grafana shows, beside `detail`."""
    s = any_api.get("/api/v1/requests", params={"limit": 1}).json()["items"][0]
    short = s["trace_id"].lstrip("0") or "0"
    assert any_api.get(f"/api/v2/traces/{short.upper()}", headers=PROTOBUF).status_code == 200
    assert any_api.get("/api/v2/traces/" + "a" * 16, headers=PROTOBUF).status_code == 404
    bad = any_api.get("/api/traces/" + "a" * 33)
    assert bad.status_code == 400 and "hex" in bad.json()["message"] == bad.json()["detail"]
    missing = any_api.get("/api/traces/" + "0" * 32)
    assert missing.status_code == 404 and missing.json()["message"]
    refused = any_api.get("/api/search", params={"q": "{nosuchfield=1}"})
    assert refused.status_code == 400 and "TraceQL" in refused.json()["message"]
    invalid = any_api.get("/api/search", params={"limit": "many"})
    assert invalid.status_code == 422 and "limit" in invalid.json()["message"]


def test_buildinfo_claims_no_streaming(api: httpx.Client) -> None:
    """Grafana offers search streaming from Tempo 2.2.0 and metrics streaming from 2.7.0
    (public/app/plugins/datasource/tempo/datasource.ts, `featuresToTempoVersion`), both gRPC,
    which railtrace does not serve: the version claimed must be below both."""
    version = tuple(int(p) for p in api.get("/api/status/buildinfo").json()["version"].split("."))
    assert (2, 0, 0) <= version < (2, 2, 0)


def _metrics(api: httpx.Client, path: str, **params: Any) -> dict[str, Any]:
    resp = api.get(path, params=params)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _labels(series: dict[str, Any]) -> dict[str, Any]:
    return {lab["key"]: next(iter(lab["value"].values()), None) for lab in series["labels"]}


def test_traceql_metrics_count_what_the_api_counts(any_api: httpx.Client) -> None:
    """`/api/metrics/query_range` and `/api/metrics/query` in the shapes of grafana/tempo v2.9.0
    pkg/tempopb/tempo.proto (QueryRangeResponse: series of labels, samples with `timestampMs` as
    a string; QueryInstantResponse: one `value`), counting requests as the stats API does."""
    items = any_api.get("/api/v1/requests", params={"limit": 1000}).json()["items"]
    starts = [datetime.fromisoformat(s["start"].replace("Z", "+00:00")).timestamp() for s in items]
    start, end = int(min(starts)) - 1, int(max(starts)) + 1
    by_class = {
        g["path_class"]: g["requests"]
        for g in any_api.get("/api/v1/stats", params={"group_by": "path_class"}).json()["groups"]
    }
    q = "{} | count_over_time() by (span.railtrace.verdict.path_class)"
    instant = _metrics(any_api, "/api/metrics/query", q=q, start=start, end=end)
    assert {_labels(s)[semconv.VERDICT_PATH_CLASS]: s["value"] for s in instant["series"]} == by_class
    ranged = _metrics(any_api, "/api/metrics/query_range", q=q, start=start, end=end, step="5s")
    totals: dict[str, float] = {}
    for s in ranged["series"]:
        stamps = [int(p["timestampMs"]) for p in s["samples"]]
        assert stamps == sorted(stamps) and all(t % 5000 == 0 for t in stamps)
        key = _labels(s)[semconv.VERDICT_PATH_CLASS]
        totals[key] = totals.get(key, 0) + sum(p["value"] for p in s["samples"])
    assert totals == by_class
    # Traces Drilldown's "traces" view: root spans; ungrouped series named after the function.
    rate = _metrics(any_api, "/api/metrics/query", q="{nestedSetParent<0} | rate()", start=start, end=end)
    (only,) = rate["series"]
    assert _labels(only) == {"__name__": "rate"}
    assert abs(only["value"] * (end - start) - len(items)) < 1e-6
    # A flag's count, quantiles of TTFT by flag, and pairs.
    flagged = _metrics(
        any_api,
        "/api/metrics/query",
        q='{.railtrace.verdict.flags="tcp_fallback"} | count_over_time()',
        start=start,
        end=end,
    )
    n = any_api.get("/api/v1/requests", params={"flag": "tcp_fallback", "limit": 1000}).json()["items"]
    assert flagged["series"][0]["value"] == len(n) > 0
    quantiles = _metrics(
        any_api,
        "/api/metrics/query_range",
        q="{} | quantile_over_time(.railtrace.verdict.ttft, .5, .99) by (.railtrace.verdict.flags)",
        start=start,
        end=end,
    )
    assert {_labels(s)["p"] for s in quantiles["series"]} == {0.5, 0.99}
    pairs = _metrics(
        any_api, "/api/metrics/query", q="{} | rate() by (railtrace.verdict.pair)", start=start, end=end
    )
    assert all(
        " -> " in str(_labels(s)["railtrace.verdict.pair"])
        for s in pairs["series"]
        if _labels(s)["railtrace.verdict.pair"]
    )
    for bad in ('{.x="y"} | rate()', "{} | histogram_over_time(duration)", "{} | rate() by (span.x)", "{}"):
        resp = any_api.get("/api/metrics/query_range", params={"q": bad, "start": start, "end": end})
        assert resp.status_code == 400 and "TraceQL" in resp.json()["message"], (bad, resp.text)
