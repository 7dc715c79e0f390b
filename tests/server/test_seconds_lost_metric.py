"""`llm_d_tracing_seconds_lost_total{cause}`: each request's TTFT seconds lost (`cost.ttft_s_lost`)
counted once under its primary cause, the one incidents give it, and corrected through
`_retracted_total` when a re-assembly changes the cause or the seconds (issue 45, point 3).
The same path through a real `railtrace serve` is checked in tests/server/test_counts_agree.py."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from railtrace.incidents.group import Record
from railtrace.metrics import Metrics, lost_cause
from railtrace_tracing import semconv
from railtrace_tracing.semconv import FlagName


def _summary(trace_id: str, flags: list[str], lost: float | None) -> dict[str, Any]:
    return {
        "trace_id": trace_id,
        "model": "m",
        "flags": [{"name": f} for f in flags],
        "kv_transfer": {"path_class": "tcp", "transport": "tcp", "duration_s": 0.5, "bytes": 1000},
        "cost": None if lost is None else {"ttft_s_lost": lost, "kv_s_lost": lost},
    }


def _by_cause(m: Metrics, name: str) -> dict[str, float]:
    text = m.render(None)[0].decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[s.labels["cause"]] = s.value
    return out


def test_every_cause_is_exposed_at_zero_from_the_start() -> None:
    m = Metrics()
    causes = {f.value for f in FlagName} | {semconv.CAUSE_NONE}
    for name in (semconv.M_SECONDS_LOST, semconv.M_SECONDS_LOST_RETRACTED):
        assert _by_cause(m, name) == dict.fromkeys(causes, 0.0)


def test_seconds_lost_counted_once_under_the_primary_cause() -> None:
    m = Metrics()
    m.request_assembled(_summary("a" * 32, ["cross_rail", "tcp_fallback"], 0.25), None)
    m.request_assembled(_summary("b" * 32, [], 0.125), None)  # off its aligned path, unflagged
    m.request_assembled(_summary("c" * 32, ["tcp_fallback"], 0.0), None)  # lost nothing
    m.request_assembled(_summary("d" * 32, ["broken_trace"], None), None)  # no cost figure
    # A late update of an assembled request (`old` given) does not count its seconds again.
    again = _summary("a" * 32, ["cross_rail", "tcp_fallback"], 0.25)
    m.request_assembled(again, _summary("a" * 32, [], 0.25))
    got = {k: v for k, v in _by_cause(m, semconv.M_SECONDS_LOST).items() if v}
    assert got == {"tcp_fallback": 0.25, "none": 0.125}
    exposition = m.render("application/openmetrics-text")[0].decode()
    tid = "a" * 32
    assert f'seconds_lost_total{{cause="tcp_fallback"}} 0.25 # {{trace_id="{tid}"}} 0.25' in exposition


def test_reassembly_moves_the_seconds_to_the_new_cause() -> None:
    m = Metrics()
    first = _summary("a" * 32, ["tcp_fallback"], 0.5)
    m.request_assembled(first, None)
    # Late spans: the request was cross-rail, and lost less.
    new = _summary("a" * 32, ["cross_rail"], 0.125)
    m.request_assembled(new, first, verdicts=False)
    m.verdicts_revised([new], [first])
    counted = _by_cause(m, semconv.M_SECONDS_LOST)
    retracted = _by_cause(m, semconv.M_SECONDS_LOST_RETRACTED)
    assert (counted["tcp_fallback"], counted["cross_rail"]) == (0.5, 0.125)
    assert retracted["tcp_fallback"] == 0.5 and retracted["cross_rail"] == 0.0
    net = {c: counted[c] - retracted[c] for c in counted if counted[c] - retracted[c]}
    assert net == {"cross_rail": 0.125}  # what the store holds now
    # Same cause, fewer seconds: only the difference is withdrawn; an unchanged one moves nothing.
    newer = _summary("a" * 32, ["cross_rail"], 0.0625)
    m.verdicts_revised([newer], [new])
    m.verdicts_revised([newer], [newer])
    assert _by_cause(m, semconv.M_SECONDS_LOST_RETRACTED)["cross_rail"] == 0.0625


def test_cause_is_the_incidents_primary_cause() -> None:
    """Cost by cause on a dashboard and the incidents' seconds lost name the same cause."""
    flag_sets = [[], ["slow_kv_transfer"], ["cross_rail", "tcp_fallback"], ["broken_trace", "cross_rail"]]
    flag_sets += [[f.value] for f in FlagName] + [[f.value for f in FlagName]]
    for flags in flag_sets:
        record = Record("t", 0, dict.fromkeys(flags, ""), {}, (None, None))
        assert lost_cause(flags) == (record.primary or semconv.CAUSE_NONE)
    assert lost_cause(["not_a_flag"]) == semconv.LABEL_OTHER  # bounded, whatever a store holds
