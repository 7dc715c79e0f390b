"""Shared pieces of every railtrace dashboard: datasources, variables, selectors, panels.

Metric names come from the registry (`railtrace_tracing.semconv`); recording-rule names are
those of `dashboards/rules/llm-d-tracing.rules.yaml` (a test holds the two in step).
"""

from __future__ import annotations

from collections.abc import Iterable

from grafana_foundation_sdk.builders.common import ReduceDataOptions, StackingConfig, VizLegendOptions
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DashboardLink,
    DatasourceVariable,
    QueryVariable,
    TextBoxVariable,
    ThresholdsConfig,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery as PromQuery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.table import Panel as Table
from grafana_foundation_sdk.builders.tempo import Dataquery as TempoQuery
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.models.common import (
    BigValueColorMode,
    BigValueGraphMode,
    LegendDisplayMode,
    LegendPlacement,
    StackingMode,
    TimeZoneBrowser,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardLinkType,
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    Threshold,
    ThresholdsMode,
    VariableRefresh,
    VariableSort,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from railtrace_tracing import semconv

# -- datasources and variables -------------------------------------------------------------

V_DATASOURCE = "datasource"
V_TRACES = "traces"
V_NAMESPACE = "namespace"
V_MODEL = "model"
V_NODE = "node"
V_RAILTRACE = "railtrace_url"

PROM = DataSourceRef(type_val="prometheus", uid=f"${{{V_DATASOURCE}}}")
TRACES = DataSourceRef(type_val="tempo", uid=f"${{{V_TRACES}}}")

# Where operators reach railtrace's API from their browser (a textbox they can change).
DEFAULT_RAILTRACE_URL = "http://railtrace.llm-d-tracing.svc:4318"
RAILTRACE = f"${{{V_RAILTRACE}}}"

# Prometheus target label a ServiceMonitor/PodMonitor adds; llm-d's dashboards filter on it too.
NAMESPACE_LABEL = "namespace"
# Label naming the model on llm-d's and vLLM's own series.
LLMD_MODEL_LABEL = "model_name"

NS = f'{NAMESPACE_LABEL}=~"${V_NAMESPACE}"'
RATE = "$__rate_interval"
RANGE = "$__range"

# Recording rules (dashboards/rules/llm-d-tracing.rules.yaml).
R_REQUESTS = "namespace_model_path_class:llm_d_tracing_requests:rate5m"
R_FLAGS = "namespace_flag:llm_d_tracing_flags:rate5m"
R_KV_TRANSFERS = "namespace_transport_path_class:llm_d_tracing_kv_transfers:rate5m"
R_TCP_FALLBACK_RATIO = "namespace:llm_d_tracing_flags_tcp_fallback_per_requests:ratio_rate5m"
R_CROSS_RAIL_RATIO = "namespace:llm_d_tracing_kv_transfers_cross_rail_per_kv_transfers:ratio_rate5m"
R_TTFT_BUCKETS = "namespace_path_class_le:llm_d_tracing_ttft_seconds_bucket:rate5m"
R_KV_DURATION_BUCKETS = "namespace_path_class_le:llm_d_tracing_kv_transfer_duration_seconds_bucket:rate5m"
R_CONTRACT = "namespace_obligation_status:llm_d_tracing_contract_obligations:sum"
R_LEG_RESOLUTION = "namespace_recipe_resolution:llm_d_tracing_leg_resolution:rate5m"
R_LEGS_RESOLVED_RATIO = "namespace:llm_d_tracing_legs_resolved_per_requests:ratio_rate5m"
RECORDING_RULES: tuple[str, ...] = (
    R_REQUESTS,
    R_FLAGS,
    R_KV_TRANSFERS,
    R_TCP_FALLBACK_RATIO,
    R_CROSS_RAIL_RATIO,
    R_TTFT_BUCKETS,
    R_KV_DURATION_BUCKETS,
    R_CONTRACT,
    R_LEG_RESOLUTION,
    R_LEGS_RESOLVED_RATIO,
)

# The TTFT objective's bucket: 90% of requests under 1 s (same bucket as LLMDTTFTObjectiveAtRisk;
# prometheus_client writes bucket bounds as Go floats, hence "1.0").
TTFT_OBJECTIVE_LE = "1.0"

TAGS = ["llm-d", "llm-d-tracing", "railtrace", "generated"]


def sel(metric: str, *matchers: str) -> str:
    """`metric{namespace=~"$namespace", ...}`: every railtrace selector is namespace-scoped."""
    return f"{metric}{{{', '.join((NS, *matchers))}}}"


def eq(label: str, value: str) -> str:
    return f'{label}="{value}"'


def re(label: str, value: str) -> str:
    return f'{label}=~"{value}"'


def suffix(metric: str, part: str) -> str:
    """Exposed series of a family: `_bucket`/`_sum`/`_count` of a histogram, `_total` is in the name."""
    return f"{metric}_{part}"


def variables(board: Dashboard) -> Dashboard:
    """The variables every railtrace dashboard declares, in the order llm-d's dashboards use."""
    return (
        board.with_variable(DatasourceVariable(V_DATASOURCE).label("Prometheus").type("prometheus"))
        .with_variable(
            DatasourceVariable(V_TRACES)
            .label("Traces (Tempo)")
            .type("tempo")
            .description("Trace store for exemplar and TraceQL links; Jaeger users follow exemplars instead.")
        )
        .with_variable(
            QueryVariable(V_NAMESPACE)
            .label("Namespace")
            .datasource(PROM)
            .query(f"label_values({semconv.M_REQUESTS}, {NAMESPACE_LABEL})")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .include_all(True)
            .all_value(".*")
            .multi(True)
        )
        .with_variable(
            QueryVariable(V_MODEL)
            .label("Model")
            .datasource(PROM)
            .query(f"label_values({semconv.M_REQUESTS}{{{NS}}}, model)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .include_all(True)
            .all_value(".*")
            .multi(True)
        )
        .with_variable(
            QueryVariable(V_NODE)
            .label("Node")
            .datasource(PROM)
            .query(f"label_values({semconv.M_KV_NODE_BYTES}{{{NS}}}, node)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .include_all(True)
            .all_value(".*")
            .multi(True)
        )
        .with_variable(
            TextBoxVariable(V_RAILTRACE)
            .label("railtrace API")
            .default_value(DEFAULT_RAILTRACE_URL)
            .description("Base URL of railtrace's HTTP API, for links to requests and traces.")
        )
    )


def dashboard(title: str, uid: str, description: str) -> Dashboard:
    """A railtrace dashboard with its variables and the links every board shares."""
    board = (
        Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .refresh("30s")
        .time("now-1h", "now")
        .timezone(TimeZoneBrowser)
        .editable()
        .link(
            DashboardLink("llm-d tracing")
            .type(DashboardLinkType.DASHBOARDS)
            .tags(["llm-d-tracing"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
        .link(
            DashboardLink("llm-d")
            .type(DashboardLinkType.DASHBOARDS)
            .tags(["llm-d"])
            .as_dropdown(True)
            .keep_time(True)
        )
        .link(
            DashboardLink("railtrace: requests")
            .type(DashboardLinkType.LINK)
            .url(f"{RAILTRACE}/requests")
            .target_blank(True)
        )
    )
    return variables(board)


# -- panels ----------------------------------------------------------------------------------


def prom(expr: str, legend: str = "", *, ref: str = "A", exemplar: bool = False) -> PromQuery:
    q = PromQuery().ref_id(ref).expr(expr).datasource(PROM)
    if legend:
        q = q.legend_format(legend)
    if exemplar:
        q = q.exemplar(True)
    return q


def instant_table(expr: str, *, ref: str = "A") -> PromQuery:
    return PromQuery().ref_id(ref).expr(expr).datasource(PROM).instant().format(PromQueryFormat.TABLE)


def request_links(*, flag: str | None = None) -> list[DashboardLink]:
    """Data links from a series to the matching requests in railtrace's web UI."""
    query = f"flag={flag}" if flag else "path_class=${__field.labels.path_class}"
    return [
        DashboardLink("railtrace: these requests").url(f"{RAILTRACE}/requests?{query}").target_blank(True)
    ]


def timeseries(
    title: str,
    description: str,
    targets: Iterable[PromQuery],
    *,
    unit: str = "short",
    stacked: bool = False,
    width: int = 12,
    height: int = 8,
    links: list[DashboardLink] | None = None,
) -> Timeseries:
    panel = (
        Timeseries()
        .title(title)
        .description(description)
        .datasource(PROM)
        .unit(unit)
        .min(0)
        .fill_opacity(10)
        .legend(
            VizLegendOptions()
            .display_mode(LegendDisplayMode.TABLE)
            .placement(LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        .span(width)
        .height(height)
    )
    if stacked:
        panel = panel.stacking(StackingConfig().mode(StackingMode.NORMAL)).fill_opacity(40)
    if links:
        panel = panel.data_links(links)
    for target in targets:
        panel = panel.with_target(target)
    return panel


def stat(
    title: str,
    description: str,
    target: PromQuery,
    *,
    unit: str = "short",
    red_at: float | None = None,
    no_value: str = "0",
    width: int = 6,
    height: int = 5,
    links: list[DashboardLink] | None = None,
) -> Stat:
    steps = [Threshold(value=None, color="green")]
    if red_at is not None:
        steps.append(Threshold(value=red_at, color="red"))
    panel = (
        Stat()
        .title(title)
        .description(description)
        .datasource(PROM)
        .unit(unit)
        .no_value(no_value)
        .color_mode(BigValueColorMode.BACKGROUND if red_at is not None else BigValueColorMode.VALUE)
        .graph_mode(BigValueGraphMode.AREA)
        .reduce_options(ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps))
        .with_target(target)
        .span(width)
        .height(height)
    )
    if links:
        panel = panel.links(links)
    return panel


def matrix_table(
    title: str,
    description: str,
    target: PromQuery,
    *,
    rows: str,
    columns: str,
    unit: str = "short",
    width: int = 12,
    height: int = 9,
) -> Table:
    """An instant query turned into a rows x columns grid (e.g. prefill node x decode node)."""
    return (
        Table()
        .title(title)
        .description(description)
        .datasource(PROM)
        .unit(unit)
        .with_transformation(
            DataTransformerConfig(
                id_val="groupingToMatrix",
                options={"rowField": rows, "columnField": columns, "valueField": "Value"},
            )
        )
        .with_target(target)
        .span(width)
        .height(height)
    )


def table(
    title: str, description: str, target: PromQuery, *, unit: str = "short", width: int = 12, height: int = 9
) -> Table:
    return (
        Table()
        .title(title)
        .description(description)
        .datasource(PROM)
        .unit(unit)
        .with_transformation(
            DataTransformerConfig(id_val="organize", options={"excludeByName": {"Time": True}})
        )
        .with_target(target)
        .span(width)
        .height(height)
    )


def traces_table(title: str, description: str, traceql: str, *, width: int = 24, height: int = 9) -> Table:
    """Recent traces from the trace store, each linked to railtrace's verdict on it too."""
    return (
        Table()
        .title(title)
        .description(description)
        .datasource(TRACES)
        .with_target(TempoQuery().ref_id("A").query_type("traceql").query(traceql).limit(20))
        .override_by_name(
            "traceID",
            [
                DynamicConfigValue(
                    id_val="links",
                    value=[
                        {
                            "title": "railtrace: request and verdict",
                            "url": f"{RAILTRACE}/requests/${{__value.raw}}",
                            "targetBlank": True,
                        }
                    ],
                )
            ],
        )
        .span(width)
        .height(height)
    )
