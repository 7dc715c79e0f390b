"""CPU time of `railtrace.assembly.assemble` alone on simulated requests, no store, no verdicts.

    .venv/bin/python -m benchmarks.assembly.pure [--requests 400] [--repeat 5]

Each generation's spans (the simulator's default mix, through the official OTLP encoder and the
service's decoder) are assembled `--repeat` times from fresh copies; the fastest and the median
CPU time are printed. To compare with older code, run it with that code's `api`/`tracing` copied
as `railtrace`/`railtrace_tracing` into a folder put first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import copy
import threading
import time

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from railtrace.assembly import assemble
from railtrace.otlp.reference import decode
from railtrace.simulator import Emitter, Processes, build_fleet, resolve, simulate
from tests.fixtures.otlp_fixtures import SinkExporter


def spans_of(generation: str, requests: int) -> list:
    scenarios = resolve(None)
    fleet = build_fleet("a3-ultra", scenarios, seed=5)
    sink: list = []
    procs = Processes(lambda: SinkExporter(sink, threading.Lock()), 5)
    emitter = Emitter(fleet, procs, generation, 1_790_000_000 * 10**9)
    for run in simulate(fleet, scenarios, requests, seed=5):
        emitter.emit(run)
    procs.flush()
    procs.shutdown()
    out: list = []
    for i in range(0, len(sink), 200):
        out += decode(encode_spans(sink[i : i + 200]).SerializeToString(), "application/x-protobuf").spans
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for generation in ("v0.9", "current"):
        spans = spans_of(generation, args.requests)
        times = []
        for _ in range(args.repeat):
            fresh = copy.deepcopy(spans)
            started = time.process_time()
            facts = assemble(fresh)
            times.append(time.process_time() - started)
        times.sort()
        print(
            f"{generation}: {len(spans)} spans, {len(facts)} requests, CPU s fastest {times[0]:.3f} "
            f"median {times[len(times) // 2]:.3f}"
        )


if __name__ == "__main__":
    main()
