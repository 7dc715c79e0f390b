"""Deduplication and grouping: which received spans make up one request.

A trace is one request as long as context propagated end to end. Older llm-d broke it at the
sidecar (orphan vLLM `llm_request` traces, <= v0.9) and the EPP (<= v0.8), so traces that
share a normalised request key are joined into one group here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeGuard

from railtrace.assembly.joins import JoinNotes, admit, filter_single
from railtrace.model import Span
from railtrace.normalize import is_epp, normalize_span, span_request_keys
from railtrace_tracing.semconv import ROLE


def _valid(span: object) -> TypeGuard[Span]:
    """Whether a value handed to assembly is a span it can place: a `Span` with ids and integer
    times. A guard on types only, for callers that pass anything; whether a received span is
    kept at all is decided once, at ingest (`railtrace.otlp.validity`)."""
    if not isinstance(span, Span):
        return False
    trace_id, span_id, start, end = span.trace_id, span.span_id, span.start_ns, span.end_ns
    return (
        isinstance(trace_id, str)
        and isinstance(span_id, str)
        and trace_id != ""
        and span_id != ""
        and isinstance(start, int)
        and isinstance(end, int)
        and start.__class__ is not bool
        and end.__class__ is not bool
    )


def _preference(span: Span) -> tuple[int, int, int, str, str]:
    """Of two copies of one span, keep the fuller, later one -- whatever order they came in."""
    attrs = span.attributes if isinstance(span.attributes, dict) else {}
    return (span.end_ns, len(attrs), -span.start_ns, str(span.name), str(span.service_name))


def dedupe(spans: Iterable[object]) -> list[Span]:
    """One span per (trace_id, span_id); exporter retries change nothing."""
    chosen: dict[tuple[str, str], Span] = {}
    for span in spans:
        if not _valid(span):
            continue
        key = (span.trace_id, span.span_id)
        held = chosen.get(key)
        if held is None or _preference(span) > _preference(held):
            chosen[key] = span
    return sorted(chosen.values(), key=lambda s: (s.trace_id, s.start_ns, s.span_id))


class UnionFind:
    """Disjoint sets of ids, the smallest id of each set its root (so a grouping never depends
    on arrival order). Both groupings of a request use it: scheduling's, of traces sharing a
    request key (`railtrace.scheduling.grouping`), and assembly's, of the units below."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, item: str) -> str:
        self.parent.setdefault(item, item)
        root = item
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[item] != root:
            self.parent[item], item = root, self.parent[item]
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            # Smallest id wins, so the grouping does not depend on arrival order.
            low, high = sorted((ra, rb))
            self.parent[high] = low


SERVER_KIND = 2  # OTLP SpanKind SERVER
# Roles of a child that show an EPP server span is a request's root (docs/normalisation.md §2).
EPP_ROOT_CHILD_ROLES = frozenset({ROLE.SCHEDULING, ROLE.PROXY, ROLE.PREFILL, ROLE.DECODE})
SIDECAR_TOP_NAMES = frozenset({"forward_request"})


def _is_sidecar_top(span: Span) -> bool:
    return span.canonical_name in SIDECAR_TOP_NAMES or (
        span.role == "proxy" and span.canonical_name.startswith("llm_d.pd_proxy.")
    )


def _is_anchor(span: Span) -> bool:
    return span.role == ROLE.GATEWAY


def promote_epp_roots(spans: Sequence[Span]) -> None:
    """Give role `gateway` to the EPP's server root whatever it is called.

    The EPP's root has been renamed before (`gateway.request`, then `request`); a name no
    table row knows stays unclassified, but the span is still the EPP's SERVER root: sent by
    the EPP (its scope or service), kind SERVER, its parent not the EPP's, and with an EPP
    span or a request hop beneath it. Anchoring on that keeps the request's EPP hop (picks,
    scheduling stage) through the next rename. Runs after normalisation, on all spans of the
    batch, so parent and children are known."""
    candidates = [
        s for s in spans if s.role == ROLE.OTHER and s.kind == SERVER_KIND and not s.generation and is_epp(s)
    ]
    if not candidates:
        return
    wanted = {s.trace_id for s in candidates}
    index: dict[tuple[str, str], Span] = {}
    parents_of_hops: set[tuple[str, str]] = set()
    for span in spans:
        if span.trace_id not in wanted:
            continue
        index[(span.trace_id, span.span_id)] = span
        if span.parent_span_id and (span.role in EPP_ROOT_CHILD_ROLES or is_epp(span)):
            parents_of_hops.add((span.trace_id, span.parent_span_id))
    for span in candidates:
        parent = index.get((span.trace_id, span.parent_span_id or ""))
        if parent is not None and is_epp(parent):
            continue  # a server span inside the EPP's own trace tree, not its root
        if (span.trace_id, span.span_id) in parents_of_hops:
            span.role = ROLE.GATEWAY


def _units(spans: Sequence[Span]) -> dict[tuple[str, str], str]:
    """Unit of each span: its trace, split per request when one trace holds several.

    A load generator or client that wraps many requests in one trace yields several EPP
    roots (role `gateway`, see `promote_epp_roots`) or sidecar roots in it; each one and the
    spans beneath it is one request. Spans under no anchor stay with the trace's only anchor, or on their own.
    """
    by_trace: dict[str, list[Span]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    unit: dict[tuple[str, str], str] = {}
    for trace_id, members in by_trace.items():
        index = {s.span_id: s for s in members}
        anchors = {s.span_id for s in members if _is_anchor(s)}
        if not anchors:
            anchors = {
                s.span_id
                for s in members
                if _is_sidecar_top(s) and not _has_ancestor(s, index, _is_sidecar_top)
            }
        for span in members:
            owner = None
            if len(anchors) > 1:
                owner = span.span_id if span.span_id in anchors else _nearest(span, index, anchors)
            unit[(trace_id, span.span_id)] = f"{trace_id}/{owner}" if owner else trace_id
    return unit


def _walk(span: Span, index: dict[str, Span]) -> Iterable[Span]:
    seen = {span.span_id}
    current = index.get(span.parent_span_id or "")
    while current is not None and current.span_id not in seen:
        seen.add(current.span_id)
        yield current
        current = index.get(current.parent_span_id or "")


def _has_ancestor(span: Span, index: dict[str, Span], test: Callable[[Span], bool]) -> bool:
    return any(test(a) for a in _walk(span, index))


def _nearest(span: Span, index: dict[str, Span], anchors: set[str]) -> str | None:
    return next((a.span_id for a in _walk(span, index) if a.span_id in anchors), None)


def _one_request_trace(spans: Sequence[Span]) -> bool:
    """The common case, decided without the union-find: one trace with exactly one
    EPP root (role `gateway`) is one unit, so all its spans make one group (a shared key can
    only join units, and there is one)."""
    if not spans:
        return False
    trace_id = spans[0].trace_id
    anchors = 0
    for span in spans:
        if span.trace_id != trace_id:
            return False
        if _is_anchor(span):
            anchors += 1
    return anchors == 1


def group(spans: Sequence[Span]) -> list[list[Span]]:
    """The spans of each request found among `spans` (see `requests`)."""
    return [members for members, _ in requests(spans)]


def requests(spans: Sequence[Span]) -> list[tuple[list[Span], JoinNotes]]:
    """Normalise, then split into requests: whole traces (or one request of a trace holding
    several), joined when they share a request key and the join rules admit it
    (`railtrace.assembly.joins`), each with what the rules rejected or could not verify."""
    for span in spans:
        normalize_span(span)
    promote_epp_roots(spans)
    if _one_request_trace(spans):
        return [filter_single(list(spans))]
    units = _units(spans)
    uf = UnionFind()
    owner: dict[str, str] = {}
    for span in spans:
        unit = units[(span.trace_id, span.span_id)]
        uf.find(unit)
        for key in span_request_keys(span):
            held = owner.setdefault(key, unit)
            if held != unit:
                uf.union(held, unit)
    candidates: dict[str, dict[str, list[Span]]] = {}
    for span in spans:
        unit = units[(span.trace_id, span.span_id)]
        candidates.setdefault(uf.find(unit), {}).setdefault(unit, []).append(span)
    out: list[tuple[list[Span], JoinNotes]] = []
    for root in sorted(candidates):
        members = candidates[root]
        if len(members) == 1:
            out.append(filter_single(next(iter(members.values()))))
        else:
            out.extend(admit(members))
    return out
