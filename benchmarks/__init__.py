"""railtrace's benchmarks, one package per part; run each from the repository root as
`python -m benchmarks.<part>.<script>`. Shared code is in `benchmarks.common`."""
