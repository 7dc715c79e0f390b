"""Router scoring shim: llm-d EPP-compatible scheduling spans plus the full candidate list.

llm-d's `pick_endpoints` keeps only the top endpoints; the `topology_blind_pairing` verdict
needs every candidate with its per-scorer scores and topology key, so this shim adds them
(`llm_d.router.candidate.*`) to the same span. Every method takes optional start/end times
in ns so a simulator can emit realistic timings without sleeping.

    rec = SchedulingRecorder(tracer_provider)
    with rec.profile("decode") as run:
        run.filter(candidates=3, filtered=2)
        run.scorer("prefix-cache-scorer", weight=2.0, scores={"10.0.0.5:8000": 0.8, ...})
        run.pick(candidates=[Candidate(...), ...], chosen="10.0.0.5:8000")
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from railtrace_tracing import semconv as sc
from railtrace_tracing._common import get_tracer, logger

TRACER_NAME = "railtrace_tracing.router_scoring"


@dataclass
class Candidate:
    """One endpoint the picker considered."""

    endpoint: str  # host:port
    score: float  # weighted total
    scorer_scores: dict[str, float] = field(default_factory=dict)
    topology: str = ""  # zone/block/subblock/host
    pod: str = ""


def candidate_attributes(candidates: Sequence[Candidate], chosen: str | None = None) -> dict[str, Any]:
    """The `llm_d.router.candidate.*` arrays, index-aligned."""
    attrs: dict[str, Any] = {
        sc.ROUTER_CANDIDATE_ENDPOINTS: [c.endpoint for c in candidates],
        sc.ROUTER_CANDIDATE_SCORES: [float(c.score) for c in candidates],
        sc.ROUTER_CANDIDATE_SCORER_SCORES: [_scores_json(c.scorer_scores) for c in candidates],
        sc.ROUTER_CANDIDATE_TOPOLOGY: [c.topology for c in candidates],
        sc.ROUTER_CANDIDATE_PODS: [c.pod for c in candidates],
    }
    if chosen is not None:
        attrs[sc.ROUTER_CHOSEN] = chosen
    return attrs


def _scores_json(scores: Mapping[str, float]) -> str:
    """`json.dumps(scores, sort_keys=True, separators=(",", ":"))`, written directly for the usual
    plain-name, finite-float case (a third of the cost); anything else goes through json."""
    try:
        parts = []
        for k in sorted(scores):
            v = scores[k]
            if type(v) is not float or not _PLAIN_KEY(k) or v != v or v in (_INF, -_INF):
                return json.dumps(scores, sort_keys=True, separators=(",", ":"))
            parts.append(f'"{k}":{v!r}')
        return "{" + ",".join(parts) + "}"
    except TypeError:
        return json.dumps(scores, sort_keys=True, separators=(",", ":"))


_INF = float("inf")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.:/ -]*").fullmatch


class ProfileRun:
    """Children of one `run_scheduler_profile` span; methods never raise."""

    def __init__(
        self,
        recorder: SchedulingRecorder,
        span: trace.Span | None,
        profile: str,
        request_attrs: dict[str, Any],
    ) -> None:
        self._rec = recorder
        self.span = span
        self.profile = profile
        self._req = request_attrs
        self._scoring: trace.Span | None = None
        self._scorers = 0
        self._contexts: list[tuple[trace.Span, otel_context.Context]] = []

    def _ctx(self, span: trace.Span | None) -> otel_context.Context | None:
        if span is None:
            return None
        for known, ctx in self._contexts:  # the profile and scoring spans parent several children
            if known is span:
                return ctx
        ctx = trace.set_span_in_context(span)
        self._contexts.append((span, ctx))
        return ctx

    def _emit(
        self,
        name: str,
        parent: trace.Span | None,
        attrs: dict[str, Any],
        start_ns: int | None,
        end_ns: int | None,
    ) -> trace.Span | None:
        try:
            span = self._rec.tracer.start_span(
                name,
                context=self._ctx(parent),
                kind=SpanKind.INTERNAL,
                attributes={**self._req, **attrs},
                start_time=start_ns,
            )
            span.end(end_time=end_ns)
            return span
        except Exception:
            logger.debug("railtrace router: %s not emitted", name, exc_info=True)
            return None

    def filter(
        self,
        candidates: int,
        filtered: int,
        *,
        start_time_ns: int | None = None,
        end_time_ns: int | None = None,
    ) -> None:
        """`filter_endpoints`: candidates before and after filtering."""
        self._emit(
            sc.SPAN_FILTER_ENDPOINTS,
            self.span,
            {sc.EPP_FILTER_CANDIDATES: int(candidates), sc.EPP_FILTER_FILTERED: int(filtered)},
            start_time_ns,
            end_time_ns,
        )

    def scorer(
        self,
        scorer_type: str,
        scores: Mapping[str, float],
        *,
        name: str | None = None,
        weight: float = 1.0,
        start_time_ns: int | None = None,
        end_time_ns: int | None = None,
    ) -> None:
        """One `llm_d.epp.scorer.<type>` span under a shared `llm_d.epp.scoring` span (the
        recorder's `scorer_prefix` and `scoring_span`)."""
        try:
            if self._scoring is None:
                self._scoring = self._rec.tracer.start_span(
                    self._rec.scoring_span,
                    context=self._ctx(self.span),
                    kind=SpanKind.INTERNAL,
                    attributes={**self._req, sc.EPP_SCORING_CANDIDATES: len(scores)},
                    start_time=start_time_ns,
                )
            self._scorers += 1
            vals = [float(v) for v in scores.values()]
            self._emit(
                self._rec.scorer_prefix + scorer_type,
                self._scoring,
                {
                    sc.EPP_SCORER_TYPE: scorer_type,
                    sc.EPP_SCORER_NAME: name or scorer_type,
                    sc.EPP_SCORER_WEIGHT: float(weight),
                    sc.EPP_SCORER_CANDIDATES: len(vals),
                    sc.EPP_SCORER_ENDPOINTS_SCORED: len(vals),
                    sc.EPP_SCORER_SCORE_MAX: max(vals) if vals else 0.0,
                    sc.EPP_SCORER_SCORE_AVG: sum(vals) / len(vals) if vals else 0.0,
                },
                start_time_ns,
                end_time_ns,
            )
            self._scoring_end = end_time_ns
        except Exception:
            logger.debug("railtrace router: scorer not emitted", exc_info=True)

    def pick(
        self,
        candidates: Sequence[Candidate],
        chosen: str,
        *,
        top_n: int = 1,
        start_time_ns: int | None = None,
        end_time_ns: int | None = None,
    ) -> None:
        """`pick_endpoints` with llm-d's top endpoints/scores plus the full candidate list."""
        self._close_scoring()
        try:
            ranked = sorted(candidates, key=lambda c: -c.score)
            top = [c for c in ranked if c.endpoint == chosen] or ranked[:1]
            top += [c for c in ranked if c.endpoint != chosen][: max(0, top_n - len(top))]
            attrs = {
                sc.EPP_PICKER_CANDIDATES: len(candidates),
                sc.EPP_PICKER_TOP_ENDPOINTS: [c.endpoint for c in top],
                sc.EPP_PICKER_TOP_SCORES: [float(c.score) for c in top],
                sc.ROUTER_PROFILE: self.profile,
                **candidate_attributes(candidates, chosen),
            }
            self._emit(sc.SPAN_PICK_ENDPOINTS, self.span, attrs, start_time_ns, end_time_ns)
        except Exception:
            logger.debug("railtrace router: pick not emitted", exc_info=True)

    def _close_scoring(self) -> None:
        if self._scoring is not None:
            with contextlib.suppress(Exception):
                self._scoring.set_attribute(sc.EPP_SCORER_COUNT, self._scorers)
                self._scoring.end(end_time=getattr(self, "_scoring_end", None))
            self._scoring = None


class SchedulingRecorder:
    """Emits llm-d EPP scheduling spans on `tracer_provider` (global when None).

    `scoring_span` and `scorer_prefix` name the scoring spans as the router release beside it
    does: `llm_d.epp.scoring` / `llm_d.epp.scorer.<type>` up to v0.10.0, `scoring` /
    `scorer.<type>` on router main after it (`semconv.SPAN_POST_V010_*`)."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        *,
        scoring_span: str = sc.SPAN_EPP_SCORING,
        scorer_prefix: str = sc.SPAN_EPP_SCORER_PREFIX,
    ) -> None:
        self.tracer = get_tracer(TRACER_NAME, tracer_provider)
        self.scoring_span = scoring_span
        self.scorer_prefix = scorer_prefix

    @contextlib.contextmanager
    def profile(
        self,
        name: str,
        *,
        model: str | None = None,
        request_id: str | None = None,
        parent: otel_context.Context | None = None,
        start_time_ns: int | None = None,
        end_time_ns: int | None = None,
    ) -> Iterator[ProfileRun]:
        """One `run_scheduler_profile` span (`prefill` or `decode`); children via the yielded run."""
        req: dict[str, Any] = {}
        if model:
            req[sc.GEN_AI_REQUEST_MODEL] = model
        if request_id:
            req[sc.GEN_AI_REQUEST_ID] = request_id
        span: trace.Span | None = None
        try:
            span = self.tracer.start_span(
                sc.SPAN_RUN_SCHEDULER_PROFILE,
                context=parent,
                kind=SpanKind.INTERNAL,
                attributes={sc.EPP_PROFILE_NAME: name, **req},
                start_time=start_time_ns or time.time_ns(),
            )
        except Exception:
            logger.debug("railtrace router: profile span not started", exc_info=True)
        run = ProfileRun(self, span, name, req)
        try:
            yield run
        finally:
            run._close_scoring()
            if span is not None:
                with contextlib.suppress(Exception):
                    span.end(end_time=end_time_ns)

    def record(
        self,
        profile: str,
        candidates: Sequence[Candidate],
        chosen: str,
        *,
        scorers: Mapping[str, float] | None = None,
        filtered_from: int | None = None,
        model: str | None = None,
        request_id: str | None = None,
        parent: otel_context.Context | None = None,
        start_time_ns: int | None = None,
        end_time_ns: int | None = None,
    ) -> None:
        """A whole profile run in one call: filter, one span per scorer (type → weight), pick.

        With start and end given, the children share the interval in order (for simulators).
        """
        start = start_time_ns if start_time_ns is not None else time.time_ns()
        end = end_time_ns if end_time_ns is not None else None
        n_steps = 2 + len(scorers or {})
        step = max(1, ((end or start + n_steps * 1000) - start) // (n_steps + 1))
        t = start
        with self.profile(
            profile, model=model, request_id=request_id, parent=parent, start_time_ns=start, end_time_ns=end
        ) as run:
            run.filter(
                filtered_from if filtered_from is not None else len(candidates),
                len(candidates),
                start_time_ns=t,
                end_time_ns=t + step,
            )
            t += step
            for stype, weight in (scorers or {}).items():
                run.scorer(
                    stype,
                    {c.endpoint: c.scorer_scores.get(stype, 0.0) for c in candidates},
                    weight=weight,
                    start_time_ns=t,
                    end_time_ns=t + step,
                )
                t += step
            run.pick(candidates, chosen, start_time_ns=t, end_time_ns=t + step)


__all__ = ["Candidate", "ProfileRun", "SchedulingRecorder", "candidate_attributes"]
