"""Read the PromQL back out of generated dashboards, for promtool, Prometheus and name checks.

Grafana fills `$__rate_interval`, `$__range` and template variables at query time; these
helpers substitute plain values so promtool and a real Prometheus can run the same text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from railtrace_tracing import semconv

_KEYWORDS = frozenset(
    [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "inf",
        "nan",
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ]
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


@dataclass(frozen=True, slots=True)
class Target:
    """One query of one panel."""

    dashboard: str
    panel: str
    ref_id: str
    datasource_type: str
    expr: str
    instant: bool


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those inside collapsed rows."""
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", []) or []


def targets(board: dict[str, Any]) -> Iterator[Target]:
    for panel in panels(board):
        panel_ds = (panel.get("datasource") or {}).get("type", "")
        for target in panel.get("targets", []) or []:
            ds = (target.get("datasource") or {}).get("type", panel_ds)
            yield Target(
                dashboard=board.get("uid", ""),
                panel=panel.get("title", ""),
                ref_id=target.get("refId", ""),
                datasource_type=ds,
                expr=target.get("expr") or target.get("query") or "",
                instant=bool(target.get("instant")),
            )


def prometheus_targets(board: dict[str, Any]) -> list[Target]:
    return [t for t in targets(board) if t.datasource_type == "prometheus"]


def substitute(expr: str, *, rate: str = "5m", range_: str = "1h", variable: str = ".*") -> str:
    """Grafana's built-ins as fixed durations, every template variable as `variable`."""
    expr = expr.replace("$__rate_interval", rate).replace("$__interval", rate).replace("$__range", range_)
    return _VARIABLE.sub(variable, expr)


def variables_used(text: str) -> set[str]:
    return {a or b for a, b in _VARIABLE.findall(text)}


def metric_names(expr: str) -> set[str]:
    """Metric (or recording-rule) names a PromQL expression selects."""
    text = _STRING.sub('""', expr)
    text = _BRACKETS.sub("", text)
    text = _GROUPING.sub(r"\1", text)
    previous = None
    while previous != text:  # nested braces cannot occur in PromQL, but be safe
        previous, text = text, _BRACES.sub(" ", text)
    names = set()
    for ident, call in _IDENT.findall(text):
        if call or ident in _KEYWORDS:
            continue
        names.add(ident)
    return names


def family(name: str) -> str | None:
    """The registry's family for an exposed series name, or None if it is not railtrace's."""
    if name in semconv.METRICS_BY_NAME:
        return name
    for part in ("_bucket", "_sum", "_count"):
        base = name.removesuffix(part)
        if base != name and base in semconv.METRICS_BY_NAME:
            return base if semconv.METRICS_BY_NAME[base].type == "histogram" else None
    return None


def external_family(name: str) -> str | None:
    """The llm-d/vLLM family (`semconv.EXTERNAL_METRICS`) an exposed series belongs to."""
    for part in ("", "_bucket", "_sum", "_count", "_total"):
        base = name.removesuffix(part) if part else name
        if base in semconv.EXTERNAL_METRICS:
            return base
    return None


def label_matchers(expr: str) -> Iterator[tuple[str, str]]:
    """(metric, label) for every label matcher written inside a selector."""
    text = _STRING.sub('""', expr)
    for match in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^{}]*)\}", text):
        for label in re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", match.group(2)):
            yield match.group(1), label
