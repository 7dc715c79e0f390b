#!/usr/bin/env bash
# Long fuzz run of the OTLP receivers: RAILTRACE_FUZZ_EXAMPLES inputs per fuzz test (four tests:
# HTTP protobuf, HTTP JSON, gRPC, HTTP headers), so the default 25000 is 100,000 inputs.
# Each test appends {"test", "inputs", "answers", "accepted_spans"} to the report file.
#   benchmarks/reliability/fuzz.sh [EXAMPLES_PER_TEST] [REPORT]
set -euo pipefail
cd "$(dirname "$0")/../.."
export RAILTRACE_FUZZ_EXAMPLES="${1:-25000}"
export RAILTRACE_FUZZ_REPORT="${2:-fuzz-report.jsonl}"
.venv/bin/python -m pytest -q -p no:cacheprovider -o timeout=86400 tests/reliability/test_fuzz_otlp.py
cat "$RAILTRACE_FUZZ_REPORT"
