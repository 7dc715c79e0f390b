"""Trace assembly: the spans of one request, from many processes and maybe many traces, to
one `RequestFacts`. Pure logic: no clock, no store; the ingest loop decides when to call it
(root ended plus `quiet_period_s`) and calls it again when a late span arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from railtrace.assembly.facts import build
from railtrace.assembly.stitch import dedupe, requests
from railtrace.model import RequestFacts, Span
from railtrace.normalize import span_request_keys
from railtrace_tracing.semconv import AssemblyStage

__all__ = ["FailureSink", "assemble", "request_keys"]

# Told about each step skipped because it raised, (`AssemblyStage`, the exception), so that a
# failure is counted and logged (railtrace.scheduling.failures) instead of vanishing.
FailureSink = Callable[[str, BaseException], None]


def request_keys(span: Span, on_failure: FailureSink | None = None) -> list[str]:
    """Normalised join keys of a span: sidecar request id, `llm_d.kv_transfer.request_id`,
    `x-request-id`, and vLLM `gen_ai.request.id` without its `chatcmpl-`/`cmpl-` prefix and
    `-N` suffix. Empty for spans that name no request, and for odd input (told to `on_failure`
    when reading the keys raised)."""
    try:
        return span_request_keys(span)
    except Exception as exc:
        if on_failure is not None:
            on_failure(AssemblyStage.REQUEST_KEYS, exc)
        return []


def assemble(
    spans: Sequence[Span], now_ns: int | None = None, on_failure: FailureSink | None = None
) -> list[RequestFacts]:
    """One `RequestFacts` per request found among `spans`; never raises.

    Duplicates (exporter retries) are dropped, spans are normalised in place, traces sharing
    a request key are stitched, and groups that are not requests (a lone `index_evict`,
    unknown spans) yield nothing. A request whose facts raise is left out and the others are
    still assembled; each such failure is told to `on_failure`. `now_ns` is accepted for the
    assembler loop's bookkeeping; the facts depend on the spans alone, so assembling again
    after a late span is safe.
    """
    del now_ns  # the facts are a function of the spans only (see docstring)
    results: list[RequestFacts] = []
    try:
        unique = dedupe(spans)
        for members, notes in requests(unique):
            try:
                facts = build(members, notes)
            except Exception as exc:  # one odd group must not cost the others
                if on_failure is not None:
                    on_failure(AssemblyStage.BUILD, exc)
                facts = None
            if facts is not None:
                results.append(facts)
    except Exception as exc:  # grouping failed: keep the requests built before it did
        if on_failure is not None:
            on_failure(AssemblyStage.GROUP, exc)
    return sorted(results, key=lambda f: (f.start_ns, f.trace_id))
