"""Tempo's search over railtrace's store: TraceQL (railtrace.query.traceql) judged on requests.

railtrace's own tags (flags, path class, node, pod, model) are judged on the request and go to
the indexed list query; the other conditions (service, span name, status, duration, span and
resource attributes) must hold on one span of the request's traces, as in Tempo. That part
reads spans and checks them in Python, so it runs within a `Budget`: at most `max_requests`
requests inspected, the budget's rows in spans read, until its deadline. A search that stops
early answers with what it found and says so (`partial`, `partialReason`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.json_format import MessageToDict

from railtrace.model import Span
from railtrace.otlp.encode import key_value
from railtrace.query.budget import Budget
from railtrace.query.reads import read_spans
from railtrace.query.traceql import Cond, Spanset, compare, logfmt, parse_traceql, span_matches
from railtrace.store import Cursor, RequestQuery, Store
from railtrace_tracing import semconv
from railtrace_tracing.semconv import FlagName, PathClass

# railtrace's tags: judged on the request, mapped to the list query's filters.
REQUEST_TAGS = {
    semconv.VERDICT_FLAGS: "flag",
    semconv.VERDICT_PATH_CLASS: "path_class",
    semconv.VERDICT_NODE: "node",
    semconv.VERDICT_POD: "pod",
    semconv.GEN_AI_REQUEST_MODEL: "model",
}


def verdict_attributes(summary: dict[str, Any], url: str | None) -> dict[str, Any]:
    """The request's verdict as root-span attributes (empty values left out); `url`: the
    request's page in the UI."""
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
        semconv.VERDICT_URL: url,
    }
    return {k: v for k, v in out.items() if v is not None and v != []}


def root_span(spans: list[Span]) -> Span | None:
    """The earliest span whose parent is not among `spans`."""
    ids = {(s.trace_id, s.span_id) for s in spans}
    roots = [s for s in spans if not s.parent_span_id or (s.trace_id, s.parent_span_id) not in ids]
    return min(roots or spans, key=lambda s: s.start_ns, default=None)


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


def parse_search(p: SearchParams) -> list[Spanset]:
    """The query's spansets (TraceQL plus legacy tags); TraceQLError if it cannot be run.
    Done before the search takes a turn, so a bad query is answered at once."""
    sets = parse_traceql(p.q) if p.q else [Spanset()]
    if p.tags:
        sets[0].conds.extend(logfmt(p.tags))
    return sets


def request_filters(sets: list[Spanset]) -> tuple[dict[str, str], list[Spanset], list[Cond]]:
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


def search(
    store: Store,
    sets: list[Spanset],
    p: SearchParams,
    request_url: Callable[[str], str],
    budget: Budget,
    max_requests: int,
) -> dict[str, Any]:
    """Tempo's search answer: up to `p.limit` traces, newest first; `request_url(trace_id)` is a
    request's page in the UI, shown on each result's root span."""
    filters, span_sets, post = request_filters(sets)
    if "flag" in filters and filters["flag"] not in {f.value for f in FlagName}:
        return {"traces": [], "metrics": {"inspectedTraces": 0}}
    if "path_class" in filters and filters["path_class"] not in {c.value for c in PathClass}:
        return {"traces": [], "metrics": {"inspectedTraces": 0}}
    needs_spans = any(ss.conds for ss in span_sets)
    found: list[dict[str, Any]] = []
    inspected = 0
    cursor = None
    limited: str | None = None
    while len(found) < p.limit and limited is None:
        if inspected >= max_requests:
            limited = f"request budget of {max_requests} requests inspected spent"
            break
        if not budget.left():
            break
        q = RequestQuery(
            limit=min(200, max_requests - inspected) if needs_spans else min(1000, p.limit * 2),
            cursor=cursor,
            since_ns=p.start * 10**9 if p.start else None,
            until_ns=p.end * 10**9 if p.end else None,
            flag=filters.get("flag"),
            path_class=filters.get("path_class"),
            node=filters.get("node"),
            pod=filters.get("pod"),
            model=filters.get("model"),
        )
        page = store.list_requests(q)
        for summary in page.items:
            if not budget.left():
                break
            hit = _hit(store, summary, span_sets, post, p, request_url, needs_spans, budget)
            if budget.spent:  # its spans were cut short: not judged
                break
            inspected += 1
            if hit is not None:
                found.append(hit)
                if len(found) >= p.limit:
                    break
        if not page.next_cursor or len(found) >= p.limit:
            break
        cursor = Cursor.decode(page.next_cursor)
    answer: dict[str, Any] = {"traces": found, "metrics": {"inspectedTraces": inspected}}
    reason = budget.spent or limited
    if reason is not None and len(found) < p.limit:
        answer["partial"] = True
        answer["partialReason"] = f"search stopped early ({reason}): more traces may match"
    return answer


def _summary_value(summary: dict[str, Any], key: str) -> Any:
    verdict = verdict_attributes(summary, None)
    return verdict.get(key) if key != semconv.GEN_AI_REQUEST_MODEL else summary.get("model")


def _hit(
    store: Store,
    summary: dict[str, Any],
    span_sets: list[Spanset],
    post: list[Cond],
    p: SearchParams,
    request_url: Callable[[str], str],
    needs_spans: bool,
    budget: Budget,
) -> dict[str, Any] | None:
    if not all(compare(_summary_value(summary, c.key), c.op, c.value) for c in post):
        return None
    e2e_ns = int((summary.get("e2e_s") or 0) * 1e9)
    if p.min_ns is not None and e2e_ns < p.min_ns:
        return None
    if p.max_ns is not None and e2e_ns > p.max_ns:
        return None
    ids = summary.get("trace_ids") or [summary["trace_id"]]
    spans, complete = read_spans(store, ids, budget, expected=summary.get("span_count"))
    if not complete:
        return None
    root = root_span(spans)
    trace_ns = (max(s.end_ns for s in spans) - min(s.start_ns for s in spans)) if spans else e2e_ns
    matches = []
    for ss in span_sets:
        matched = [s for s in spans if span_matches(s, ss.conds, root, trace_ns)] if needs_spans else []
        if needs_spans and not matched:
            return None
        matches.append(matched)
    verdict = verdict_attributes(summary, request_url(summary["trace_id"]))
    span_sets_out = []
    for matched in matches:
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
                                **({} if s is not root else verdict),
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
