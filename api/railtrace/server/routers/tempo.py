"""The query API of Grafana Tempo, so Grafana's built-in Tempo data source opens railtrace's traces.

Grafana (pkg/tsdb/tempo in grafana/grafana) fetches a trace as protobuf from `/api/v2/traces/{id}`
(`tempopb.TraceByIDResponse`), falling back to `/api/traces/{id}` (`tempopb.Trace`) on 404, and
searches with TraceQL through `GET /api/search` (JSON). Both trace messages wrap OTLP
`ResourceSpans` in field 1, so the bodies are built with the OTLP protobuf classes. The request's
verdict rides on the root span as `railtrace.verdict.*` attributes (tracing/railtrace_tracing/semconv.py).

Search supports the part of TraceQL Grafana's search builder writes (railtrace.query.traceql,
railtrace.query.search; docs/ui.md). This module frames HTTP only. Every search and trace read
runs through the runtime's `QueryGate` within a time and row budget (railtrace.query.budget):
one cut short answers with what it read, marked partial (`X-Railtrace-Partial`, and Tempo's own
`status: PARTIAL` on a v2 trace), or 503 if it read nothing it can answer with.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Status, TracesData
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from railtrace.model import Span
from railtrace.otlp.encode import key_value
from railtrace.query.budget import Budget, QueryUnavailable
from railtrace.query.reads import read_spans
from railtrace.query.search import (
    REQUEST_TAGS,
    SearchParams,
    parse_search,
    root_span,
    search,
    verdict_attributes,
)
from railtrace.query.traceql import DURATION, INTRINSICS, UNITS, TraceQLError
from railtrace.query.traceql_metrics import evaluate, parse_metrics_query, parse_step, parse_time
from railtrace.server.deps import RuntimeDep
from railtrace.server.routers.v1.params import unavailable
from railtrace.server.runtime import Runtime
from railtrace.server.ui import request_path
from railtrace.store import RequestQuery, StoreError
from railtrace_tracing import semconv
from railtrace_tracing.semconv import FlagName, PathClass


class TempoRoute(APIRoute):
    """A Tempo API route whose errors carry `message` beside FastAPI's `detail`: Grafana's Tempo
    data source shows an error's `message` (grafana/grafana's Tempo data source,
    v11.x), and would otherwise show only the status code."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except HTTPException as exc:
                return tempo_error(exc.status_code, str(exc.detail), exc.headers)
            except RequestValidationError as exc:
                errors = exc.errors()
                first = errors[0] if errors else {}
                where = ".".join(str(p) for p in first.get("loc", ()))
                return tempo_error(422, f"{where}: {first.get('msg', 'invalid request')}", None, errors)

        return answer


def tempo_error(
    status: int, message: str, headers: Mapping[str, str] | None = None, detail: Any = None
) -> Response:
    """An error as Grafana reads it (`message`), with FastAPI's `detail` kept for other clients."""
    body = {"message": message, "detail": message if detail is None else detail}
    return Response(orjson.dumps(body), status, headers=dict(headers or {}), media_type="application/json")


router = APIRouter(tags=["tempo"], route_class=TempoRoute)

PROTOBUF = "application/protobuf"
# The Tempo version `/api/status/buildinfo` claims. Grafana turns features on by the version it
# reads there (grafana/grafana public/app/plugins/datasource/tempo/datasource.ts,
# `featuresToTempoVersion`, v11.x and v12.x: search streaming from 2.2.0, metrics streaming from
# 2.7.0, both over gRPC, which railtrace does not serve). 2.1.x is the last version before either,
# so Grafana asks railtrace only over HTTP: trace by id, search, tags and TraceQL metrics, all
# served here. Claiming 2.6.0 made Grafana offer streaming when a user turned it on.
TEMPO_API_VERSION = "2.1.1"
# Trace ids as Tempo takes them: up to 32 hex digits (shorter ones are left-padded).
SHORT_TRACE_ID = re.compile(r"^[0-9a-fA-F]{1,32}$")
DEFAULT_LIMIT = 20
MAX_SEARCH_LIMIT = 500
# The header that marks an answer a budget cut short, with the reason.
PARTIAL_HEADER = "X-Railtrace-Partial"


# -- Trace by id ------------------------------------------------------------------------


def _request_url(base_url: str) -> Callable[[str], str]:
    """A request's page in the UI, linked from the verdict on its root span."""
    base = base_url.rstrip("/")
    return lambda trace_id: base + request_path(trace_id)


def traces_data(spans: list[Span], summary: dict[str, Any] | None, base_url: str) -> TracesData:
    """Spans as OTLP, grouped by resource and scope; the verdict on the root span."""
    root = root_span(spans)
    verdict = verdict_attributes(summary, _request_url(base_url)(summary["trace_id"])) if summary else {}
    data = TracesData()
    groups: dict[bytes, ResourceSpans] = {}
    scopes: dict[tuple[bytes, str], ScopeSpans] = {}
    for s in spans:
        rkey = orjson.dumps(s.resource, option=orjson.OPT_SORT_KEYS)
        rs = groups.get(rkey)
        if rs is None:
            rs = groups[rkey] = data.resource_spans.add()
            rs.resource.CopyFrom(Resource(attributes=[key_value(k, v) for k, v in s.resource.items()]))
        ss = scopes.get((rkey, s.scope_name))
        if ss is None:
            ss = scopes[(rkey, s.scope_name)] = rs.scope_spans.add()
            ss.scope.CopyFrom(InstrumentationScope(name=s.scope_name))
        attrs = dict(s.attributes)
        if s is root:
            attrs.update(verdict)
        pb = ss.spans.add()
        pb.trace_id = bytes.fromhex(s.trace_id)
        pb.span_id = bytes.fromhex(s.span_id)
        if s.parent_span_id:
            pb.parent_span_id = bytes.fromhex(s.parent_span_id)
        pb.name = s.name
        pb.kind = PbSpan.SpanKind.ValueType(s.kind) if 0 <= s.kind <= 5 else PbSpan.SPAN_KIND_UNSPECIFIED
        pb.start_time_unix_nano = s.start_ns
        pb.end_time_unix_nano = s.end_ns
        pb.attributes.extend(key_value(k, v) for k, v in attrs.items())
        pb.status.CopyFrom(
            Status(code=Status.StatusCode.ValueType(s.status_code % 3), message=s.status_message)
        )
        for ev in s.events:
            e = pb.events.add()
            e.name = str(ev.get("name", ""))
            e.time_unix_nano = int(ev.get("time_ns") or ev.get("time_unix_nano") or 0)
            e.attributes.extend(key_value(k, v) for k, v in (ev.get("attributes") or {}).items())
    return data


def _wants_protobuf(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return PROTOBUF in accept or "application/x-protobuf" in accept


def _trace_answer(
    rt: Runtime, trace_id: str, v2: bool, protobuf: bool, base_url: str, budget: Budget
) -> Response:
    """Read and encode on the query's thread: building a 10,000-span answer is CPU the event
    loop (liveness, ingest) should not spend."""
    summary = rt.store.get_request(trace_id)
    ids = set(summary.get("trace_ids") or []) if summary else set()
    ids.add(trace_id)
    spans, complete = read_spans(rt.store, ids, budget, (summary or {}).get("span_count"))
    partial = None
    if not complete:
        if not spans:
            raise QueryUnavailable(f"trace {trace_id} not read: {budget.spent}")
        partial = f"trace cut short ({budget.spent}): {len(spans)} spans shown"
    if not spans:
        raise HTTPException(404, f"trace {trace_id} not found")
    data = traces_data(spans, summary, base_url)
    headers = {PARTIAL_HEADER: partial} if partial else None
    if protobuf:
        body = data.SerializeToString()  # field 1: repeated ResourceSpans, as tempopb.Trace
        if v2:  # tempopb.TraceByIDResponse: field 1 is the Trace; 3 and 4 say it is partial
            body = b"\x0a" + _varint(len(body)) + body
            if partial:
                message = partial.encode()
                body += b"\x18\x01" + b"\x22" + _varint(len(message)) + message
        return Response(body, media_type=PROTOBUF, headers=headers)
    spans_json = MessageToDict(data).get("resourceSpans", [])
    doc: dict[str, Any] = {"trace": {"resourceSpans": spans_json}} if v2 else {"batches": spans_json}
    if v2 and partial:
        doc |= {"status": "PARTIAL", "message": partial}
    return Response(orjson.dumps(doc), media_type="application/json", headers=headers)


def tempo_trace_id(raw: str) -> str:
    """A trace id as Tempo reads one: 1 to 32 hex digits, left-padded with zeros to 128 bits
    (grafana/tempo pkg/util/traceid.go `hexStringToID`, v2.9.0), so a 64-bit id from a
    Zipkin-style propagator or a log line opens its trace (lower case, as stored)."""
    if not SHORT_TRACE_ID.match(raw):
        raise HTTPException(400, "trace id must be 1 to 32 hex digits")
    return raw.lower().rjust(32, "0")


async def _trace(rt: Runtime, request: Request, trace_id: str, v2: bool) -> Response:
    trace_id = tempo_trace_id(trace_id)
    protobuf, base_url = _wants_protobuf(request), str(request.base_url)
    try:
        return await rt.queries.run(
            lambda b: _trace_answer(rt, trace_id, v2, protobuf, base_url, b),
            rt.queries.budget(rt.settings.trace_max_spans),
        )
    except QueryUnavailable as exc:
        raise unavailable(exc) from None


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


TRACE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The trace", "content": {PROTOBUF: {}, "application/json": {}}}
}
JSON_ANSWER: dict[int | str, dict[str, Any]] = {
    200: {"description": "OK", "content": {"application/json": {}}}
}


@router.get(
    "/api/traces/{trace_id}",
    summary="Tempo: a trace by id (tempopb.Trace or JSON `batches`)",
    response_class=Response,
    responses=TRACE_RESPONSES,
)
async def trace_v1(rt: RuntimeDep, request: Request, trace_id: str) -> Response:
    return await _trace(rt, request, trace_id, v2=False)


@router.get(
    "/api/v2/traces/{trace_id}",
    summary="Tempo: a trace by id (tempopb.TraceByIDResponse)",
    response_class=Response,
    responses=TRACE_RESPONSES,
)
async def trace_v2(rt: RuntimeDep, request: Request, trace_id: str) -> Response:
    return await _trace(rt, request, trace_id, v2=True)


# -- Search ------------------------------------------------------------------------------


def _duration(raw: str | None, name: str) -> float | None:
    if not raw:
        return None
    m = DURATION.match(raw.strip())
    if not m:
        raise HTTPException(400, f"{name} must be a duration such as 100ms or 2s")
    return float(m.group(1)) * UNITS[m.group(2)]


@router.get(
    "/api/search",
    summary="Tempo: search traces with TraceQL (subset, see docs/ui.md) or tags",
    response_class=Response,
    responses=JSON_ANSWER,
)
async def search_traces(
    rt: RuntimeDep,
    request: Request,
    q: Annotated[str, Query(max_length=2000)] = "",
    tags: Annotated[str | None, Query(max_length=2000)] = None,
    minDuration: Annotated[str | None, Query(max_length=32)] = None,
    maxDuration: Annotated[str | None, Query(max_length=32)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_SEARCH_LIMIT)] = DEFAULT_LIMIT,
    spss: Annotated[int, Query(ge=1, le=100)] = 3,
    start: Annotated[int | None, Query(ge=0, le=7_258_118_400)] = None,
    end: Annotated[int | None, Query(ge=0, le=7_258_118_400)] = None,
) -> Response:
    if start is not None and end is not None and end < start:
        raise HTTPException(400, "end is before start")
    params = SearchParams(
        q,
        start,
        end,
        limit,
        spss,
        _duration(minDuration, "minDuration"),
        _duration(maxDuration, "maxDuration"),
        tags,
    )
    settings = rt.settings
    budget = rt.queries.budget(settings.search_max_spans)
    request_url = _request_url(str(request.base_url))
    try:
        sets = parse_search(params)  # a query that cannot run is refused before it takes a turn
        body = await rt.queries.run(
            lambda b: search(rt.store, sets, params, request_url, b, settings.search_max_requests), budget
        )
    except (TraceQLError, StoreError) as exc:
        raise HTTPException(400, f"invalid TraceQL query: {exc}") from None
    except QueryUnavailable as exc:
        raise unavailable(exc) from None
    headers = {PARTIAL_HEADER: body["partialReason"]} if body.get("partial") else None
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)


# -- TraceQL metrics -----------------------------------------------------------------------


async def _metrics(rt: Runtime, request: Request, instant: bool) -> Response:
    """Both metrics endpoints: parameters as Tempo's `ParseQueryRangeRequest` reads them
    (railtrace.query.traceql_metrics), the read within the query gate and budget."""
    params = request.query_params
    q = params.get("q") or params.get("query") or ""
    if len(q) > 2000:
        raise HTTPException(400, "query longer than 2000 characters")
    try:
        mq = parse_metrics_query(q)
        now = time.time_ns()
        since = params.get("since")
        since_ns = int(_duration(since, "since") or 0) if since else 3600 * 10**9
        end_ns = parse_time(params.get("end"), now)
        start_ns = parse_time(params.get("start"), min(end_ns, now) - since_ns)
        if end_ns <= start_ns:
            raise TraceQLError("end must be after start")
        step_ns = parse_step(params.get("step"), start_ns, end_ns)
        if step_ns <= 0:
            raise TraceQLError("step must be positive")
        body = await rt.queries.run(
            lambda b: evaluate(rt.store, mq, start_ns, end_ns, step_ns, b, instant),
            rt.queries.budget(rt.settings.search_max_spans),
        )
    except (TraceQLError, StoreError) as exc:
        raise HTTPException(400, f"invalid TraceQL metrics query: {exc}") from None
    except QueryUnavailable as exc:
        raise unavailable(exc) from None
    headers = {PARTIAL_HEADER: body["message"]} if body.get("status") == "PARTIAL" else None
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)


@router.get(
    "/api/metrics/query_range",
    summary="Tempo: TraceQL metrics over time (rate, count, quantiles of railtrace's requests)",
    response_class=Response,
    responses=JSON_ANSWER,
)
async def metrics_query_range(rt: RuntimeDep, request: Request) -> Response:
    return await _metrics(rt, request, instant=False)


@router.get(
    "/api/metrics/query",
    summary="Tempo: TraceQL metrics over the whole range (one value per series)",
    response_class=Response,
    responses=JSON_ANSWER,
)
async def metrics_query(rt: RuntimeDep, request: Request) -> Response:
    return await _metrics(rt, request, instant=True)


# -- Tags -------------------------------------------------------------------------------

SPAN_TAGS = (
    *tuple(REQUEST_TAGS),
    semconv.VERDICT_PAIRING_LEVEL,
    semconv.VERDICT_REQUEST_ID,
    semconv.KV_TRANSPORT,
)
RESOURCE_TAGS = (semconv.RES_SERVICE_NAME, semconv.RES_POD, semconv.RES_NODE, semconv.RES_NAMESPACE)


@router.get("/api/search/tags", summary="Tempo: tag names (v1)")
async def tags_v1() -> dict[str, Any]:
    return {"tagNames": sorted({*SPAN_TAGS, *RESOURCE_TAGS})}


@router.get("/api/v2/search/tags", summary="Tempo: tag names by scope (v2)")
async def tags_v2(scope: Annotated[str | None, Query(max_length=32)] = None) -> dict[str, Any]:
    scopes = [
        {"name": "span", "tags": sorted(SPAN_TAGS)},
        {"name": "resource", "tags": sorted(RESOURCE_TAGS)},
        {"name": "intrinsic", "tags": list(INTRINSICS)},
    ]
    if scope and scope != "all":
        scopes = [s for s in scopes if s["name"] == scope]
    return {"scopes": scopes}


def _tag_values(rt: Runtime, tag: str, budget: Budget) -> list[str]:
    key = tag.split(".", 1)[1] if tag.startswith(("span.", "resource.")) else tag.lstrip(".")
    if key == semconv.VERDICT_FLAGS:
        return [f.value for f in FlagName]
    if key == semconv.VERDICT_PATH_CLASS:
        return [c.value for c in PathClass]
    if key in ("status",):
        return ["error", "ok", "unset"]
    if key in (semconv.VERDICT_NODE, semconv.RES_NODE, semconv.VERDICT_POD, semconv.RES_POD):
        try:
            topo = rt.topology()
        except Exception:
            return []
        pods = key in (semconv.VERDICT_POD, semconv.RES_POD)
        return sorted(p.name for p in topo.pods.values()) if pods else sorted(topo.nodes)
    # Anything else: the values seen on the spans of the latest requests (as many as the
    # budget reads: suggestions, not a census).
    values: set[str] = set()
    page = rt.store.list_requests(RequestQuery(limit=50))
    ids = [t for s in page.items for t in (s.get("trace_ids") or [s["trace_id"]])]
    for s in read_spans(rt.store, ids, budget)[0]:
        v = s.service_name if key == semconv.RES_SERVICE_NAME else s.attributes.get(key, s.resource.get(key))
        if key == "name":
            v = s.name
        if isinstance(v, str | int | float | bool):
            values.add(str(v))
    return sorted(values)[:1000]


async def _values(rt: Runtime, tag: str) -> list[str]:
    try:
        return await rt.queries.run(
            lambda b: _tag_values(rt, tag, b), rt.queries.budget(rt.settings.search_max_spans)
        )
    except QueryUnavailable as exc:
        raise unavailable(exc) from None


@router.get("/api/search/tag/{tag}/values", summary="Tempo: values of a tag (v1)")
async def tag_values_v1(rt: RuntimeDep, tag: str) -> dict[str, Any]:
    return {"tagValues": await _values(rt, tag)}


@router.get("/api/v2/search/tag/{tag}/values", summary="Tempo: typed values of a tag (v2)")
async def tag_values_v2(
    rt: RuntimeDep, tag: str, q: Annotated[str | None, Query(max_length=2000)] = None
) -> dict[str, Any]:
    values = await _values(rt, tag)
    return {"tagValues": [{"type": "string", "value": v} for v in values]}


# -- Health and version -----------------------------------------------------------------


@router.get(
    "/api/echo",
    summary="Tempo: the data source's connection test",
    response_class=Response,
    responses={200: {"description": "echo", "content": {"text/plain": {}}}},
)
async def echo() -> Response:
    return Response("echo", media_type="text/plain")


@router.get("/api/status/buildinfo", summary="Tempo: the API level served")
async def buildinfo() -> dict[str, str]:
    return {
        "version": TEMPO_API_VERSION,
        "revision": "railtrace",
        "branch": "",
        "buildUser": "",
        "buildDate": time.strftime("%Y-%m-%d", time.gmtime(0)),
        "goVersion": "",
    }
