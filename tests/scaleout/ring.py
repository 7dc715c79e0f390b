"""The OpenTelemetry Collector `loadbalancing` exporter's traceID routing, for tests and
benchmarks that stand in for the collector tier.

Same ring as the exporter (exporter/loadbalancingexporter, `routing_key: traceID`): 36,000
positions, 100 points per endpoint at crc32(endpoint + one byte i) mod 36,000 (first
endpoint wins a taken position), and a trace goes to the first point at or after
crc32(trace id bytes) mod 36,000, wrapping to the start. Written from the exporter's
documented behaviour; only the routing matters here, not the Go code.
"""

from __future__ import annotations

import bisect
import zlib

MAX_POSITIONS = 36_000
POINTS_PER_ENDPOINT = 100


class TraceIdRing:
    """Which endpoint receives a trace, given the endpoints the collector resolved."""

    def __init__(self, endpoints: list[str]) -> None:
        taken: dict[int, str] = {}
        for endpoint in endpoints:
            for i in range(POINTS_PER_ENDPOINT):
                pos = zlib.crc32(endpoint.encode() + bytes([i & 0xFF])) % MAX_POSITIONS
                taken.setdefault(pos, endpoint)
        self._positions = sorted(taken)
        self._endpoints = [taken[p] for p in self._positions]

    def endpoint_for(self, trace_id: bytes) -> str:
        pos = zlib.crc32(trace_id) % MAX_POSITIONS
        i = bisect.bisect_left(self._positions, pos)
        return self._endpoints[i if i < len(self._positions) else 0]
