"""railtrace's Grafana dashboards (grafana-foundation-sdk 0.0.21) and Prometheus rules.

`python -m dashboards.build` regenerates `dashboards/generated/`: one `llm-d-tracing-*.json`
per dashboard, the Grafana datasource provisioning that links exemplars to traces, and the
PrometheusRule wrapping `dashboards/rules/*.yaml` for `deploy/`.
"""
