"""The one rule for whether a received span is kept: ids of the right length and not zero,
times inside the accepted range, and an end that is not before the start.

The decoder, the row builder and the C scanner (`_wirescan.c`, which applies the same rule
and leaves the message to `span_problem`) all reject by it, so a span is refused for the
same reason, in the same words, whichever path read it.
"""

from __future__ import annotations

from railtrace.otlp.bounds import MAX_TIME_NS, MIN_TIME_NS

_ZERO_TRACE = bytes(16)
_ZERO_SPAN = bytes(8)


def span_problem(
    trace_id: bytes, span_id: bytes, parent_span_id: bytes, start_ns: int, end_ns: int
) -> str | None:
    """Why a span cannot be kept, or None when it can."""
    if len(trace_id) != 16 or trace_id == _ZERO_TRACE:
        return f"span {span_id.hex() or '?'}: trace_id must be 16 non-zero bytes"
    if len(span_id) != 8 or span_id == _ZERO_SPAN:
        return f"span in trace {trace_id.hex()}: span_id must be 8 non-zero bytes"
    if parent_span_id and len(parent_span_id) != 8:
        return f"span {span_id.hex()}: parent_span_id must be empty or 8 bytes"
    if not (MIN_TIME_NS <= start_ns < MAX_TIME_NS):
        return f"span {span_id.hex()}: start time {start_ns} is out of range"
    if not (MIN_TIME_NS <= end_ns < MAX_TIME_NS):
        return f"span {span_id.hex()}: end time {end_ns} is out of range"
    if end_ns < start_ns:
        return f"span {span_id.hex()}: ends before it starts"
    return None
