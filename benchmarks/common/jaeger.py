"""Jaeger v2 as a peer in the benchmarks: the binary scripts/build-jaeger builds (v1.75.0 of the
Go module, Jaeger v2's all-in-one), run as its own process on free 127.0.0.1 ports with one of
its stores, and how to tell when it holds what it acknowledged.

Configurations (keys read in the module's source, github.com/jaegertracing/jaeger v1.75.0:
cmd/jaeger/internal/all-in-one.yaml, cmd/jaeger/config-badger.yaml,
internal/storage/v1/badger/config.go, cmd/query/app/flags.go):

- `memory`: the all-in-one default: OTLP receiver → `batch` processor → `jaeger_storage_exporter`
  into the `memory` backend (`max_traces: 100000`).
- `badger`: the same pipeline into Badger on disk (`ephemeral: false`, `directories`), with
  Badger's default `consistency: false` (SyncWrites off: "Performance over durability").
- `badger-sync`: Badger with `consistency: true` (every write synced) and no `batch` processor,
  so the OTLP answer waits for the store's write: the only Jaeger set-up in which what the
  client was answered for is on disk, as with railtrace.

Spans stored are counted from Jaeger's own telemetry (`otelcol_exporter_sent_spans` of the
storage exporter, Prometheus on a free port).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.common.harness import free_port

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "build-jaeger"
RELEASE = "v1.75.0"
STORES = ("memory", "badger", "badger-sync")
SENT = re.compile(
    r'^otelcol_exporter_sent_spans(?:_total)?\{[^}]*exporter="jaeger_storage_exporter"[^}]*\} (\S+)$', re.M
)


class JaegerUnavailable(RuntimeError):
    """No Jaeger binary (no Go to build it with, or the build failed): the peer is skipped."""


def jaeger_binary() -> Path:
    """The binary scripts/build-jaeger prints last (building it if needed, many minutes cold)."""
    if not shutil.which("go") and not list((Path.home() / ".cache/railtrace/jaeger").glob("*/jaeger")):
        raise JaegerUnavailable("Go is not installed, so Jaeger cannot be built (scripts/build-jaeger)")
    done = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3600, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise JaegerUnavailable(f"scripts/build-jaeger failed ({done.returncode}): {done.stderr[-1500:]}")
    return Path(lines[-1])


def config(store: str, data_dir: Path, ports: dict[str, int]) -> dict[str, Any]:
    """Jaeger v2's YAML configuration for one store, every listener on 127.0.0.1."""
    if store == "memory":
        backend: dict[str, Any] = {"memory": {"max_traces": 100_000}}
    elif store in ("badger", "badger-sync"):
        badger: dict[str, Any] = {
            "directories": {"keys": str(data_dir / "keys"), "values": str(data_dir / "values")},
            "ephemeral": False,
            "ttl": {"spans": "48h"},
        }
        if store == "badger-sync":
            badger["consistency"] = True
        backend = {"badger": badger}
    else:
        raise ValueError(f"unknown Jaeger store {store!r}; one of {STORES}")
    host = "127.0.0.1"
    pipeline: dict[str, Any] = {"receivers": ["otlp"], "exporters": ["jaeger_storage_exporter"]}
    if store != "badger-sync":
        pipeline["processors"] = ["batch"]
    return {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
            "pipelines": {"traces": pipeline},
            "telemetry": {
                "resource": {"service.name": "jaeger"},
                "metrics": {
                    "level": "detailed",
                    "readers": [
                        {"pull": {"exporter": {"prometheus": {"host": host, "port": ports["metrics"]}}}}
                    ],
                },
                "logs": {"level": "warn"},
            },
        },
        "extensions": {
            "healthcheckv2": {"use_v2": True, "http": {"endpoint": f"{host}:{ports['health']}"}},
            "jaeger_query": {
                "storage": {"traces": "store"},
                "enable_tracing": False,  # its own spans would be one more service in the answers
                "http": {"endpoint": f"{host}:{ports['query']}"},
                "grpc": {"endpoint": f"{host}:{ports['query_grpc']}"},
            },
            "jaeger_storage": {"backends": {"store": backend}},
        },
        "receivers": {
            "otlp": {
                "protocols": {
                    "grpc": {"endpoint": f"{host}:{ports['otlp_grpc']}"},
                    "http": {"endpoint": f"{host}:{ports['otlp_http']}"},
                }
            }
        },
        "processors": {"batch": {}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "store"}},
    }


class Jaeger:
    """`jaeger --config …` in its own process on a throwaway directory until `stop()`."""

    def __init__(self, binary: Path, store: str = "memory") -> None:
        self.store = store
        self.workdir = Path(tempfile.mkdtemp(prefix=f"jaeger-{store}-"))
        names = ("otlp_grpc", "otlp_http", "query", "query_grpc", "health", "metrics")
        self.ports = {n: free_port() for n in names}
        path = self.workdir / "config.yaml"
        path.write_text(yaml.safe_dump(config(store, self.workdir / "data", self.ports)))
        self.log = open(self.workdir / "jaeger.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [str(binary), "--config", str(path)], cwd=self.workdir, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.otlp_http = f"http://127.0.0.1:{self.ports['otlp_http']}"
        self.otlp_grpc = f"127.0.0.1:{self.ports['otlp_grpc']}"
        self.query = f"http://127.0.0.1:{self.ports['query']}"
        deadline = time.monotonic() + 60
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.workdir / "jaeger.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"Jaeger ({store}) did not start:\n{tail}")
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            health = httpx.get(f"http://127.0.0.1:{self.ports['health']}/status", timeout=1)
            query = httpx.get(self.query + "/api/services", timeout=1)
        except httpx.HTTPError:
            return False
        return health.status_code == 200 and query.status_code == 200

    def stored_spans(self) -> int:
        """Spans the storage exporter has written to the store (its own counter)."""
        text = httpx.get(f"http://127.0.0.1:{self.ports['metrics']}/metrics", timeout=10).text
        return int(sum(float(v) for v in SENT.findall(text)))

    def wait_stored(self, n: int, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while self.stored_spans() < n:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Jaeger ({self.store}) stored {self.stored_spans()} of {n} spans")
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
