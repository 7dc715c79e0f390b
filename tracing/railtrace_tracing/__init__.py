"""railtrace instrumentation shims (imported as `railtrace_tracing`; the folder is `tracing/`).

Nothing here does anything until a shim's `instrument()` is called or `RAILTRACE_SHIMS`
enables it under `opentelemetry-instrument`.
"""

__version__ = "0.1.0"
