"""`railtrace` command line. The parser lives here; each subcommand's work lives with its part.

Subcommand implementations are imported lazily so that `railtrace ucx-evidence` on an
operator's laptop does not pay for the service's imports.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> "module:function"; the function takes the parsed namespace, returns an exit code.
HANDLERS = {
    "serve": "railtrace.server.runner:serve_command",
    "demo": "railtrace.demo:demo_command",
    "topology": "railtrace.topology.cli:topology_command",
    "ucx-evidence": "railtrace_tracing.ucx.cli:ucx_evidence_command",
    "contract": "railtrace.contract.cli:contract_command",
}


def _env_default(name: str) -> str:
    return f"(env RAILTRACE_{name.upper().replace('-', '_')})"


def assembly_process_arg(value: str) -> int | str:
    """`auto` or a whole number from 0 to the settings' bound, for `--assembly-processes`."""
    from railtrace.settings import MAX_ASSEMBLY_PROCESSES

    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_ASSEMBLY_PROCESSES:
        raise argparse.ArgumentTypeError(
            f"expected auto or a number from 0 to {MAX_ASSEMBLY_PROCESSES}, got {value!r}"
        )
    return n


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="railtrace",
        description="Topology-aware tracing for llm-d prefill/decode serving.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    serve = sub.add_parser("serve", help="run the correlator: OTLP receivers, REST API, /metrics")
    serve.add_argument("--db", help=f"SQLAlchemy URL; default SQLite ./railtrace.db {_env_default('db')}")
    serve.add_argument(
        "--topology",
        action="append",
        metavar="PATH",
        help="topology file or folder (repeatable), or `k8s` for the live cluster "
        + _env_default("topology"),
    )
    serve.add_argument("--host", help="listen address, default 127.0.0.1 " + _env_default("host"))
    serve.add_argument(
        "--port", type=int, help="HTTP port (OTLP/HTTP + API), default 4318 " + _env_default("port")
    )
    serve.add_argument(
        "--grpc-port", type=int, help="OTLP/gRPC port, default 4317 " + _env_default("grpc_port")
    )
    serve.add_argument(
        "--quiet-period", type=float, help="seconds after a request's last span before assembly"
    )
    serve.add_argument(
        "--assembly-processes",
        type=assembly_process_arg,
        metavar="N|auto",
        help="assemble requests in N child processes, on other cores; 0: a thread; default auto:"
        " 2 where 2 or more CPUs are usable, else a thread " + _env_default("assembly_processes"),
    )
    serve.add_argument("--retention-hours", type=float, help="delete requests older than this (0 keeps all)")
    serve.add_argument(
        "--ingest-token", help="bearer token OTLP exporters must send " + _env_default("ingest_token")
    )
    serve.add_argument("--api-token", help="bearer token for the query API " + _env_default("api_token"))
    serve.add_argument(
        "--tls-cert", metavar="PEM", help="TLS certificate for both listeners " + _env_default("tls_cert")
    )
    serve.add_argument("--tls-key", metavar="PEM", help="TLS private key " + _env_default("tls_key"))
    serve.add_argument(
        "--cors-origin", action="append", metavar="ORIGIN", help="allow CORS from ORIGIN (repeatable)"
    )
    serve.add_argument(
        "--trusted-proxy",
        action="append",
        metavar="CIDR",
        help="a proxy (e.g. an OTel collector) whose X-Forwarded-For names the real OTLP sender (repeatable)",
    )
    serve.add_argument(
        "--trusted-collector",
        action="append",
        metavar="CIDR",
        help="an OTel collector whose k8s.pod.name / k8s.pod.ip (k8sattributes) are believed (repeatable;"
        " default: loopback, which listing any replaces)",
    )
    serve.add_argument(
        "--prometheus-url",
        metavar="URL",
        help="Prometheus scraping the EPP and vLLM, to estimate the share of traffic that is traced "
        + _env_default("prometheus_url"),
    )

    demo = sub.add_parser("demo", help="run a simulated P/D fleet with injected faults end to end")
    demo.add_argument("--requests", type=int, default=400, help="requests to simulate (default 400)")
    demo.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    demo.add_argument("--scenario", action="append", help="scenario name (repeatable); default: all")
    demo.add_argument("--shape", default="a3-ultra", help="fleet shape: a3-ultra (default), a4, a4x")
    demo.add_argument(
        "--topology-source",
        choices=("dra", "collected"),
        default="dra",
        help="dra: Nodes, ResourceSlices, claims (default); collected: `topology collect` YAML plus Pods",
    )
    demo.add_argument(
        "--generation",
        default="current",
        help="llm-d span names: current (router HEAD), v0.10, v0.9, v0.8, or all (each in turn)",
    )
    demo.add_argument(
        "--recipe",
        default="full",
        help="what the deployment traces: full (EPP, sidecar, both engines), decode_only (llm-d's guide), "
        "or all (each in turn)",
    )
    demo.add_argument(
        "--resources",
        default="collector",
        help="collector (the production collector adds k8s.* to every process) or emitted (resources as "
        "the code emits them; pods found by their address)",
    )
    demo.add_argument("--db", help="database URL (default: a fresh SQLite file in a temp folder)")
    demo.add_argument("--port", type=int, default=0, help="HTTP port (default: a free port)")
    demo.add_argument("--grpc-port", type=int, default=0, help="gRPC port (default: a free port)")
    after = demo.add_mutually_exclusive_group()
    after.add_argument(
        "--keep-serving",
        action="store_true",
        help="leave the service and its web UI running until Ctrl-C (the default)",
    )
    after.add_argument(
        "--exit",
        action="store_true",
        help="print the report and stop the service (for scripts); the exit code says whether "
        "every request was assembled",
    )
    demo.add_argument("--json", action="store_true", help="print the report as JSON")

    topo = sub.add_parser("topology", help="inspect the topology model")
    topo_sub = topo.add_subparsers(dest="topology_command", metavar="SUBCOMMAND")
    topo_sub.required = True
    show = topo_sub.add_parser("show", help="print the model built from topology inputs")
    show.add_argument("paths", nargs="+", metavar="PATH")
    show.add_argument("--json", action="store_true", help="print the documented JSON shape")
    collect = topo_sub.add_parser(
        "collect", help="write this node's topology YAML from sysfs (PCI, RDMA devices, netdevs, GPUs)"
    )
    collect.add_argument("--sysfs-root", default="/", metavar="DIR", help="read DIR/sys (default: /)")
    collect.add_argument("--node", metavar="NAME", help="node name (default: $NODE_NAME, else the hostname)")
    collect.add_argument("--output", "-o", metavar="FILE", help="write the YAML to FILE (default: stdout)")
    collect.add_argument(
        "--configmap",
        metavar="NAMESPACE/NAME",
        help="also store the YAML as key <node>.yaml of this ConfigMap (the service reads it as a folder)",
    )
    collect.add_argument("--kubeconfig", metavar="FILE", help="for --configmap outside a cluster")
    collect.add_argument(
        "--interval",
        type=float,
        default=0,
        metavar="SECONDS",
        help="collect again every SECONDS (VFs come and go); 0 = once (default)",
    )
    smi = collect.add_mutually_exclusive_group()
    smi.add_argument("--topo-matrix", metavar="FILE", help="embed this recorded `nvidia-smi topo -m` output")
    smi.add_argument(
        "--no-nvidia-smi",
        action="store_true",
        help="do not run `nvidia-smi topo -m` (it is run only when --sysfs-root is /)",
    )

    ucx = sub.add_parser("ucx-evidence", help="which transport and device UCX used, from its logs")
    ucx.add_argument("paths", nargs="+", metavar="LOG", help="UCX log files ('-' reads stdin)")
    ucx.add_argument("--json", action="store_true")

    contract = sub.add_parser("contract", help="audit the topology contract per pod, node, pool, fleet")
    contract.add_argument("--topology", action="append", metavar="PATH", default=[])
    contract.add_argument("--db", help="database URL with traffic to judge verified/consumed")
    contract.add_argument("--json", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module_name, func_name = HANDLERS[args.command].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:  # an incomplete install
        print(
            f"railtrace {args.command}: cannot start, {exc}; reinstall railtrace (pip install -e ./api)",
            file=sys.stderr,
        )
        return 2
    try:
        return int(getattr(module, func_name)(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
