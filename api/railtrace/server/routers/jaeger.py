"""The HTTP query API of Jaeger under `/jaeger`, so Grafana's Jaeger data source (URL
`<railtrace>/jaeger`) and scripts written for Jaeger read railtrace's traces.

Paths, parameters and answers follow Jaeger v2's query service (github.com/jaegertracing/jaeger
v1.75.0, cmd/query/app/http_handler.go and query_parser.go): every answer is the envelope
`{"data", "total", "limit", "offset", "errors"}`, errors too (`errors: [{"code", "msg"}]`);
search takes `service` (required), `operation`, `tags` (a JSON object) or `tag=key:value`,
`start`/`end` in microseconds (default: the last two days), `minDuration`/`maxDuration` as Go
durations (`1.5s`, `200ms`) and `limit` (default 100). The trace JSON is built in
railtrace.query.jaeger. This module frames HTTP only: every read takes a turn of the read gate
(its paths are under `/jaeger/api/`, `railtrace.server.security.API_PREFIXES`) and runs through the
runtime's `QueryGate` within a time and row budget, as the Tempo API does; a trace cut short
carries the reason in Jaeger's `warnings`, and a search cut short in `errors`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, Field

from railtrace.query.budget import Budget, QueryUnavailable
from railtrace.query.jaeger import (
    Operation,
    TraceQuery,
    dependencies,
    find_traces,
    jaeger_id,
    jaeger_trace,
    operations,
    read_trace,
    services,
)
from railtrace.server.deps import RuntimeDep
from railtrace.server.routers.tempo import PARTIAL_HEADER
from railtrace.server.runtime import Runtime
from railtrace.server.ui import request_path

PREFIX = "/jaeger/api"
router = APIRouter(prefix=PREFIX, tags=["jaeger"])

# Jaeger's default search limit and look-back (cmd/query/app/query_parser.go, default_params.go).
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
LOOKBACK_NS = 48 * 3600 * 10**9
# Jaeger accepts 16 or 32 hex digits (model.TraceIDFromString), the short form a 64-bit id.
TRACE_ID = re.compile(r"^[0-9a-fA-F]{1,32}$")
# Go's time.ParseDuration: a sequence of decimal numbers with units, optionally signed.
GO_DURATION = re.compile(r"^[+-]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+$")
GO_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
GO_UNITS = {"ns": 1, "us": 1e3, "µs": 1e3, "μs": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9}
MAX_TAGS = 50
# Bounds that keep a request within `max_request_line_bytes` (8 KiB; HTTP 414 beyond it) even
# percent-encoded: tags are short (`{"http.response.status_code":"500"}`). `tags` and `tag` may
# repeat (as in Jaeger): every value is checked against these.
MAX_TAGS_CHARS = 512
MAX_TAG_CHARS = 256
MAX_TAG_PARAMS = 10


# -- Answers --------------------------------------------------------------------------------


class JaegerError(BaseModel):
    code: int | None = None
    msg: str
    traceID: str | None = None


class KeyValue(BaseModel):
    key: str
    type: str = Field(description="string, bool, int64, float64 or binary")
    value: Any


class Reference(BaseModel):
    refType: str = Field(description="CHILD_OF or FOLLOWS_FROM")
    traceID: str
    spanID: str


class Log(BaseModel):
    timestamp: int = Field(description="microseconds since the epoch")
    fields: list[KeyValue]


class Process(BaseModel):
    serviceName: str
    tags: list[KeyValue]


class JaegerSpan(BaseModel):
    traceID: str
    spanID: str
    operationName: str
    references: list[Reference]
    startTime: int = Field(description="microseconds since the epoch")
    duration: int = Field(description="microseconds")
    tags: list[KeyValue]
    logs: list[Log]
    processID: str
    warnings: list[str] | None


class JaegerTrace(BaseModel):
    traceID: str
    spans: list[JaegerSpan]
    processes: dict[str, Process]
    warnings: list[str] | None


class JaegerOperation(BaseModel):
    name: str
    spanKind: str


class DependencyLink(BaseModel):
    parent: str
    child: str
    callCount: int


class _Envelope(BaseModel):
    total: int = 0
    limit: int = 0
    offset: int = 0
    errors: list[JaegerError] | None = None


class TracesAnswer(_Envelope):
    data: list[JaegerTrace] | None


class NamesAnswer(_Envelope):
    data: list[str] | None


class OperationsAnswer(_Envelope):
    data: list[JaegerOperation] | None


class DependenciesAnswer(_Envelope):
    data: list[DependencyLink] | None


ERROR_ANSWER = {"model": _Envelope, "description": "Jaeger's envelope with `errors: [{code, msg}]`"}
RESPONSES: dict[int | str, dict[str, Any]] = {400: ERROR_ANSWER, 404: ERROR_ANSWER}


def _answer(
    data: Any,
    *,
    total: int = 0,
    errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    body = {"data": data, "total": total, "limit": 0, "offset": 0, "errors": errors}
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)


def _error(code: int, msg: str, headers: dict[str, str] | None = None) -> Response:
    body = {"data": None, "total": 0, "limit": 0, "offset": 0, "errors": [{"code": code, "msg": msg}]}
    return Response(orjson.dumps(body), status_code=code, media_type="application/json", headers=headers)


def _unavailable(exc: QueryUnavailable) -> Response:
    return _error(503, str(exc), {"Retry-After": str(exc.retry_after_s)})


async def _run(rt: Runtime, fn: Callable[[Budget], Response], max_rows: int) -> Response:
    """`fn` on the query gate within a budget of `max_rows` spans; 503 when it cannot run."""
    try:
        return await rt.queries.run(fn, rt.queries.budget(max_rows))
    except QueryUnavailable as exc:
        return _unavailable(exc)


def _url(request: Request) -> Callable[[str], str]:
    base = str(request.base_url).rstrip("/")
    return lambda trace_id: base + request_path(trace_id)


# -- Services and operations -----------------------------------------------------------------


@router.get("/services", summary="Jaeger: every service that sent spans", response_model=NamesAnswer)
async def get_services(rt: RuntimeDep) -> Response:
    def answer(_b: Budget) -> Response:
        names = services(rt.store)
        return _answer(names, total=len(names))

    return await _run(rt, answer, rt.settings.search_max_spans)


def _operations(
    rt: Runtime, service: str, span_kind: str | None, named: bool
) -> Callable[[Budget], Response]:
    def answer(b: Budget) -> Response:
        ops: list[Operation] = operations(rt.store, service, span_kind, b)
        if named:
            names = sorted({o.name for o in ops})
            return _answer(names, total=len(names))
        return _answer([{"name": o.name, "spanKind": o.span_kind} for o in ops], total=len(ops))

    return answer


@router.get(
    # `:path`: a service name may hold '/' (`llm-d-router/epp`), sent as %2F.
    "/services/{service:path}/operations",
    summary="Jaeger: span names of a service (recent requests)",
    response_model=NamesAnswer,
    responses=RESPONSES,
)
async def get_service_operations(rt: RuntimeDep, service: str) -> Response:
    return await _run(rt, _operations(rt, service, None, named=True), rt.settings.search_max_spans)


SPAN_KINDS = ("unspecified", "internal", "server", "client", "producer", "consumer")


@router.get(
    "/operations",
    summary="Jaeger: span names and kinds of a service (recent requests)",
    response_model=OperationsAnswer,
    responses=RESPONSES,
)
async def get_operations(
    rt: RuntimeDep,
    service: Annotated[str, Query(max_length=256)] = "",
    spanKind: Annotated[str, Query(max_length=32)] = "",
) -> Response:
    if not service:
        return _error(400, "parameter 'service' is required")
    if spanKind and spanKind not in SPAN_KINDS:
        return _error(400, f"unable to parse param 'spanKind': unsupported span kind: '{spanKind}'")
    kind = None if not spanKind else ("" if spanKind == "unspecified" else spanKind)
    return await _run(rt, _operations(rt, service, kind, named=False), rt.settings.search_max_spans)


# -- Traces --------------------------------------------------------------------------------


def _full_id(raw: str) -> str | None:
    """32 lowercase hex digits from Jaeger's 1–32-digit form, or None if it is not hex."""
    return raw.lower().rjust(32, "0") if TRACE_ID.match(raw) else None


def _trace_answer(rt: Runtime, trace_id: str, url: Callable[[str], str]) -> Callable[[Budget], Response]:
    def answer(b: Budget) -> Response:
        spans, summary, cut = read_trace(rt.store, trace_id, b, lambda why: f"trace cut short ({why})")
        if not spans:
            if cut:
                raise QueryUnavailable(f"trace {trace_id} not read: {b.spent}")
            return _error(404, "trace not found")
        trace = jaeger_trace(trace_id, spans, summary, url(trace_id))
        if cut:
            trace["warnings"] = [cut]
            return _answer([trace], headers={PARTIAL_HEADER: cut})
        return _answer([trace])

    return answer


@router.get(
    "/traces/{trace_id}",
    summary="Jaeger: a trace by id (16 or 32 hex digits)",
    response_model=TracesAnswer,
    responses=RESPONSES,
)
async def get_trace(rt: RuntimeDep, request: Request, trace_id: str) -> Response:
    full = _full_id(trace_id)
    if full is None:
        return _error(400, f"unable to parse param 'traceID': not a hex trace id: {trace_id[:64]!r}")
    return await _run(rt, _trace_answer(rt, full, _url(request)), rt.settings.trace_max_spans)


def _go_duration(raw: str, name: str) -> int | None:
    """Nanoseconds of a Go duration (`1h2m`, `1.5s`, `300ms`), None if empty; ValueError says why."""
    if not raw:
        return None
    if not GO_DURATION.match(raw):
        raise ValueError(f"unable to parse param '{name}': time: invalid duration {raw!r}")
    ns = sum(float(n) * GO_UNITS[u] for n, u in GO_DURATION_PART.findall(raw))
    return -round(ns) if raw.startswith("-") else round(ns)


def _micros(raw: str, name: str) -> int | None:
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"unable to parse param '{name}': microseconds since the epoch expected, got {raw[:40]!r}"
        ) from None
    if not 0 <= value <= 7_258_118_400_000_000:  # up to the year 2200
        raise ValueError(f"param '{name}' is out of range: {value}")
    return value * 1000


def _tags(simple: list[str], as_json: list[str]) -> dict[str, str]:
    """`tag=key:value` (repeatable) and `tags={"key":"value"}`, as Jaeger's parseTags reads them."""
    out: dict[str, str] = {}
    for t in simple:
        key, sep, value = t.partition(":")
        if not sep:
            raise ValueError(f"malformed 'tag' parameter, expecting key:value, received: {t[:200]}")
        out[key] = value
    for raw in as_json:
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"malformed 'tags' parameter, cannot unmarshal JSON: {exc}") from None
        if not isinstance(parsed, dict) or not all(isinstance(v, str) for v in parsed.values()):
            raise ValueError("malformed 'tags' parameter: a JSON object of string values expected")
        out.update(parsed)
    if len(out) > MAX_TAGS:
        raise ValueError(f"at most {MAX_TAGS} tags")
    return out


@router.get(
    "/traces",
    summary="Jaeger: search traces of a service (newest first)",
    response_model=TracesAnswer,
    responses={**RESPONSES, 414: {"description": "The request line is over the HTTP server's limit"}},
)
async def find(
    rt: RuntimeDep,
    request: Request,
    service: Annotated[str, Query(max_length=256)] = "",
    operation: Annotated[str, Query(max_length=256)] = "",
    tags: Annotated[str, Query(max_length=MAX_TAGS_CHARS, description="JSON object; may repeat")] = "",
    tag: Annotated[str, Query(max_length=MAX_TAG_CHARS, description="key:value; may repeat")] = "",
    start: Annotated[str, Query(max_length=32, description="microseconds since the epoch")] = "",
    end: Annotated[str, Query(max_length=32, description="microseconds since the epoch")] = "",
    minDuration: Annotated[str, Query(max_length=64, description="Go duration: 1.5s, 200ms")] = "",
    maxDuration: Annotated[str, Query(max_length=64, description="Go duration: 1.5s, 200ms")] = "",
    limit: Annotated[str, Query(max_length=16)] = "",
    lookback: Annotated[str, Query(max_length=32, description="Grafana sends it; start/end decide")] = "",
    traceID: Annotated[str, Query(max_length=32, description="a trace id; may repeat (then no search)")] = "",
) -> Response:
    every_tags, every_tag = request.query_params.getlist("tags"), request.query_params.getlist("tag")
    ids = request.query_params.getlist("traceID")
    if ids:
        return await _by_ids(rt, request, ids)
    try:
        _bounded(every_tags, "tags", MAX_TAGS_CHARS)
        _bounded(every_tag, "tag", MAX_TAG_CHARS)
        params = _trace_query(
            rt, service, operation, every_tags, every_tag, start, end, minDuration, maxDuration, limit
        )
    except ValueError as exc:
        return _error(400, str(exc))
    url = _url(request)

    def answer(b: Budget) -> Response:
        traces, stopped = find_traces(rt.store, params, b, url)
        if stopped is not None and len(traces) < params.limit:
            why = f"search stopped early ({stopped}): more traces may match"
            return _answer(traces, errors=[{"code": 206, "msg": why}], headers={PARTIAL_HEADER: why})
        return _answer(traces)

    return await _run(rt, answer, rt.settings.search_max_spans)


async def _by_ids(rt: Runtime, request: Request, raw_ids: list[str]) -> Response:
    """Jaeger's `traceID=` form of the search: those traces, and an error per id not found."""
    if len(raw_ids) > MAX_TAG_PARAMS:
        return _error(400, f"at most {MAX_TAG_PARAMS} 'traceID' parameters")
    ids = [_full_id(t) for t in raw_ids]
    if None in ids:
        return _error(400, "cannot parse traceID param: not a hex trace id")
    url = _url(request)

    def answer(b: Budget) -> Response:
        traces, errors = [], []
        for tid in dict.fromkeys(t for t in ids if t):
            spans, summary, cut = read_trace(rt.store, tid, b, lambda why: f"trace cut short ({why})")
            if not spans:
                errors.append({"msg": "trace not found", "traceID": jaeger_id(tid)})
                continue
            trace = jaeger_trace(tid, spans, summary, url(tid))
            if cut:
                trace["warnings"] = [cut]
            traces.append(trace)
        return _answer(traces, errors=errors or None)

    return await _run(rt, answer, rt.settings.trace_max_spans)


def _bounded(values: list[str], name: str, chars: int) -> None:
    if len(values) > MAX_TAG_PARAMS:
        raise ValueError(f"at most {MAX_TAG_PARAMS} '{name}' parameters")
    if any(len(v) > chars for v in values):
        raise ValueError(f"a '{name}' parameter is longer than {chars} characters")


def _trace_query(
    rt: Runtime,
    service: str,
    operation: str,
    tags: list[str],
    tag: list[str],
    start: str,
    end: str,
    min_duration: str,
    max_duration: str,
    limit: str,
) -> TraceQuery:
    if not service:
        raise ValueError("parameter 'service' is required")
    now = time.time_ns()
    end_ns = _micros(end, "end")
    end_ns = now if end_ns is None else end_ns
    start_ns = _micros(start, "start")
    start_ns = now - LOOKBACK_NS if start_ns is None else start_ns
    if end_ns < start_ns:
        raise ValueError("'end' is before 'start'")
    lo, hi = _go_duration(min_duration, "minDuration"), _go_duration(max_duration, "maxDuration")
    if lo and hi and hi < lo:
        raise ValueError("'maxDuration' should be greater than 'minDuration'")
    n = DEFAULT_LIMIT
    if limit:
        try:
            n = int(limit)
        except ValueError:
            raise ValueError(f"unable to parse param 'limit': not an integer: {limit!r}") from None
        if not 1 <= n <= MAX_LIMIT:
            raise ValueError(f"'limit' must be between 1 and {MAX_LIMIT}")
    return TraceQuery(
        service,
        operation or None,
        _tags(tag, tags),
        start_ns,
        end_ns,
        lo or None,
        hi or None,
        n,
        rt.settings.search_max_requests,
    )


# -- Dependencies ---------------------------------------------------------------------------

DEPENDENCY_LOOKBACK_MS = 24 * 3600 * 1000  # Jaeger's default (cmd/query/app/default_params.go)


@router.get(
    "/dependencies",
    summary="Jaeger: calls between services in a window (Grafana's dependency graph)",
    response_model=DependenciesAnswer,
    responses=RESPONSES,
)
async def get_dependencies(
    rt: RuntimeDep,
    endTs: Annotated[str, Query(max_length=32, description="milliseconds since the epoch; default now")] = "",
    lookback: Annotated[str, Query(max_length=32, description="milliseconds; default a day")] = "",
    service: Annotated[str, Query(max_length=256, description="only links from or to it")] = "",
) -> Response:
    try:
        end_ms = _integer(endTs, "endTs", time.time_ns() // 10**6)
        back_ms = _integer(lookback, "lookback", DEPENDENCY_LOOKBACK_MS)
    except ValueError as exc:
        return _error(400, str(exc))
    end_ns, start_ns = end_ms * 10**6, (end_ms - back_ms) * 10**6

    def answer(b: Budget) -> Response:
        calls, stopped = dependencies(rt.store, start_ns, end_ns, b, rt.settings.search_max_requests)
        links = [
            {"parent": p, "child": c, "callCount": n}
            for (p, c), n in sorted(calls.items())
            if not service or service in (p, c)
        ]
        if stopped is not None:
            why = f"count stopped early ({stopped}): calls of older requests are missing"
            return _answer(links, errors=[{"code": 206, "msg": why}], headers={PARTIAL_HEADER: why})
        return _answer(links)

    return await _run(rt, answer, rt.settings.search_max_spans)


def _integer(raw: str, name: str, default: int) -> int:
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"unable to parse param '{name}': not an integer: {raw[:40]!r}") from None
    if not 0 <= value <= 7_258_118_400_000:
        raise ValueError(f"param '{name}' is out of range: {value}")
    return value
