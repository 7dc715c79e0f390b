"""The modelled P/D fleet that drives the real shims for `railtrace demo` and load tests.

    fleet = build_fleet("a3-ultra", resolve(None), seed=7)   # Kubernetes objects: fleet.write(dir)
    runs = simulate(fleet, resolve(None), 400, seed=7)        # timestamps and ground truth
    emitter = Emitter(fleet, Processes(otlp_http_exporter(url), seed=7), "current", base_ns)
    for r in runs: emitter.emit(r)                            # spans through the shims and OTLP

See docs/simulator.md for the timing model, the scenarios and the fleet shapes.
"""

from railtrace.simulator.emit import GENERATIONS, Emitter, Processes, otlp_grpc_exporter, otlp_http_exporter
from railtrace.simulator.engine import SimRequest, simulate
from railtrace.simulator.fleet import SHAPES, Fleet, build_fleet
from railtrace.simulator.scenarios import SCENARIOS, Scenario, resolve
from railtrace.simulator.timing import ModelShape, TimingModel

__all__ = [
    "GENERATIONS",
    "SCENARIOS",
    "SHAPES",
    "Emitter",
    "Fleet",
    "ModelShape",
    "Processes",
    "Scenario",
    "SimRequest",
    "TimingModel",
    "build_fleet",
    "otlp_grpc_exporter",
    "otlp_http_exporter",
    "resolve",
    "simulate",
]
