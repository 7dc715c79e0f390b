"""Jaeger's query model over railtrace's store: traces as the Jaeger UI's JSON, services,
operations and the trace search of Jaeger's HTTP API (`/api/traces?service=…`).

The JSON is what Jaeger v2 (github.com/jaegertracing/jaeger v1.75.0) answers for a trace it
received over OTLP: the OTLP span goes through the collector-contrib translator
(pkg/translator/jaeger/traces_to_jaegerproto.go @ v0.139.0: scope, kind and status as tags,
events as logs with an `event` field, the parent as a CHILD_OF reference, resource attributes
less `service.name` as process tags), the query service's adjusters
(cmd/query/app/querysvc/adjusters.go: span and process tags sorted by key, log fields sorted
after `event`, `telemetry.sdk.*` / `telemetry.distro.*` moved from span to process), and the UI
model (internal/uimodel/converter/v1/json/from_domain.go: ids as hex, a 128-bit id whose high
half is zero as 16 digits, times in microseconds, processes `p1`, `p2`, … by first use, typed
values, integers past 2^53 as strings). tests/ui/test_jaeger_api.py compares the answers with
a real Jaeger's, field by field. What railtrace answers differently is listed in docs/ui.md.

Search walks railtrace's requests (the indexed list, newest first) and judges their spans in
Python within a `Budget`, as the Tempo search does (railtrace.query.search): a span must have the
service, and the operation, tags and duration bounds asked for, as in Jaeger.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson

from railtrace.model import Span
from railtrace.query.budget import Budget
from railtrace.query.reads import read_spans
from railtrace.query.search import root_span, verdict_attributes
from railtrace.store import Cursor, RequestQuery, Store

# The OTLP span kinds as Jaeger's `span.kind` tag (OpenTracing names); unspecified has none.
SPAN_KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
STATUS = {1: "OK", 2: "ERROR"}
# Span attributes Jaeger's OTelTagAdjuster moves to the process (telemetry.sdk.*, distro).
PROCESS_KEYS = frozenset(
    {
        "telemetry.sdk.language",
        "telemetry.sdk.name",
        "telemetry.sdk.version",
        "telemetry.distro.name",
        "telemetry.distro.version",
    }
)
JS_MAX_SAFE_INTEGER = 2**53 - 1
# Resource rows read to list services: far above what a fleet has (one per process and scope).
MAX_RESOURCES = 100_000
# Requests whose spans the operations of a service are gathered from.
OPERATIONS_REQUESTS = 200
REQUEST_SLACK_NS = 3600 * 10**9


def jaeger_id(hex_id: str) -> str:
    """A trace id as Jaeger prints it: 16 digits when its high half is zero."""
    return hex_id[16:] if len(hex_id) == 32 and hex_id.startswith("0" * 16) else hex_id


def _json(value: Any) -> str:
    """An array or map attribute as Jaeger shows it: the JSON Go's encoding/json writes for it
    (pdata pcommon.Value.AsString @ v1.45.0): keys sorted, no spaces, `<`, `>`, `&` escaped,
    floats as ES6 numbers (`1`, not `1.0`; `0.00001`; `1e-7`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, bytes):
        value = base64.b64encode(value).decode()
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        for ch, esc in GO_ESCAPES:
            text = text.replace(ch, esc)
        return text
    if isinstance(value, dict):
        return "{" + ",".join(f"{_json(str(k))}:{_json(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_json(v) for v in value) + "]"
    return _json(str(value))


# What Go's encoding/json escapes in strings beyond what Python's json does.
GO_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


def _go_float(x: float) -> str:
    """A float as Go's encoding/json writes it (ES6 number formatting)."""
    if not math.isfinite(x):
        return "null"
    a = abs(x)
    if a != 0 and (a < 1e-6 or a >= 1e21):
        mantissa, _, exp = repr(x).partition("e")
        n = int(exp)
        return f"{mantissa}e-{-n}" if n < 0 else f"{mantissa}e+{n:02d}"
    text = format(Decimal(repr(x)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def tag(key: str, value: Any) -> dict[str, Any]:
    """A typed Jaeger key/value from an attribute value (arrays and maps as JSON strings)."""
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        shown: Any = value if abs(value) <= JS_MAX_SAFE_INTEGER else str(value)
        return {"key": key, "type": "int64", "value": shown}
    if isinstance(value, float):
        return {"key": key, "type": "float64", "value": value if math.isfinite(value) else str(value)}
    if isinstance(value, bytes):
        return {"key": key, "type": "binary", "value": base64.b64encode(value).decode()}
    if isinstance(value, list | dict):
        return {"key": key, "type": "string", "value": _json(value)}
    return {"key": key, "type": "string", "value": "" if value is None else str(value)}


def tag_text(value: Any) -> str:
    """An attribute value as Jaeger compares it with a `tags=` value (its string form)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        return _json(value)
    return str(value)


def _sorted(tags: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(tags, key=lambda t: t["key"])


def _span_tags(s: Span, extra: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The span's tags, and the tags Jaeger moves from the span to its process."""
    tags = [tag("otel.scope.name", s.scope_name)] if s.scope_name else []
    moved: list[dict[str, Any]] = []
    for k, v in {**s.attributes, **extra}.items():
        (moved if k in PROCESS_KEYS else tags).append(tag(k, v))
    if s.kind in SPAN_KINDS:
        tags.append(tag("span.kind", SPAN_KINDS[s.kind]))
    if s.status_code in STATUS:
        tags.append(tag("otel.status_code", STATUS[s.status_code]))
    if s.status_code == 2:
        tags.append(tag("error", True))
    if s.status_message:
        tags.append(tag("otel.status_description", s.status_message))
    return _sorted(tags), moved


def _logs(s: Span) -> list[dict[str, Any]]:
    out = []
    for ev in s.events:
        attrs = ev.get("attributes") or {}
        name = str(ev.get("name") or "")
        fields = [tag(k, v) for k, v in attrs.items()]
        event = [tag("event", name)] if name and "event" not in attrs else []
        fields = event + _sorted(fields)
        time_ns = int(ev.get("time_ns") or ev.get("time_unix_nano") or 0)
        out.append({"timestamp": time_ns // 1000, "fields": fields})
    return out


def jaeger_trace(
    trace_id: str, spans: list[Span], summary: dict[str, Any] | None, url: str | None
) -> dict[str, Any]:
    """A trace as Jaeger's UI model; the request's verdict (when assembled) as tags of its root
    span, as on the Tempo API. Spans in start order, processes numbered by first use."""
    root = root_span(spans)
    verdict = verdict_attributes(summary, url) if summary else {}
    processes: dict[str, dict[str, Any]] = {}
    keys: dict[bytes, str] = {}
    out = []
    for s in spans:
        tags, moved = _span_tags(s, verdict if s is root else {})
        ptags = [tag(k, v) for k, v in s.resource.items() if k != "service.name"] + moved
        process = {"serviceName": s.service_name, "tags": _sorted(ptags)}
        pkey = orjson.dumps(process)
        pid = keys.get(pkey)
        if pid is None:
            pid = keys[pkey] = f"p{len(keys) + 1}"
            processes[pid] = process
        tid = jaeger_id(s.trace_id)
        refs = (
            [{"refType": "CHILD_OF", "traceID": tid, "spanID": s.parent_span_id}] if s.parent_span_id else []
        )
        out.append(
            {
                "traceID": tid,
                "spanID": s.span_id,
                "operationName": s.name,
                "references": refs,
                "startTime": s.start_ns // 1000,
                "duration": max(0, s.end_ns - s.start_ns) // 1000,
                "tags": tags,
                "logs": _logs(s),
                "processID": pid,
                "warnings": None,
            }
        )
    return {"traceID": jaeger_id(trace_id), "spans": out, "processes": processes, "warnings": None}


def read_trace(
    store: Store, trace_id: str, budget: Budget, max_spans_note: Callable[[str], str]
) -> tuple[list[Span], dict[str, Any] | None, str | None]:
    """The spans of the request `trace_id` belongs to (every trace it was stitched from), its
    summary, and why the spans were cut short (None: complete). Empty spans: not found."""
    summary = store.get_request(trace_id)
    ids = set(summary.get("trace_ids") or []) if summary else set()
    ids.add(trace_id)
    spans, complete = read_spans(store, ids, budget, (summary or {}).get("span_count"))
    return spans, summary, None if complete else max_spans_note(f"{budget.spent}: {len(spans)} spans shown")


def services(store: Store) -> list[str]:
    """Every service that sent spans (`Store.service_names`): short and complete, since a
    resource is kept once per process and scope and never deleted."""
    return store.service_names(MAX_RESOURCES)


@dataclass(slots=True)
class Operation:
    name: str
    span_kind: str


def operations(store: Store, service: str, span_kind: str | None, budget: Budget) -> list[Operation]:
    """The span names (and kinds) of `service` on the latest requests' spans, as many as the
    budget reads: operations of recent traffic, sorted by name."""
    found: set[tuple[str, str]] = set()
    page = store.list_requests(RequestQuery(limit=OPERATIONS_REQUESTS))
    ids = [t for s in page.items for t in (s.get("trace_ids") or [s["trace_id"]])]
    for s in read_spans(store, ids, budget)[0]:
        if s.service_name == service:
            kind = SPAN_KINDS.get(s.kind, "")
            if span_kind is None or kind == span_kind:
                found.add((s.name, kind))
    return [Operation(n, k) for n, k in sorted(found)]


@dataclass(slots=True)
class TraceQuery:
    """Jaeger's search parameters: times in nanoseconds, durations in nanoseconds."""

    service: str
    operation: str | None
    tags: dict[str, str]
    start_ns: int
    end_ns: int
    min_ns: int | None
    max_ns: int | None
    limit: int
    max_requests: int


def _span_hit(s: Span, q: TraceQuery) -> bool:
    if s.service_name != q.service or (q.operation and s.name != q.operation):
        return False
    if not q.start_ns <= s.start_ns <= q.end_ns:
        return False
    d = s.end_ns - s.start_ns
    if (q.min_ns is not None and d < q.min_ns) or (q.max_ns is not None and d > q.max_ns):
        return False
    for k, want in q.tags.items():
        values = [s.attributes.get(k), s.resource.get(k)]
        values += [(ev.get("attributes") or {}).get(k) for ev in s.events]
        if k == "error" and s.status_code == 2:
            values.append(True)
        if not any(v is not None and tag_text(v) == want for v in values):
            return False
    return True


def find_traces(
    store: Store, q: TraceQuery, budget: Budget, url: Callable[[str], str]
) -> tuple[list[dict[str, Any]], str | None]:
    """Up to `q.limit` traces (Jaeger JSON) with a span that matches, newest request first, and
    why the search stopped before the end (None: it saw every request in the window)."""
    found: list[dict[str, Any]] = []
    inspected = 0
    cursor = None
    while len(found) < q.limit:
        if inspected >= q.max_requests:
            return found, f"request budget of {q.max_requests} requests inspected spent"
        if not budget.left():
            return found, budget.spent
        page = store.list_requests(
            RequestQuery(
                limit=min(200, q.max_requests - inspected),
                cursor=cursor,
                # A request's spans start after it does, by at most its length: an hour's slack
                # before the window finds one whose matching span starts late (the spans are
                # then checked against the window itself).
                since_ns=max(0, q.start_ns - REQUEST_SLACK_NS),
                until_ns=q.end_ns + 1,
            )
        )
        for summary in page.items:
            if not budget.left():
                return found, budget.spent
            inspected += 1
            ids: Iterable[str] = summary.get("trace_ids") or [summary["trace_id"]]
            spans, complete = read_spans(store, ids, budget, summary.get("span_count"))
            if not complete:
                return found, budget.spent
            if any(_span_hit(s, q) for s in spans):
                tid = summary["trace_id"]
                found.append(jaeger_trace(tid, spans, summary, url(tid)))
                if len(found) >= q.limit:
                    return found, None
        if not page.next_cursor:
            return found, None
        cursor = Cursor.decode(page.next_cursor)
    return found, None


def dependencies(
    store: Store, start_ns: int, end_ns: int, budget: Budget, max_requests: int
) -> tuple[dict[tuple[str, str], int], str | None]:
    """Calls between services, as Jaeger's in-memory store counts them
    (internal/storage/v2/memory/tenant.go, `getDependencies`): for each request wholly within
    `start_ns`..`end_ns`, one call from the parent span's service to the child span's for every
    span whose parent is among the request's spans (a service calling itself included). And why
    the walk stopped early (None: every request of the window was counted)."""
    calls: dict[tuple[str, str], int] = {}
    inspected = 0
    cursor = None
    while True:
        if inspected >= max_requests:
            return calls, f"request budget of {max_requests} requests inspected spent"
        if not budget.left():
            return calls, budget.spent
        page = store.list_requests(
            RequestQuery(
                limit=min(200, max_requests - inspected),
                cursor=cursor,
                since_ns=max(0, start_ns),
                until_ns=end_ns + 1,
            )
        )
        for summary in page.items:
            inspected += 1
            ids: Iterable[str] = summary.get("trace_ids") or [summary["trace_id"]]
            spans, complete = read_spans(store, ids, budget, summary.get("span_count"))
            if not complete:
                return calls, budget.spent
            if (
                not spans
                or min(s.start_ns for s in spans) <= start_ns
                or max(s.end_ns for s in spans) >= end_ns
            ):
                continue
            service_of = {(s.trace_id, s.span_id): s.service_name for s in spans}
            for s in spans:
                parent = service_of.get((s.trace_id, s.parent_span_id or ""))
                if s.parent_span_id and parent is not None:
                    calls[(parent, s.service_name)] = calls.get((parent, s.service_name), 0) + 1
        if not page.next_cursor:
            return calls, None
        cursor = Cursor.decode(page.next_cursor)
