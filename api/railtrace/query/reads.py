"""Spans of traces read within a `Budget`: a page of spans at a time, the budget checked between
pages, so a trace read or a search stops at its deadline or row budget instead of decoding a
trace of any size in one call."""

from __future__ import annotations

import operator
from collections.abc import Iterable

from railtrace.model import Span
from railtrace.query.budget import Budget
from railtrace.store import Store

# Spans per store call: small enough that a call ends well within any sane time budget.
PAGE_SPANS = 2000
SPAN_ORDER = operator.attrgetter("start_ns", "span_id")

Position = tuple[str, int, int]


def read_spans(
    store: Store, trace_ids: Iterable[str], budget: Budget, expected: int | None = None
) -> tuple[list[Span], bool]:
    """The normalised spans of these traces in start order, each once, as far as the budget goes,
    and whether that was all of them. Spans read are taken from the budget's rows.

    `expected`: the span count the request's summary gives. When that fits in one page and in
    the rows left, the spans are read in one call (half the cost of a page, whose statement is
    built per call); a trace that grew since is still bounded by the ingest cap per trace."""
    ids = sorted(set(trace_ids))
    if expected is not None and expected <= min(PAGE_SPANS, budget.rows_left) and budget.left():
        spans = store.load_spans(ids)
        budget.take(len(spans))
        return spans, True
    out: list[Span] = []
    seen: set[tuple[str, str]] = set()
    pos: Position | None = None
    while True:
        if not budget.left():
            out.sort(key=SPAN_ORDER)
            return out, False
        page, pos = store.load_spans_page(ids, pos, min(PAGE_SPANS, budget.rows_left))
        budget.take(len(page))
        _add_new(out, seen, page)
        if pos is None:
            out.sort(key=SPAN_ORDER)
            return out, True


def read_page(
    store: Store, trace_ids: list[str], after: Position | None, limit: int, budget: Budget
) -> tuple[list[Span], Position | None, bool]:
    """Up to `limit` spans from position `after` (see `Store.load_spans_page`), the position of
    the rest (None: no more), and whether the budget cut the page short (`budget.spent` says
    why; the position then is where to go on, `after` itself if nothing was read)."""
    out: list[Span] = []
    seen: set[tuple[str, str]] = set()
    pos = after
    cut = False
    while len(out) < limit:
        if not budget.left():
            cut = True
            break
        page, pos = store.load_spans_page(trace_ids, pos, min(PAGE_SPANS, limit - len(out)))
        budget.take(len(page))
        _add_new(out, seen, page)
        if pos is None:
            break
    out.sort(key=SPAN_ORDER)
    return out, pos, cut


def _add_new(out: list[Span], seen: set[tuple[str, str]], page: list[Span]) -> None:
    """A span re-sent in other bytes is given once, as first stored (store pages dedupe only
    within themselves)."""
    for s in page:
        key = (s.trace_id, s.span_id)
        if key not in seen:
            seen.add(key)
            out.append(s)
