"""Schemathesis against the OpenAPI description of a live service: every operation, every
check except `positive_data_acceptance` (schema-valid values the service still refuses with
a documented 400, such as a cursor it never issued or a trace id that is not 32 hex digits).
CI runs 10 examples per operation; `benchmarks/reliability/schemathesis.sh` runs more examples."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from railtrace.server.runner import Service
from railtrace.settings import Settings

EXAMPLES = os.environ.get("RAILTRACE_SCHEMATHESIS_EXAMPLES", "10")


def schemathesis_command() -> list[str]:
    exe = Path(sys.executable).with_name("schemathesis")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("schemathesis")
    if not found:
        pytest.skip("schemathesis is not installed (pip install schemathesis)")
    return [found]


def test_openapi_holds_under_schemathesis(tmp_path: Path) -> None:
    cmd = schemathesis_command()
    settings = Settings(db=f"sqlite:///{tmp_path / 'st.db'}", port=0, grpc_port=0, topology=[])
    with Service(settings) as svc:
        result = subprocess.run(
            [
                *cmd,
                "run",
                svc.http_url + "/openapi.json",
                "--checks",
                "all",
                "--exclude-checks",
                "positive_data_acceptance",
                "--max-examples",
                EXAMPLES,
                "--seed",
                "20261129",
                "--no-color",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            cwd=tmp_path,
        )
        assert httpx_ok(svc.http_url)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def httpx_ok(url: str) -> bool:
    import httpx

    return httpx.get(url + "/readyz", timeout=30).status_code == 200
