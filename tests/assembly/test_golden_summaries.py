"""Every `RequestFacts` and request summary of a fixed corpus, compared with a stored copy.

The scenario tests check chosen fields; this one checks every field of every request, so
that speed work on normalisation, assembly and verdicts cannot change an answer unnoticed.
The corpus: the scenario fixtures, the simulator's default scenario mix through the real
shims in every generation (judged against its own fleet, written out as Kubernetes objects
and read back), and the ingest benchmark's payload (judged against `tests/verdicts/fleet.yaml`).

A deliberate change of output regenerates the copies; review their diff like code:

    RAILTRACE_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/assembly/test_golden_summaries.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan

from railtrace.assembly import assemble
from railtrace.model import Span
from railtrace.otlp.reference import decode
from railtrace.simulator import GENERATIONS, Emitter, Processes, build_fleet, resolve, simulate
from railtrace.topology import Topology, load_paths
from railtrace.verdicts import VerdictConfig, judge
from tests.fixtures.otlp_fixtures import SinkExporter, load_spans, scenario_names
from tests.verdicts.helpers import FLEET

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_DIR = Path(__file__).with_name("golden")
UPDATE = os.environ.get("RAILTRACE_UPDATE_GOLDEN") == "1"
SIM_REQUESTS = 24
PAYLOAD_SPANS = 128  # 16 of the benchmark's 8-span requests, one export call


def _decoded(calls: list[bytes]) -> list[Span]:
    spans: list[Span] = []
    for call in calls:
        result = decode(call, "application/x-protobuf")
        assert not result.rejected, result.error_message
        spans.extend(result.spans)
    return spans


def _simulator(generation: str, folder: Path) -> tuple[list[Span], Topology]:
    scenarios = resolve(None)
    fleet = build_fleet("a3-ultra", scenarios, seed=5)
    fleet.write(folder)
    runs = simulate(fleet, scenarios, SIM_REQUESTS, seed=5)
    sink: list[ReadableSpan] = []
    procs = Processes(lambda: SinkExporter(sink, threading.Lock()), 5)
    emitter = Emitter(fleet, procs, generation, 1_790_000_000 * 10**9)
    for run in runs:
        emitter.emit(run)
    procs.flush()
    procs.shutdown()
    calls = [encode_spans(sink[i : i + 200]).SerializeToString() for i in range(0, len(sink), 200)]
    return _decoded(calls), load_paths([str(folder)])


def _payload() -> list[Span]:
    from benchmarks.common.payload import export_calls

    return _decoded(export_calls(PAYLOAD_SPANS, spans_per_call=PAYLOAD_SPANS))


def _lines(spans: list[Span], topology: Topology) -> list[str]:
    """One JSON line per request: its facts (every field) and its summary as stored."""
    config = VerdictConfig()
    out = []
    for facts in assemble(spans):
        record = {"facts": dataclasses.asdict(facts)}
        record["summary"] = judge(facts, topology, config).to_dict()
        out.append(json.dumps(record, sort_keys=True, separators=(",", ":")))
    return out


SOURCES = ["fixtures", "benchmark", *(f"simulator-{g}" for g in GENERATIONS)]


@pytest.mark.parametrize("source", SOURCES)
def test_every_field_of_every_request_is_as_stored(source: str, tmp_path: Path) -> None:
    if source == "fixtures":
        topology = load_paths([FLEET])
        lines = [line for name in scenario_names() for line in _lines(load_spans(name), topology)]
    elif source == "benchmark":
        lines = _lines(_payload(), load_paths([FLEET]))
    else:
        spans, topology = _simulator(source.removeprefix("simulator-"), tmp_path)
        lines = _lines(spans, topology)
    assert lines, f"{source}: no requests assembled"
    golden = GOLDEN_DIR / f"{source}.jsonl"
    text = "\n".join(lines) + "\n"
    if UPDATE:
        GOLDEN_DIR.mkdir(exist_ok=True)
        golden.write_text(text)
        return
    assert golden.exists(), f"{golden} is missing: run with RAILTRACE_UPDATE_GOLDEN=1 and review it"
    expected = golden.read_text().splitlines()
    assert len(lines) == len(expected), f"{source}: {len(lines)} requests, stored {len(expected)}"
    for index, (got, want) in enumerate(zip(lines, expected, strict=True)):
        if got != want:
            pytest.fail(f"{source}, request {index}, fields (now, stored): {_changed(got, want)}")


def _changed(got: str, want: str) -> dict[str, dict[str, tuple[Any, Any]]]:
    """The top-level fields of facts and summary that differ between two records."""
    now, stored = json.loads(got), json.loads(want)
    return {
        part: {
            key: (now[part].get(key), stored[part].get(key))
            for key in sorted(set(now[part]) | set(stored[part]))
            if now[part].get(key) != stored[part].get(key)
        }
        for part in ("facts", "summary")
    }
