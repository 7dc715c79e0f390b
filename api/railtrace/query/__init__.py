"""Queries of the read API: the TraceQL subset Grafana writes (`traceql`), Tempo's search over
the store (`search`), spans read a page at a time (`reads`), all within the time and row
budgets of `budget`. The routers frame HTTP around them."""
