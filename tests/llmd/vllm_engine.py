"""An engine that speaks vLLM's OpenAI API and traces as vLLM 0.34.0 does, for the real sidecar.

llm-d's own engine stand-in, `llm-d-inference-sim`, has no tracing at any tag (v0.10.2 imports
no OpenTelemetry package), so it cannot show what railtrace must join: vLLM's `llm_request`.
This process answers `/v1/chat/completions` and `/v1/completions` like a P/D vLLM pod behind
the sidecar and emits exactly vLLM 0.34.0's span, read from the wheel:

- one `llm_request` SERVER span per request, scope `vllm.tracing.otel` (`trace.get_tracer(__name__)`
  in vllm/tracing/otel.py `manual_instrument_otel`), started at the request's arrival;
- its parent is the W3C `traceparent` the request carried, if any
  (`TraceContextTextMapPropagator().extract`, vllm/tracing/otel.py `extract_trace_context`),
  otherwise it is a root;
- attributes of vllm/v1/engine/output_processor.py `do_tracing`: `gen_ai.request.id` is the
  external id, `chatcmpl-<first X-Request-Id>` or, for completions, `cmpl-<id>-0`
  (vllm/entrypoints/serve/engine/serving.py `_base_request_id`; chat_completion/serving.py,
  completion/serving.py); the latencies in seconds; `max_tokens`, `top_p`, `temperature`, `n`
  only when set;
- resource of `init_otel_tracer`: `vllm.instrumenting_module_name=vllm.llm_engine`,
  `vllm.process_id` (a string) and `service.name` from `OTEL_SERVICE_NAME`; no `k8s.*`;
- export over OTLP/gRPC (the default of `get_span_exporter`) through a BatchSpanProcessor.

A prefill request (`kv_transfer_params.do_remote_decode`) answers with the NIXL connector's
`kv_transfer_params` (nixl/push_scheduler.py `request_finished`); the sidecar hands them to the
decode request. Every request's headers and ids are appended to `--log` as JSON lines, so a test
sees what the sidecar sent. No prompt or completion text is logged or traced.

    python -m tests.llmd.vllm_engine --port 8200 --otlp 127.0.0.1:4317 --log engine.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# Simulated engine timings (seconds): queue, prefill, one decode step.
QUEUE_S = 0.002
PREFILL_S = 0.020
STEP_S = 0.002
PROMPT_TOKENS_PER_CHAR = 0.25


class Engine:
    """The engine's state: its tracer, NIXL engine id, side-channel address and log."""

    def __init__(self, otlp: str, log_path: str, side_port: int) -> None:
        resource = Resource.create(
            {"vllm.instrumenting_module_name": "vllm.llm_engine", "vllm.process_id": str(os.getpid())}
        )
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp, insecure=True)))
        self.tracer = self.provider.get_tracer("vllm.tracing.otel")
        self.engine_id = str(uuid.uuid4())
        self.side_port = side_port
        self.log_path = log_path
        self._lock = threading.Lock()

    def log(self, entry: dict[str, Any]) -> None:
        with self._lock, open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


def _prompt_tokens(body: dict[str, Any]) -> int:
    """A token count from the prompt's length; the text itself is never kept."""
    if "messages" in body:
        chars = sum(len(str(m.get("content", ""))) for m in body["messages"] if isinstance(m, dict))
    else:
        chars = len(str(body.get("prompt", "")))
    return max(1, int(chars * PROMPT_TOKENS_PER_CHAR))


class Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, code: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path in ("/health", "/v1/models"):
            self._reply(200, {"object": "list", "data": []})
        else:
            self._reply(404, {"error": "not found"})

    def do_POST(self) -> None:
        arrival_ns = time.time_ns()
        engine = self.server.engine
        chat = self.path == "/v1/chat/completions"
        if not chat and self.path != "/v1/completions":
            self._reply(404, {"error": "not found"})
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        except ValueError:
            self._reply(400, {"error": "invalid JSON"})
            return
        # Starlette's headers.get returns the first value: vLLM keeps the first X-Request-Id.
        ids = self.headers.get_all("x-request-id") or []
        base = ids[0] if ids else str(uuid.uuid4())
        external = f"chatcmpl-{base}" if chat else f"cmpl-{base}-0"
        carrier = {
            k.lower(): v for k, v in self.headers.items() if k.lower() in ("traceparent", "tracestate")
        }
        parent = TraceContextTextMapPropagator().extract(carrier) if carrier else None
        params = body.get("kv_transfer_params") or {}
        prefill = bool(params.get("do_remote_decode"))
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        tokens = 1 if prefill else int(max_tokens or 16)
        prompt = _prompt_tokens(body)
        time.sleep(QUEUE_S + PREFILL_S + STEP_S * (tokens - 1))
        now = time.time_ns()
        queued = QUEUE_S
        ttft = QUEUE_S + PREFILL_S
        attrs: dict[str, Any] = {
            "gen_ai.latency.time_to_first_token": ttft,
            "gen_ai.latency.e2e": (now - arrival_ns) / 1e9,
            "gen_ai.latency.time_in_queue": queued,
            "gen_ai.usage.prompt_tokens": prompt,
            "gen_ai.usage.completion_tokens": tokens,
            "gen_ai.latency.time_in_model_prefill": PREFILL_S,
            "gen_ai.latency.time_in_model_decode": STEP_S * (tokens - 1),
            "gen_ai.latency.time_in_model_inference": PREFILL_S + STEP_S * (tokens - 1),
            "gen_ai.request.id": external,
        }
        if body.get("top_p", 1.0):
            attrs["gen_ai.request.top_p"] = float(body.get("top_p", 1.0))
        if max_tokens:
            attrs["gen_ai.request.max_tokens"] = int(max_tokens)
        if body.get("temperature", 1.0):
            attrs["gen_ai.request.temperature"] = float(body.get("temperature", 1.0))
        if body.get("n", 1):
            attrs["gen_ai.request.n"] = int(body.get("n", 1))
        span = engine.tracer.start_span(
            "llm_request", context=parent, kind=trace.SpanKind.SERVER, start_time=arrival_ns
        )
        span.set_attributes(attrs)
        span.end(end_time=now)
        ctx = span.get_span_context()
        engine.log(
            {
                "path": self.path,
                "x_request_ids": ids,
                "traceparent": carrier.get("traceparent"),
                "gen_ai_request_id": external,
                "prefill": prefill,
                "kv_transfer_params_in": params,
                "trace_id": format(ctx.trace_id, "032x"),
                "span_id": format(ctx.span_id, "016x"),
            }
        )
        kv_out = None
        if prefill:
            kv_out = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": list(range(max(1, prompt // 16))),
                "remote_engine_id": engine.engine_id,
                "remote_request_id": external,
                "remote_host": "127.0.0.1",
                "remote_port": engine.side_port,
                "tp_size": 1,
            }
        usage = {"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens}
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": "x" * tokens}
        else:
            choice["text"] = "x" * tokens
        self._reply(
            200,
            {
                "id": external,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": body.get("model", ""),
                "choices": [choice],
                "usage": usage,
                "kv_transfer_params": kv_out,
            },
        )


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, engine: Engine) -> None:
        self.engine = engine
        super().__init__(("127.0.0.1", port), Handler)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--otlp", required=True, help="OTLP/gRPC endpoint, host:port")
    ap.add_argument("--log", required=True, help="JSON-lines file of what each request carried")
    ap.add_argument("--side-port", type=int, default=5600, help="the NIXL side-channel port it reports")
    args = ap.parse_args(argv)
    engine = Engine(args.otlp, args.log, args.side_port)
    server = Server(args.port, engine)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    print("ready", flush=True)
    stop.wait()
    server.shutdown()
    engine.provider.shutdown()  # flushes the batch, as vLLM's atexit hook does
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
