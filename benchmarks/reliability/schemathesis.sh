#!/usr/bin/env bash
# Longer schemathesis run against a live service (the CI test runs 10 examples per operation).
#   benchmarks/reliability/schemathesis.sh [EXAMPLES]      (default 500)
set -euo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/python -m pip install --quiet schemathesis
RAILTRACE_SCHEMATHESIS_EXAMPLES="${1:-500}" .venv/bin/python -m pytest -q -p no:cacheprovider \
  -o timeout=3600 tests/reliability/test_openapi_schemathesis.py
