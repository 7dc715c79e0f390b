"""The query API of Grafana Tempo, so Grafana's built-in Tempo data source opens railtrace's traces.

Grafana (pkg/tsdb/tempo in grafana/grafana) fetches a trace as protobuf from `/api/v2/traces/{id}`
(`tempopb.TraceByIDResponse`), falling back to `/api/traces/{id}` (`tempopb.Trace`) on 404, and
searches with TraceQL through `GET /api/search` (JSON). Both trace messages wrap OTLP
`ResourceSpans` in field 1, so the bodies are built with the OTLP protobuf classes. The request's
verdict rides on the root span as `railtrace.verdict.*` attributes (tracing/railtrace_tracing/semconv.py).

Search supports the part of TraceQL Grafana's search builder writes: one or more `{...}` spansets
joined by `&&`, each a conjunction of `field op value`. railtrace's own tags (flags, path class,
node, pod, model) are judged on the request and go to the indexed list query; the other
conditions (service, span name, status, duration, span and resource attributes) must hold on one
span of the request's traces, as in Tempo. See docs/ui.md.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, HTTPException, Query, Request, Response
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Status, TracesData
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from starlette.concurrency import run_in_threadpool

from railtrace.model import Span
from railtrace.otlp.encode import key_value
from railtrace.server.deps import RuntimeDep
from railtrace.server.routers.v1.params import TRACE_ID
from railtrace.server.runtime import Runtime
from railtrace.server.ui import request_path
from railtrace.store import Cursor, RequestQuery, StoreError
from railtrace_tracing import semconv
from railtrace_tracing.semconv import FlagName, PathClass

router = APIRouter(tags=["tempo"])

PROTOBUF = "application/protobuf"
# The Tempo API level this follows (trace by id v1 and v2, TraceQL search, tag APIs v1 and v2).
TEMPO_API_VERSION = "2.6.0"
MAX_SPANS = 10_000
DEFAULT_LIMIT = 20
MAX_SEARCH_LIMIT = 500
# Requests whose spans a search loads, at most, when span conditions must be checked.
MAX_SCANNED = 2_000

# railtrace's tags: judged on the request, mapped to the list query's filters.
REQUEST_TAGS = {
    semconv.VERDICT_FLAGS: "flag",
    semconv.VERDICT_PATH_CLASS: "path_class",
    semconv.VERDICT_NODE: "node",
    semconv.VERDICT_POD: "pod",
    semconv.GEN_AI_REQUEST_MODEL: "model",
}
INTRINSICS = ("name", "status", "duration", "kind", "traceDuration", "rootServiceName", "rootName")


# -- Trace by id ------------------------------------------------------------------------


def verdict_attributes(summary: dict[str, Any], base_url: str) -> dict[str, Any]:
    """The request's verdict as root-span attributes (empty values left out)."""
    kv = summary.get("kv_transfer") or {}
    legs = [summary.get("prefill") or {}, summary.get("decode") or {}]
    flags = summary.get("flags") or []
    out: dict[str, Any] = {
        semconv.VERDICT_FLAGS: [f["name"] for f in flags],
        semconv.VERDICT_EVIDENCE: [f"{f['name']}: {f.get('evidence') or ''}" for f in flags],
        semconv.VERDICT_PATH_CLASS: kv.get("path_class"),
        semconv.VERDICT_PAIRING_LEVEL: summary.get("pairing_level"),
        semconv.VERDICT_NODE: [leg["node"] for leg in legs if leg.get("node")],
        semconv.VERDICT_POD: [leg["pod"] for leg in legs if leg.get("pod")],
        semconv.VERDICT_TTFT: summary.get("ttft_s"),
        semconv.VERDICT_KV_DURATION: kv.get("duration_s"),
        semconv.VERDICT_REQUEST_ID: summary.get("request_id"),
        semconv.VERDICT_URL: base_url.rstrip("/") + request_path(summary["trace_id"]),
    }
    return {k: v for k, v in out.items() if v is not None and v != []}


def _root(spans: list[Span]) -> Span | None:
    ids = {(s.trace_id, s.span_id) for s in spans}
    roots = [s for s in spans if not s.parent_span_id or (s.trace_id, s.parent_span_id) not in ids]
    return min(roots or spans, key=lambda s: s.start_ns, default=None)


def traces_data(spans: list[Span], summary: dict[str, Any] | None, base_url: str) -> TracesData:
    """Spans as OTLP, grouped by resource and scope; the verdict on the root span."""
    root = _root(spans)
    verdict = verdict_attributes(summary, base_url) if summary else {}
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


def _load(rt: Runtime, trace_id: str) -> tuple[list[Span], dict[str, Any] | None]:
    summary = rt.store.get_request(trace_id)
    ids = set(summary.get("trace_ids") or []) if summary else set()
    ids.add(trace_id)
    spans = rt.store.load_spans(sorted(ids))[:MAX_SPANS]
    return spans, summary


def _wants_protobuf(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return PROTOBUF in accept or "application/x-protobuf" in accept


async def _trace(rt: Runtime, request: Request, trace_id: str, v2: bool) -> Response:
    if not TRACE_ID.match(trace_id):
        raise HTTPException(400, "trace id must be 32 hex digits")
    spans, summary = await run_in_threadpool(_load, rt, trace_id.lower())
    if not spans:
        raise HTTPException(404, f"trace {trace_id} not found")
    data = traces_data(spans, summary, str(request.base_url))
    if _wants_protobuf(request):
        body = data.SerializeToString()  # field 1: repeated ResourceSpans, as tempopb.Trace
        if v2:  # tempopb.TraceByIDResponse: field 1 is the Trace
            body = b"\x0a" + _varint(len(body)) + body
        return Response(body, media_type=PROTOBUF)
    spans_json = MessageToDict(data).get("resourceSpans", [])
    doc = {"trace": {"resourceSpans": spans_json}} if v2 else {"batches": spans_json}
    return Response(orjson.dumps(doc), media_type="application/json")


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


# -- TraceQL subset ---------------------------------------------------------------------

TOKEN = re.compile(
    r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<op>&&|\|\||!=|=~|!~|>=|<=|=|>|<)|(?P<brace>[{}()])"""
    r"""|(?P<word>[A-Za-z0-9_.:\-/]+))"""
)
DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)$")
UNITS = {"ns": 1, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9}


class TraceQLError(ValueError):
    """A query outside the supported subset: HTTP 400 with what is supported."""


@dataclass(slots=True)
class Cond:
    scope: str  # "resource" | "span" | "any" | "intrinsic"
    key: str
    op: str
    value: Any


@dataclass(slots=True)
class Spanset:
    conds: list[Cond] = field(default_factory=list)


def parse_traceql(q: str) -> list[Spanset]:
    """`{a && b} && {c}` into spansets of conditions; `||`, pipelines and aggregates are refused."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    q = q.strip()
    while pos < len(q):
        m = TOKEN.match(q, pos)
        if not m or m.end() == pos:
            raise TraceQLError(f"cannot read the query at {q[pos : pos + 20]!r}")
        pos = m.end()
        kind = m.lastgroup or ""
        tokens.append((kind, m.group(kind)))
    if not tokens:
        return [Spanset()]
    sets: list[Spanset] = []
    i = 0

    def expect(kind: str, text: str | None = None) -> str:
        nonlocal i
        if i >= len(tokens) or tokens[i][0] != kind or (text is not None and tokens[i][1] != text):
            got = tokens[i][1] if i < len(tokens) else "the end"
            raise TraceQLError(f"expected {text or kind} but found {got!r}")
        i += 1
        return tokens[i - 1][1]

    while True:
        expect("brace", "{")
        ss = Spanset()
        while not (i < len(tokens) and tokens[i] == ("brace", "}")):
            if ss.conds:
                if tokens[i][1] == "||":
                    raise TraceQLError("`||` is not supported: use one query per alternative")
                expect("op", "&&")
            name = expect("word")
            op = expect("op")
            if op in ("&&", "||"):
                raise TraceQLError(f"a condition needs a value after {name}")
            kind, raw = tokens[i] if i < len(tokens) else ("", "")
            if kind not in ("str", "word"):
                raise TraceQLError(f"a condition needs a value after {name} {op}")
            i += 1
            ss.conds.append(_cond(name, op, raw, kind == "str"))
        expect("brace", "}")
        sets.append(ss)
        if i == len(tokens):
            return sets
        if tokens[i][1] == "||":
            raise TraceQLError("`||` between spansets is not supported")
        if tokens[i][1] == "|":
            raise TraceQLError("pipelines (`|`) are not supported")
        expect("op", "&&")


def _cond(name: str, op: str, raw: str, quoted: bool) -> Cond:
    value: Any
    if quoted:
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise TraceQLError(f"cannot read the string {raw[:40]}") from None
    elif m := DURATION.match(raw):
        value = float(m.group(1)) * UNITS[m.group(2)]
    elif re.fullmatch(r"-?\d+(\.\d+)?", raw):
        value = float(raw)
    else:
        value = raw  # status and kind enums, booleans
    if op in ("=~", "!~"):
        try:
            value = re.compile(str(value))
        except re.error as exc:
            raise TraceQLError(f"bad regular expression {raw[:40]}: {exc}") from None
    for prefix, scope in (("resource.", "resource"), ("span.", "span"), (".", "any")):
        if name.startswith(prefix):
            return Cond(scope, name[len(prefix) :], op, value)
    bare = name.split(":", 1)[-1]  # trace:duration, span:name, ...
    alias = {"duration": "traceDuration"} if name.startswith("trace:") else {}
    bare = alias.get(bare, bare)
    if bare not in INTRINSICS:
        raise TraceQLError(f"unknown field {name!r}: use resource.<key>, span.<key>, .<key> or {INTRINSICS}")
    if op in ("=~", "!~") and bare in ("duration", "traceDuration"):
        raise TraceQLError(f"{op} needs a string field")
    return Cond("intrinsic", bare, op, value)


def _compare(actual: Any, op: str, wanted: Any) -> bool:
    if isinstance(actual, list):
        return (
            any(_compare(a, op, wanted) for a in actual)
            if op not in ("!=", "!~")
            else all(_compare(a, op, wanted) for a in actual)
        )
    if actual is None:
        return op in ("!=", "!~")
    if op == "=":
        return actual == wanted or str(actual) == str(wanted)
    if op == "!=":
        return not (actual == wanted or str(actual) == str(wanted))
    if op in ("=~", "!~"):
        pattern = wanted if isinstance(wanted, re.Pattern) else re.compile(re.escape(str(wanted)))
        found = pattern.fullmatch(str(actual)) is not None
        return found if op == "=~" else not found
    try:
        a, w = float(actual), float(wanted)
    except (TypeError, ValueError):
        return False
    return {">": a > w, ">=": a >= w, "<": a < w, "<=": a <= w}[op]


STATUS = {0: "unset", 1: "ok", 2: "error"}
KIND = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def _span_matches(s: Span, conds: list[Cond], root: Span | None, trace_ns: int) -> bool:
    for c in conds:
        if c.scope == "intrinsic":
            actual: Any = {
                "name": s.name,
                "status": STATUS.get(s.status_code, "unset"),
                "kind": KIND.get(s.kind, "unspecified"),
                "duration": s.end_ns - s.start_ns,
                "traceDuration": trace_ns,
                "rootServiceName": root.service_name if root else None,
                "rootName": root.name if root else None,
            }[c.key]
        elif c.scope == "resource":
            actual = s.resource.get(c.key)
        elif c.scope == "span":
            actual = s.attributes.get(c.key)
        else:
            actual = s.attributes.get(c.key, s.resource.get(c.key))
        if not _compare(actual, c.op, c.value):
            return False
    return True


def _request_filters(sets: list[Spanset]) -> tuple[dict[str, str], list[Spanset], list[Cond]]:
    """Equality tests on railtrace's tags become list filters; the rest stays for the spans.
    Tags tested otherwise (`!=`, regex) are checked on the summary (`post`)."""
    filters: dict[str, str] = {}
    rest: list[Spanset] = []
    post: list[Cond] = []
    for ss in sets:
        keep = []
        for c in ss.conds:
            target = REQUEST_TAGS.get(c.key) if c.scope in ("span", "any") else None
            if target and c.op == "=" and target not in filters:
                filters[target] = str(c.value)
            elif target:
                post.append(c)
            else:
                keep.append(c)
        rest.append(Spanset(keep))
    return filters, rest, post


@dataclass(slots=True)
class SearchParams:
    q: str
    start: int | None
    end: int | None
    limit: int
    spss: int
    min_ns: float | None
    max_ns: float | None
    tags: str | None


def _logfmt(tags: str) -> list[Cond]:
    """The legacy `tags=` parameter: `key=value key2="value two"`."""
    out = []
    for m in re.finditer(r'([^\s=]+)=("(?:[^"\\]|\\.)*"|\S+)', tags):
        raw = m.group(2)
        try:
            value = orjson.loads(raw) if raw.startswith('"') else raw
        except orjson.JSONDecodeError:
            raise TraceQLError(f"cannot read the tag value {raw[:40]}") from None
        key = m.group(1)
        scope = "intrinsic" if key in ("name", "status") else "any"
        if key == "service.name":
            scope = "resource"
        out.append(Cond(scope, key, "=", value))
    return out


def search(rt: Runtime, p: SearchParams, base_url: str) -> dict[str, Any]:
    sets = parse_traceql(p.q) if p.q else [Spanset()]
    if p.tags:
        sets[0].conds.extend(_logfmt(p.tags))
    filters, span_sets, post = _request_filters(sets)
    if "flag" in filters and filters["flag"] not in {f.value for f in FlagName}:
        return {"traces": [], "metrics": {"inspectedTraces": 0}}
    if "path_class" in filters and filters["path_class"] not in {c.value for c in PathClass}:
        return {"traces": [], "metrics": {"inspectedTraces": 0}}
    needs_spans = any(ss.conds for ss in span_sets)
    found: list[dict[str, Any]] = []
    inspected = 0
    cursor = None
    while len(found) < p.limit and inspected < MAX_SCANNED:
        q = RequestQuery(
            limit=min(200, MAX_SCANNED - inspected) if needs_spans else min(1000, p.limit * 2),
            cursor=cursor,
            since_ns=p.start * 10**9 if p.start else None,
            until_ns=p.end * 10**9 if p.end else None,
            **filters,
        )
        page = rt.store.list_requests(q)
        cursor_token = page.next_cursor
        for summary in page.items:
            inspected += 1
            hit = _hit(rt, summary, span_sets, post, p, base_url, needs_spans)
            if hit is not None:
                found.append(hit)
                if len(found) >= p.limit:
                    break
        if not cursor_token or len(found) >= p.limit:
            break
        cursor = Cursor.decode(cursor_token)
    return {"traces": found, "metrics": {"inspectedTraces": inspected}}


def _summary_value(summary: dict[str, Any], key: str) -> Any:
    verdict = verdict_attributes(summary, "")
    return verdict.get(key) if key != semconv.GEN_AI_REQUEST_MODEL else summary.get("model")


def _hit(
    rt: Runtime,
    summary: dict[str, Any],
    span_sets: list[Spanset],
    post: list[Cond],
    p: SearchParams,
    base_url: str,
    needs_spans: bool,
) -> dict[str, Any] | None:
    if not all(_compare(_summary_value(summary, c.key), c.op, c.value) for c in post):
        return None
    e2e_ns = int((summary.get("e2e_s") or 0) * 1e9)
    if p.min_ns is not None and e2e_ns < p.min_ns:
        return None
    if p.max_ns is not None and e2e_ns > p.max_ns:
        return None
    spans = rt.store.load_spans(summary.get("trace_ids") or [summary["trace_id"]])
    root = _root(spans)
    trace_ns = (max(s.end_ns for s in spans) - min(s.start_ns for s in spans)) if spans else e2e_ns
    span_sets_out = []
    for ss in span_sets:
        matched = [s for s in spans if _span_matches(s, ss.conds, root, trace_ns)] if needs_spans else []
        if needs_spans and not matched:
            return None
        shown = matched if matched else ([root] if root else [])
        span_sets_out.append(
            {
                "spans": [
                    {
                        "spanID": s.span_id,
                        "name": s.name,
                        "startTimeUnixNano": str(s.start_ns),
                        "durationNanos": str(s.end_ns - s.start_ns),
                        "attributes": _json_attrs(
                            {
                                "service.name": s.service_name,
                                **({} if s is not root else verdict_attributes(summary, base_url)),
                            }
                        ),
                    }
                    for s in shown[: p.spss]
                ],
                "matched": len(matched) if needs_spans else 1,
            }
        )
    start_ns = min((s.start_ns for s in spans), default=0)
    return {
        "traceID": summary["trace_id"],
        "rootServiceName": root.service_name if root else "",
        "rootTraceName": root.name if root else "",
        "startTimeUnixNano": str(start_ns),
        "durationMs": max(0, round(trace_ns / 1e6)),
        "spanSets": span_sets_out,
        "spanSet": span_sets_out[0] if span_sets_out else None,
    }


def _json_attrs(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    """Search results' attributes; lists joined, as Grafana's search table reads scalar values only."""
    return [
        MessageToDict(key_value(k, ", ".join(map(str, v)) if isinstance(v, list) else v))
        for k, v in attrs.items()
    ]


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
    try:
        body = await run_in_threadpool(search, rt, params, str(request.base_url))
    except (TraceQLError, StoreError) as exc:
        raise HTTPException(400, f"invalid TraceQL query: {exc}") from None
    return Response(orjson.dumps(body), media_type="application/json")


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


def _tag_values(rt: Runtime, tag: str) -> list[str]:
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
    # Anything else: the values seen on the spans of the latest requests.
    values: set[str] = set()
    page = rt.store.list_requests(RequestQuery(limit=50))
    ids = [t for s in page.items for t in (s.get("trace_ids") or [s["trace_id"]])]
    for s in rt.store.load_spans(ids):
        v = s.service_name if key == semconv.RES_SERVICE_NAME else s.attributes.get(key, s.resource.get(key))
        if key == "name":
            v = s.name
        if isinstance(v, str | int | float | bool):
            values.add(str(v))
    return sorted(values)[:1000]


@router.get("/api/search/tag/{tag}/values", summary="Tempo: values of a tag (v1)")
async def tag_values_v1(rt: RuntimeDep, tag: str) -> dict[str, Any]:
    return {"tagValues": await run_in_threadpool(_tag_values, rt, tag)}


@router.get("/api/v2/search/tag/{tag}/values", summary="Tempo: typed values of a tag (v2)")
async def tag_values_v2(
    rt: RuntimeDep, tag: str, q: Annotated[str | None, Query(max_length=2000)] = None
) -> dict[str, Any]:
    values = await run_in_threadpool(_tag_values, rt, tag)
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
