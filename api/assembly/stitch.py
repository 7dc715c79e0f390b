"""Deduplication and grouping: which received spans make up one request.

A trace is one request as long as context propagated end to end. Older llm-d broke it at the
sidecar (orphan vLLM `llm_request` traces, <= v0.9) and the EPP (<= v0.8), so traces that
share a normalised request key are joined into one group here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from railtrace.model import Span
from railtrace.normalize import normalize_span, span_request_keys


def _valid(span: object) -> bool:
    return (
        isinstance(span, Span)
        and isinstance(span.trace_id, str)
        and isinstance(span.span_id, str)
        and bool(span.trace_id)
        and bool(span.span_id)
        and isinstance(span.start_ns, int)
        and isinstance(span.end_ns, int)
        and not isinstance(span.start_ns, bool)
        and not isinstance(span.end_ns, bool)
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
        assert isinstance(span, Span)
        key = (span.trace_id, span.span_id)
        held = chosen.get(key)
        if held is None or _preference(span) > _preference(held):
            chosen[key] = span
    return sorted(chosen.values(), key=lambda s: (s.trace_id, s.start_ns, s.span_id))


class _UnionFind:
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


def group(spans: Sequence[Span]) -> list[list[Span]]:
    """Normalise, then split into groups: whole traces, joined when they share a request key."""
    uf = _UnionFind()
    owner: dict[str, str] = {}
    for span in spans:
        normalize_span(span)
        uf.find(span.trace_id)
        for key in span_request_keys(span):
            held = owner.setdefault(key, span.trace_id)
            if held != span.trace_id:
                uf.union(held, span.trace_id)
    groups: dict[str, list[Span]] = {}
    for span in spans:
        groups.setdefault(uf.find(span.trace_id), []).append(span)
    return [groups[k] for k in sorted(groups)]
