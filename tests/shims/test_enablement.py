"""Zero-code enablement: off unless enabled, idempotent, and a shim failure never reaches the host."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from opentelemetry.trace import StatusCode

from railtrace_tracing import semconv as sc
from railtrace_tracing._common import enabled_shims
from railtrace_tracing.kv_transfer import emit_kv_transfer, record_kv_transfer
from railtrace_tracing.kv_transfer.recorder import evidence_attributes

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parents[1] / "fixtures" / "transport" / "probe" / "two_read_tls_tcp.log"


def test_env_switch_parsing() -> None:
    assert enabled_shims({}) == set()
    assert enabled_shims({sc.ENV_ENABLE: "nixl, gateway"}) == {"nixl", "gateway"}
    assert "pd" in enabled_shims({sc.ENV_ENABLE: "all"})


def test_recorder_without_agent_uses_given_times_and_ucx_text(otel) -> None:
    provider, exporter = otel
    text = PROBE.read_text()
    with record_kv_transfer(
        tracer_provider=provider,
        request_id="r1",
        operation="read",
        bytes=4096,
        descriptors=2,
        remote_host="10.0.0.7",
        remote_engine_id="e7",
        local_gpu="GPU3",
        ucx_log_text=text,
        ucx_context="probe-initiator",
        start_time_ns=1_000,
        end_time_ns=2_000,
    ):
        pass
    emit_kv_transfer(
        tracer_provider=provider,
        operation="write",
        start_time_ns=5_000,
        end_time_ns=9_000,
        error_type="nixl_xfer_err",
    )
    first, second = exporter.get_finished_spans()
    assert (first.start_time, first.end_time) == (1_000, 2_000)
    if text:
        assert first.attributes[sc.KV_TRANSPORT] == "tcp"
        assert first.attributes[sc.KV_PROTOCOL] == "software emulation"
    assert first.attributes[sc.KV_LOCAL_GPU] == "GPU3" and first.attributes[sc.KV_DESCRIPTORS] == 2
    assert second.attributes[sc.KV_TRANSPORT] == "unknown"
    assert (
        second.status.status_code is StatusCode.ERROR and second.attributes[sc.ERROR_TYPE] == "nixl_xfer_err"
    )
    assert evidence_attributes(None) == {sc.KV_TRANSPORT: "unknown"}


def test_host_exception_propagates_unchanged_and_marks_span(otel) -> None:
    provider, exporter = otel
    with pytest.raises(KeyError), record_kv_transfer(tracer_provider=provider, operation="read"):
        raise KeyError("host bug")
    [span] = exporter.get_finished_spans()
    assert span.attributes[sc.ERROR_TYPE] == "KeyError"


class _BrokenProvider:
    def get_tracer(self, *a: object, **k: object) -> object:
        raise RuntimeError("exporter misconfigured")


def test_shim_failure_costs_a_span_not_the_request() -> None:
    with record_kv_transfer(tracer_provider=_BrokenProvider(), operation="read") as rec:  # type: ignore[arg-type]
        rec.set(bytes=10)
        rec.set_evidence(None)
        value = 42
    assert value == 42 and (rec.span is None or not rec.span.is_recording())


def test_nixl_wrapper_failure_does_not_reach_the_caller(monkeypatch) -> None:
    from railtrace_tracing.kv_transfer import instrumentor as mod

    inst = mod.NixlKVTransferInstrumentor()

    class Broken(dict):  # the bookkeeping of every patch fails
        def __setitem__(self, key: object, value: object) -> None:
            raise RuntimeError("shim bug")

        def __contains__(self, key: object) -> bool:
            raise RuntimeError("shim bug")

    monkeypatch.setattr(inst, "_handles", Broken())

    class Agent:
        name = "a"

        def initialize_xfer(self, *a: object) -> str:
            return "handle"

        def transfer(self, *a: object) -> str:
            return "DONE"

    init = inst._make_initialize_xfer(Agent.initialize_xfer)
    post = inst._make_transfer(Agent.transfer)
    assert init(Agent(), "READ", [], [], "peer") == "handle"
    assert post(Agent(), "handle") == "DONE"


def _run(code: str, env: dict[str, str]) -> str:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("RAILTRACE_", "UCX_", "OTEL_"))}
    full.update(env)
    bindir = Path(sys.executable).parent
    cmd = [str(bindir / "opentelemetry-instrument"), sys.executable, "-c", textwrap.dedent(code)]
    return subprocess.run(
        cmd, env=full, cwd=ROOT, check=True, capture_output=True, text=True, timeout=120
    ).stdout


CHECK = """
    import os
    from railtrace_tracing.gateway import GatewayInstrumentor
    from railtrace_tracing.kv_transfer import NixlKVTransferInstrumentor
    print("gateway", GatewayInstrumentor().is_instrumented_by_opentelemetry)
    print("nixl", NixlKVTransferInstrumentor().is_instrumented_by_opentelemetry)
    print("ucx", os.environ.get("UCX_PROTO_INFO"))
"""


def test_opentelemetry_instrument_does_nothing_unless_enabled() -> None:
    base = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
    off = _run(CHECK, base)
    assert "gateway False" in off and "nixl False" in off and "ucx None" in off
    on = _run(CHECK, {**base, sc.ENV_ENABLE: "nixl,gateway"})
    # UCX variables are set only when the first NIXL agent starts UCX, never at instrument() time.
    assert "gateway True" in on and "nixl True" in on and "ucx None" in on
