"""The modelled P/D fleet that drives the real shims for `railtrace demo` and load tests."""
