"""A bound on the traces and spans assembled as one stitched request. Traces linked pairwise by
request ids (trace i carries ids i and i+1) form one group however long the chain; past
`max_group_traces` / `max_group_spans` the group is assembled in parts, each request id's
first traces kept together (earliest id first), each request noting the split in its coverage.
On SQLite and PostgreSQL."""

from __future__ import annotations

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from railtrace.scheduling.grouping import key_blocks, split_group
from railtrace.server.runner import Service
from tests.reliability.reliability_helpers import post
from tests.service_helpers import settings_for, wait_for

T0 = 1_790_000_000 * 10**9
CHAIN = 120
SPANS = 4  # per trace


def chain(n: int, spans: int, first: int = 0) -> bytes:
    """Traces first..n-1; trace i's spans carry request ids chain-i and chain-(i+1) in turn."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "chain"
    ss = rs.scope_spans.add()
    for i in range(first, n):
        for j in range(spans):
            s = ss.spans.add()
            s.trace_id = (0xC0000000 + i).to_bytes(16, "big")
            s.span_id = (i * 100 + j + 1).to_bytes(8, "big")
            s.name = "llm_request"
            s.start_time_unix_nano = T0 + i * 10**6 + j
            s.end_time_unix_nano = T0 + i * 10**6 + j + 500
            a = s.attributes.add(key="gen_ai.request.id")
            a.value.string_value = f"chain-request-{i + j % 2:04d}"
    return req.SerializeToString()


def test_split_is_by_id_order_within_both_bounds() -> None:
    g = {f"t{i:03d}" for i in range(10)}
    sizes = dict.fromkeys(g, 3) | {"t004": 50}
    assert split_group(g, sizes, 32, 100) == [sorted(g)]
    assert split_group(g, sizes, 4, 10_000) == [
        ["t000", "t001", "t002", "t003"],
        ["t004", "t005", "t006", "t007"],
        ["t008", "t009"],
    ]
    # At most 10 spans: a trace bigger than the bound is a part of its own.
    assert split_group(g, sizes, 32, 10) == [
        ["t000", "t001", "t002"],
        ["t003"],
        ["t004"],
        ["t005", "t006", "t007"],
        ["t008", "t009"],
    ]


def test_a_request_that_came_first_stays_whole_in_a_split_group() -> None:
    """A victim's three traces (ids v1..v3) and a chain of 40 junk traces linked to it by the
    victim's id, their trace ids sorting among the victim's: in id order the victim was cut
    apart; by request id, earliest first, its traces stay one part."""
    victim = ["b-victim-1", "m-victim-2", "x-victim-3"]
    junk = [f"{c}-junk-{i:02d}" for i, c in zip(range(40), "acdfhkn" * 6, strict=False)]
    group = {*victim, *junk}
    sizes = dict.fromkeys(group, 4)
    pairs = [("victim-id", t, 1_000 + n) for n, t in enumerate(victim)]
    pairs += [("victim-id", junk[0], 2_000)]  # the junk chain's first trace carries the victim's id
    pairs += [(f"chain-{i}", t, 2_000 + i) for i, t in enumerate(junk)]
    pairs += [(f"chain-{i + 1}", t, 2_000 + i) for i, t in enumerate(junk)]
    pairs.sort(key=lambda p: (p[0], p[2]))  # as the store gives them: each key's traces by arrival
    by_id = split_group(group, sizes, 8, 10_000)
    assert not any(set(victim) <= set(p) for p in by_id)  # the old way: the victim cut apart
    parts = split_group(group, sizes, 8, 10_000, key_blocks(group, pairs))
    assert parts[0][:3] == victim and len(parts[0]) <= 8
    assert sorted(t for p in parts for t in p) == sorted(group) and all(len(p) <= 8 for p in parts)
    # Traces arriving later change only the last parts.
    more = [f"z-junk-{i}" for i in range(5)]
    grown = group | set(more)
    pairs2 = pairs + [(f"chain-{40 + i}", t, 9_000 + i) for i, t in enumerate(more)]
    pairs2 += [("chain-40", junk[-1], 2_039)]
    pairs2.sort(key=lambda p: (p[0], p[2]))
    again = split_group(grown, dict.fromkeys(grown, 4), 8, 10_000, key_blocks(grown, pairs2))
    assert again[: len(parts) - 1] == parts[:-1]


@pytest.mark.parametrize(
    ("bounds", "halves"),
    [
        ({"max_group_traces": 8}, False),
        ({"max_group_spans": 8 * SPANS}, False),
        ({"max_group_traces": 8}, True),
    ],
)
def test_a_chain_of_traces_is_assembled_in_bounded_parts(
    db_url: str, bounds: dict[str, int], halves: bool
) -> None:
    """With `halves`, the first 60 traces are assembled and stored before the rest arrive and
    link to them: every part of the re-assembled group is stored, none deletes another's."""
    settings = settings_for(db_url, assembly_processes=0, **bounds)
    with Service(settings) as svc, httpx.Client(base_url=svc.http_url, timeout=60) as client:
        if halves:
            assert post(client, chain(CHAIN // 2, SPANS)).status_code == 200
            wait_for(
                lambda: len(client.get("/api/v1/requests").json()["items"]) >= CHAIN // 16,
                timeout=60,
                what="the first half assembled",
            )
            assert post(client, chain(CHAIN, SPANS, CHAIN // 2)).status_code == 200
        else:
            assert post(client, chain(CHAIN, SPANS)).status_code == 200

        def parts_assembled() -> list[dict[str, object]] | None:
            items = client.get("/api/v1/requests", params={"limit": 1000}).json()["items"]
            return items if len(items) >= CHAIN // 8 else None

        # One request per part (the join rules then judge the traces of each part).
        items = wait_for(parts_assembled, timeout=60, what="each part of the chain assembled")
        if halves:
            # The second half's group reaches one trace back (trace 59 shares an id with trace 60):
            # 61 traces in 8 parts, stored beside the first half's 8 parts, none deleting another.
            items = wait_for(
                lambda: (
                    (i := client.get("/api/v1/requests", params={"limit": 1000}).json()["items"])
                    and len(i) >= 16
                    and i
                ),
                timeout=60,
                what="the second half assembled",
            )
            assert len(items) == 16
            notes = sorted(
                {n.split(",")[0] for r in items for n in r["coverage"]["rejected"] if "linked" in n}
            )
            assert notes == [
                "traces linked by request ids formed one group of 60 traces and 240 spans",
                "traces linked by request ids formed one group of 61 traces and 244 spans",
            ]
            assert all(len(r["trace_ids"]) <= 8 for r in items)
            return
    assert len(items) == CHAIN // 8
    parts = [{f"{0xC0000000 + i:032x}" for i in range(k, k + 8)} for k in range(0, CHAIN, 8)]
    for r in items:
        traces = set(r.get("trace_ids") or [r["trace_id"]])  # type: ignore[call-overload]
        assert any(traces <= p for p in parts), traces
        notes = [n for n in r["coverage"]["rejected"] if "max_group_traces" in n]  # type: ignore[index]
        assert notes == [
            f"traces linked by request ids formed one group of {CHAIN} traces and {CHAIN * SPANS} spans, "
            f"assembled in {CHAIN // 8} parts, each request id's first traces together: at most "
            f"{settings.max_group_traces} traces and {settings.max_group_spans} spans are one request "
            "(max_group_traces, max_group_spans)"
        ]
