"""TraceQL metrics over railtrace's requests: Tempo's `/api/metrics/query_range` and
`/api/metrics/query`, which Grafana's Traces Drilldown and metrics panels call.

What is counted is a request (its root span), not every span: railtrace stores verdicts per
request, and `{}` over requests is what Drilldown's "traces" view asks with
`{nestedSetParent<0}`. The filter takes railtrace's request tags (flags, path class, node, pod,
model, `nestedSetParent<0`, the request's `duration`); conditions on other span attributes are
refused (they would need every span read). Functions: `rate()`, `count_over_time()`,
`avg_over_time`, `min_over_time`, `max_over_time`, `sum_over_time` and `quantile_over_time`
of `duration` (the request's end to end), `.railtrace.verdict.ttft` or
`.railtrace.verdict.kv_transfer.duration`; `by (...)` railtrace's attributes (`GROUP_BY`), including
`railtrace.verdict.pair` (`<prefill node> -> <decode node>`), a label of these metrics only.

Shapes follow grafana/tempo v2.9.0: parameters in pkg/api/http.go (`ParseQueryRangeRequest`,
`bounds`, `step`: `q` or `query`, `start`/`end` in unix seconds, nanoseconds or RFC 3339,
`since`, `step` in seconds or a Go duration, else `DefaultQueryRangeStep`); answers as
pkg/tempopb/tempo.proto `QueryRangeResponse`/`QueryInstantResponse` in proto JSON; intervals
as pkg/traceql/engine_metrics.go `IntervalMapperQueryRange` (start aligned down to the step,
each interval right-closed, stamped with its end); an ungrouped series named
`{__name__="<function>"}` and a quantile's series labelled `p`. Quantiles here are exact over
the requests read (Tempo's come from log2 buckets, so they can differ by up to a bucket).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from railtrace.query.budget import Budget
from railtrace.query.search import REQUEST_TAGS, request_filters
from railtrace.query.traceql import DURATION, UNITS, Cond, TraceQLError, compare, parse_traceql
from railtrace.store import Cursor, RequestQuery, Store
from railtrace_tracing import semconv

FUNCTION = re.compile(
    r"^\s*(rate|count_over_time|avg_over_time|min_over_time|max_over_time|sum_over_time|quantile_over_time)"
    r"\s*\(([^()]*)\)\s*(?:by\s*\(([^()]*)\))?\s*$"
)
PAIR = "railtrace.verdict.pair"
# Most intervals one answer holds (Prometheus' own bound on a range query's points).
MAX_POINTS = 11_000
PAGE = 1000


def _pair(s: dict[str, Any]) -> list[str]:
    kv = s.get("kv_transfer") or {}
    pre = (kv.get("source") or s.get("prefill") or {}).get("node")
    dec = (s.get("decode") or {}).get("node")
    return [f"{pre or ''} -> {dec or ''}"] if pre or dec else []


def _kv(s: dict[str, Any], key: str) -> Any:
    return (s.get("kv_transfer") or {}).get(key)


# Attributes a series can be grouped by: each request's values (a list: a request with two
# flags counts in each; none: the `nil` series, as Tempo groups a span without the attribute).
GROUP_BY: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    semconv.VERDICT_PATH_CLASS: lambda s: [_kv(s, "path_class") or "unknown"],
    semconv.VERDICT_FLAGS: lambda s: sorted({f["name"] for f in s.get("flags") or ()}),
    semconv.VERDICT_PAIRING_LEVEL: lambda s: [s["pairing_level"]] if s.get("pairing_level") else [],
    semconv.VERDICT_NODE: lambda s: sorted(
        {n for leg in ("prefill", "decode") if (n := (s.get(leg) or {}).get("node"))}
    ),
    semconv.VERDICT_POD: lambda s: sorted(
        {p for leg in ("prefill", "decode") if (p := (s.get(leg) or {}).get("pod"))}
    ),
    semconv.GEN_AI_REQUEST_MODEL: lambda s: [s["model"]] if s.get("model") else [],
    semconv.KV_TRANSPORT: lambda s: [_kv(s, "transport") or "unknown"],
    PAIR: _pair,
}
# Values the `*_over_time` functions take, in seconds.
VALUES: dict[str, Callable[[dict[str, Any]], float | None]] = {
    "duration": lambda s: s.get("e2e_s"),
    semconv.VERDICT_TTFT: lambda s: s.get("ttft_s"),
    semconv.VERDICT_KV_DURATION: lambda s: _kv(s, "duration_s"),
}


def _attribute(name: str) -> str:
    """`span.x`, `.x`, `resource.x` or `x` as the bare attribute name."""
    for prefix in ("span.", "resource.", "."):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


@dataclass(slots=True)
class MetricsQuery:
    function: str
    filters: dict[str, str]
    post: list[Cond]
    durations: list[Cond]
    value: Callable[[dict[str, Any]], float | None] | None = None
    quantiles: list[float] = field(default_factory=list)
    by: list[str] = field(default_factory=list)


def split_pipeline(q: str) -> tuple[str, str | None]:
    """The spanset part and the first pipeline stage (text after a top-level `|`)."""
    depth, quoted, i = 0, False, 0
    while i < len(q):
        c = q[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c in "{(":
            depth += 1
        elif c in "})":
            depth -= 1
        elif c == "|" and depth == 0:
            if q[i + 1 : i + 2] == "|":
                i += 2
                continue
            return q[:i], q[i + 1 :]
        i += 1
    return q, None


def parse_metrics_query(q: str) -> MetricsQuery:
    """`{filters} | function(args) by (attrs)`; TraceQLError for what is not supported."""
    spans, stage = split_pipeline(q.strip())
    if stage is None:
        raise TraceQLError("a metrics query needs a function: `{...} | rate()`")
    m = FUNCTION.match(stage)
    if not m:
        raise TraceQLError(
            f"unsupported metrics function {stage.strip()[:60]!r} (rate, count_over_time,"
            " avg/min/max/sum_over_time, quantile_over_time, optionally by (...))"
        )
    sets = parse_traceql(spans) if spans.strip() else parse_traceql("{}")
    if len(sets) != 1:
        raise TraceQLError("a metrics query takes one spanset")
    filters, rest, post = request_filters(sets)
    durations: list[Cond] = []
    for c in rest[0].conds:
        if c.scope == "intrinsic" and c.key == "nestedSetParent" and c.op == "<" and float(c.value) <= 0:
            continue  # root spans: every request is counted by its root
        if (
            c.scope == "intrinsic"
            and c.key in ("duration", "traceDuration")
            and c.op in (">", ">=", "<", "<=", "=", "!=")
        ):
            durations.append(c)
            continue
        raise TraceQLError(
            "TraceQL metrics filter on railtrace's request tags only ("
            + ", ".join(sorted(REQUEST_TAGS))
            + ", duration, nestedSetParent<0)"
        )
    function, args, by = m.group(1), [a.strip() for a in m.group(2).split(",") if a.strip()], m.group(3)
    out = MetricsQuery(function, filters, post, durations)
    if function in ("rate", "count_over_time"):
        if args:
            raise TraceQLError(f"{function}() takes no argument")
    else:
        if not args:
            raise TraceQLError(f"{function} needs a value: one of {sorted(VALUES)}")
        key = args[0] if args[0] == "duration" else _attribute(args[0])
        if key not in VALUES:
            raise TraceQLError(f"{function} of {args[0]!r}: use one of {sorted(VALUES)}")
        out.value = VALUES[key]
        if function == "quantile_over_time":
            try:
                out.quantiles = [float(a) for a in args[1:]]
            except ValueError:
                raise TraceQLError("quantile_over_time takes quantiles between 0 and 1") from None
            if not out.quantiles or not all(0 <= x <= 1 for x in out.quantiles):
                raise TraceQLError("quantile_over_time takes quantiles between 0 and 1")
        elif len(args) > 1:
            raise TraceQLError(f"{function} takes one value")
    for name in [b.strip() for b in (by or "").split(",") if b.strip()]:
        attr = _attribute(name)
        if attr not in GROUP_BY:
            raise TraceQLError(f"by ({name}): group by one of {sorted(GROUP_BY)}")
        out.by.append(attr)
    return out


def parse_time(raw: str | None, default_ns: int) -> int:
    """A time as Tempo's `parseTimestamp` reads it: unix seconds (with a fraction), nanoseconds
    (more than 10 digits), or RFC 3339."""
    if raw is None or raw == "":
        return default_ns
    from datetime import datetime

    try:
        if "." in raw:
            return round(float(raw) * 1e9)
        n = int(raw)
        return n * 10**9 if len(raw) <= 10 else n
    except ValueError:
        pass
    try:
        return round(datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp() * 1e9)
    except ValueError:
        raise TraceQLError(f"cannot read the time {raw[:40]!r}") from None


def parse_step(raw: str | None, start_ns: int, end_ns: int) -> int:
    """`step` in seconds or as a duration; by default Tempo's (about 240 points, whole 5 s)."""
    if not raw:
        base = (end_ns - start_ns) // 240
        interval = base // 5_000_000_000 * 5_000_000_000
        if interval < 5_000_000_000:
            interval = base // 1_000_000_000 * 1_000_000_000
        return max(interval, 1_000_000_000)
    try:
        return round(float(raw) * 1e9)
    except ValueError:
        pass
    m = DURATION.match(raw.strip())
    if not m:
        raise TraceQLError(f"cannot read the step {raw[:40]!r}: seconds or a duration such as 15s")
    return round(float(m.group(1)) * UNITS[m.group(2)])


def _requests(
    store: Store, mq: MetricsQuery, start_ns: int, end_ns: int, budget: Budget
) -> Iterator[dict[str, Any]]:
    """The requests that started in (start, end] and pass the filter, newest first, within the budget."""
    cursor = None
    while budget.left():
        page = store.list_requests(
            RequestQuery(
                limit=min(PAGE, max(1, budget.rows_left)),
                cursor=cursor,
                since_ns=start_ns,
                until_ns=end_ns + 1,
                flag=mq.filters.get("flag"),
                path_class=mq.filters.get("path_class"),
                node=mq.filters.get("node"),
                pod=mq.filters.get("pod"),
                model=mq.filters.get("model"),
            )
        )
        budget.take(len(page.items))
        for s in page.items:
            if _passes(s, mq):
                yield s
        if not page.next_cursor:
            return
        cursor = Cursor.decode(page.next_cursor)


def _passes(s: dict[str, Any], mq: MetricsQuery) -> bool:
    from railtrace.query.search import _summary_value

    if not all(compare(_summary_value(s, c.key), c.op, c.value) for c in mq.post):
        return False
    e2e_ns = (s.get("e2e_s") or 0) * 1e9
    return all(compare(e2e_ns, c.op, c.value) for c in mq.durations)


def _start_ns(s: dict[str, Any]) -> int:
    from datetime import datetime

    return round(datetime.fromisoformat(str(s["start"]).replace("Z", "+00:00")).timestamp() * 1e6) * 1000


def _label(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": value}} if value is not None else {"key": key, "value": {}}


def evaluate(
    store: Store, mq: MetricsQuery, start_ns: int, end_ns: int, step_ns: int, budget: Budget, instant: bool
) -> dict[str, Any]:
    """The series of `mq` over (start, end]: Tempo's QueryRangeResponse (or, `instant`, its
    QueryInstantResponse) as proto JSON, marked PARTIAL when the budget cut the read short."""
    if instant:
        first, count, step_ns = start_ns, 1, end_ns - start_ns
    else:
        first = start_ns - start_ns % step_ns
        last = end_ns if end_ns % step_ns == 0 else end_ns + step_ns - end_ns % step_ns
        count = (last - first) // step_ns
        if count > MAX_POINTS:
            raise TraceQLError(f"{count} points asked: at most {MAX_POINTS}, use a longer step")
    groups: dict[tuple[Any, ...], list[list[float]]] = {}
    inspected = 0
    for s in _requests(store, mq, first, first + count * step_ns, budget):
        inspected += 1
        t = _start_ns(s)
        i = 0 if instant else max(0, (t - first - 1) // step_ns)
        if not 0 <= i < count:
            continue
        value = mq.value(s) if mq.value is not None else 1.0
        if value is None:
            continue
        keys: list[tuple[Any, ...]] = [()]
        for attr in mq.by:
            values: list[str | None] = [*GROUP_BY[attr](s)] or [None]
            keys = [(*k, v) for k in keys for v in values]
        for k in keys:
            groups.setdefault(k, [[] for _ in range(count)])[i].append(float(value))
    step_s = step_ns / 1e9
    series = []
    for key, buckets in sorted(groups.items(), key=lambda kv: tuple(str(v) for v in kv[0])):
        labels = [_label(attr, v) for attr, v in zip(mq.by, key, strict=True)] or [
            _label("__name__", mq.function)
        ]
        quantiles: list[float | None] = [*mq.quantiles] or [None]
        for q in quantiles:
            points = [_aggregate(mq.function, b, step_s, q) for b in buckets]
            qlabels = labels + ([_label("p", q)] if q is not None else [])
            if instant:
                if points[0] is not None:
                    series.append({"labels": qlabels, "value": points[0]})
                continue
            samples = [
                {"timestampMs": str((first + (i + 1) * step_ns) // 1_000_000), "value": v}
                for i, v in enumerate(points)
                if v is not None
            ]
            if samples:
                series.append({"labels": qlabels, "samples": samples, "exemplars": []})
    answer: dict[str, Any] = {"series": series, "metrics": {"inspectedTraces": inspected}}
    if budget.spent:
        answer |= {"status": "PARTIAL", "message": f"query stopped early ({budget.spent})"}
    return answer


def _aggregate(function: str, values: list[float], step_s: float, q: float | None) -> float | None:
    if function == "rate":
        return len(values) / step_s
    if function == "count_over_time":
        return float(len(values))
    if not values:
        return None
    if function == "avg_over_time":
        return sum(values) / len(values)
    if function == "min_over_time":
        return min(values)
    if function == "max_over_time":
        return max(values)
    if function == "sum_over_time":
        return sum(values)
    ordered = sorted(values)  # quantile_over_time: nearest rank
    return ordered[min(len(ordered) - 1, max(0, math.ceil((q or 0) * len(ordered)) - 1))]
