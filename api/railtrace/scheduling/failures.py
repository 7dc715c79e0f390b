"""What assembly skipped because it raised, made visible without flooding the log.

Assembly leaves out what it cannot handle (a request whose facts raised, a span whose join keys
raised) so that one odd request never costs the others. Each such failure is counted in
`llm_d_tracing_assembly_failures_total{stage, error}`; the first of each kind (stage, exception
type and the line that raised) is logged with its traceback, and later ones of that kind are
summed up in one line at most every `SUMMARY_INTERVAL_S`, so a sender that makes every request
fail the same way writes a few log lines, not one per request.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from railtrace.metrics import Metrics

log = logging.getLogger("railtrace.assembly")

# Shortest time between two log lines summing up later failures of one kind.
SUMMARY_INTERVAL_S = 60.0
# Kinds remembered for logging; past this, new kinds are still counted, and logged under one
# catch-all kind per stage.
MAX_KINDS = 64


def failure_site(exc: BaseException) -> str:
    """`file.py:line` of the innermost frame of `exc`'s traceback (where it was raised)."""
    tb = exc.__traceback__
    if tb is None:
        return "?"
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"


class AssemblyFailures:
    """Counts each failure in the metric; logs the first of each kind, then sums up."""

    def __init__(
        self,
        metrics: Metrics,
        interval_s: float = SUMMARY_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metrics = metrics
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        # kind -> [failures not yet logged, when the kind was last logged]
        self._kinds: dict[tuple[str, str, str], list[float]] = {}

    def __call__(self, stage: str, exc: BaseException) -> None:
        error = type(exc).__name__
        self.metrics.assembly_failed(stage, error)
        kind = (str(stage), error, failure_site(exc))
        now = self._clock()
        with self._lock:
            if kind not in self._kinds and len(self._kinds) >= MAX_KINDS:
                kind = (str(stage), "other", "?")
            state = self._kinds.get(kind)
            if state is None:
                self._kinds[kind] = [0, now]
                first, more = True, 0
            else:
                state[0] += 1
                first, more = False, 0
                if now - state[1] >= self.interval_s:
                    more, state[0], state[1] = int(state[0]), 0, now
        if first:
            log.error(
                "assembly step %s skipped: %s at %s: %s (the request is left out; later %s failures"
                " of this kind are counted in llm_d_tracing_assembly_failures_total and summed up"
                " here at most every %.0f s)",
                kind[0],
                error,
                kind[2],
                str(exc)[:200],
                error,
                self.interval_s,
                exc_info=exc,
            )
        elif more:
            log.warning(
                "assembly step %s skipped %d more times: %s at %s (last: %s)",
                kind[0],
                more,
                error,
                kind[2],
                str(exc)[:200],
            )
