"""Without a tracer provider in the host process, the KV shim exports through one built from the
standard OTEL_* variables (real SDK and OTLP/HTTP exporter to a local receiver)."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from railtrace_tracing.otel_setup import wants_export

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import sys, types
    from railtrace_tracing.kv_transfer import instrumentor as mod, kv_transfer_scope
    from railtrace_tracing.otel_setup import provider_for_shims

    class nixl_agent:  # the NIXL method names the shim patches
        def __init__(self, name, nixl_conf=None): self.name = name
        def initialize_xfer(self, operation, local_descs, remote_descs, remote_agent, notif=b""):
            return object()
        def transfer(self, handle, notif_msg=b""): return "DONE"

    api = types.ModuleType("fake_nixl._api"); api.nixl_agent = nixl_agent
    sys.modules["fake_nixl"] = types.ModuleType("fake_nixl"); sys.modules["fake_nixl._api"] = api
    mod.NIXL_MODULES = ("fake_nixl._api",)
    inst = mod.NixlKVTransferInstrumentor()
    inst.instrument(capture_ucx_log=False, vllm_hook=False)  # no tracer_provider: none in the host
    agent = nixl_agent("decode-0")
    with kv_transfer_scope("cmpl-otel-0"):
        agent.transfer(agent.initialize_xfer("READ", [(0, 64, 0)], [(0, 64, 0)], "prefill-0"))
    assert inst.force_flush()
    provider = provider_for_shims()
    print("PROVIDER", type(provider).__name__)
    if provider is not None:
        provider.force_flush()
        provider.shutdown()
    """
)


def _receiver() -> tuple[http.server.HTTPServer, list[ExportTraceServiceRequest]]:
    got: list[ExportTraceServiceRequest] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/v1/traces":
                got.append(ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, got


def _run(env: dict[str, str]) -> str:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RAILTRACE_", "UCX_"))}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


def test_shim_builds_a_provider_from_otel_variables_and_exports() -> None:
    server, got = _receiver()
    try:
        out = _run(
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
                "OTEL_SERVICE_NAME": "vllm-decode",
                "OTEL_RESOURCE_ATTRIBUTES": "k8s.pod.name=decode-0",
            }
        )
    finally:
        server.shutdown()
        server.server_close()
    assert "PROVIDER TracerProvider" in out
    spans = [(rs, s) for req in got for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert [s.name for _, s in spans] == ["llm_d.kv_transfer"]
    resource = {a.key: a.value.string_value for a in spans[0][0].resource.attributes}
    assert resource["service.name"] == "vllm-decode" and resource["k8s.pod.name"] == "decode-0"
    attrs = {a.key: a.value.string_value for a in spans[0][1].attributes}
    assert attrs["llm_d.kv_transfer.request_id"] == "cmpl-otel-0"


def test_no_exporter_settings_no_provider() -> None:
    assert "PROVIDER NoneType" in _run({})
    assert not wants_export({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"})
    assert not wants_export({"RAILTRACE_OTEL_SETUP": "0", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"})
    assert wants_export({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x/v1/traces"})
