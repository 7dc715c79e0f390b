"""The scale benchmark's traffic: the simulator's default mix captured once as export calls,
and copies of it with ids of their own, shifted in time."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from railtrace.simulator import Emitter, Processes, build_fleet, resolve, simulate

SPANS_PER_CALL = 512


class _Capture(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.lock:
            self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def capture(topo_dir: Path, base: int, seed: int) -> tuple[list[bytes], list[str], int]:
    """The base traffic as export calls of up to 512 spans, its request ids, and its length in ns."""
    scenarios = resolve(None)
    fleet = build_fleet("a3-ultra", scenarios, seed)
    fleet.write(topo_dir)
    runs = simulate(fleet, scenarios, base, seed)
    sink = _Capture()
    procs = Processes(lambda: sink, seed)
    length_ns = int((max(r.end for r in runs) + 1.0) * 1e9)
    emitter = Emitter(fleet, procs, "current", 0)
    for r in runs:
        emitter.emit(r)
    procs.flush()
    procs.shutdown()
    spans = sink.spans
    calls = [
        encode_spans(spans[i : i + SPANS_PER_CALL]).SerializeToString() for i in range(0, len(spans), 512)
    ]
    return calls, [r.request_id for r in runs], length_ns


def copy_calls(calls: list[bytes], rids: list[str], k: int, shift_ns: int) -> list[bytes]:
    """Copy k of the base calls: ids made unique to the copy, times shifted by `shift_ns`."""
    salt = ((k + 1) * 0x9E3779B97F4A7C15) & (2**64 - 1)
    tag = f"{k:08x}"
    out = []
    for raw in calls:
        req = ExportTraceServiceRequest.FromString(raw)
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    s.trace_id = (int.from_bytes(s.trace_id, "big") ^ (salt << 64)).to_bytes(16, "big")
                    s.span_id = (int.from_bytes(s.span_id, "big") ^ salt).to_bytes(8, "big")
                    if s.parent_span_id:
                        s.parent_span_id = (int.from_bytes(s.parent_span_id, "big") ^ salt).to_bytes(8, "big")
                    s.start_time_unix_nano += shift_ns
                    s.end_time_unix_nano += shift_ns
                    for e in s.events:
                        e.time_unix_nano += shift_ns
                    for kv in s.attributes:
                        v = kv.value
                        if v.HasField("string_value"):
                            v.string_value = _retag(v.string_value, rids, tag)
                        elif v.HasField("array_value"):
                            for item in v.array_value.values:
                                if item.HasField("string_value"):
                                    item.string_value = _retag(item.string_value, rids, tag)
        out.append(req.SerializeToString())
    return out


def _retag(value: str, rids: Sequence[str], tag: str) -> str:
    """Request ids (UUIDs) inside a value get the copy's tag as their first 8 hex digits."""
    if len(value) < 36 or "-" not in value:
        return value
    for rid in _rid_index(rids).get(_probe(value), ()):
        if rid in value:
            return value.replace(rid, tag + rid[8:])
    return value


_RID_INDEX: dict[int, dict[str, list[str]]] = {}


def _rid_index(rids: Sequence[str]) -> dict[str, list[str]]:
    index = _RID_INDEX.get(id(rids))
    if index is None:
        index = {}
        for rid in rids:
            index.setdefault(rid[9:13], []).append(rid)
        _RID_INDEX[id(rids)] = index
    return index


def _probe(value: str) -> str:
    """The UUID's second group, found wherever the id sits in the value."""
    at = value.find("-")
    while at >= 0:
        if at >= 8 and len(value) >= at + 28 and value[at + 5] == "-":
            return value[at + 1 : at + 5]
        at = value.find("-", at + 1)
    return ""
