"""Which traces make one request, as far as scheduling needs to know: the traces that share a
request key (hops of one request that arrived in separate traces) are loaded and assembled
together. Assembly then decides, span by span, which of them really join
(`railtrace.assembly.stitch`, through the same `UnionFind`, and the join rules).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from railtrace.assembly.stitch import UnionFind
from railtrace.model import KeyHolder

MAX_KEY_FANOUT = 32  # a "key" shared by more traces than this is not one request's id


def group_traces(
    ready: dict[str, int], keys: dict[str, set[str]], pairs: Sequence[KeyHolder]
) -> list[set[str]]:
    """Groups of traces that share a request key (union-find), each holding a ready trace.

    `pairs` lists each key's traces in order of first arrival. A key held by more than
    `MAX_KEY_FANOUT` traces is not one request's alone (junk, or a client reusing an id): it
    joins only the traces that came first, so traces sent later with the id cannot undo a
    stitch already made; assembly's join rules then judge those (`railtrace.assembly.joins`).
    """
    holders: dict[str, dict[str, None]] = {}  # ordered sets
    for key, tid, _first in pairs:
        holders.setdefault(key, {})[tid] = None
    for tid, ks in keys.items():
        for k in ks:
            holders.setdefault(k, {}).setdefault(tid, None)
    traces = UnionFind()
    for t in ready:
        traces.find(t)
    for tids in holders.values():
        first, *rest = sorted(list(tids)[:MAX_KEY_FANOUT])
        for t in rest:
            traces.union(first, t)
    groups: dict[str, set[str]] = {}
    for t in list(traces.parent):
        groups.setdefault(traces.find(t), set()).add(t)
    return [g for g in groups.values() if g & ready.keys()]


def excess_notes(keys: dict[str, set[str]], pairs: Sequence[KeyHolder]) -> dict[str, str]:
    """Per trace that got stitched through a key held by too many traces, the note for its
    request's evidence (`coverage.rejected`): how many traces with that key were left out."""
    holders: dict[str, list[str]] = {}
    for key, tid, _first in pairs:
        holders.setdefault(key, []).append(tid)
    notes: dict[str, str] = {}
    for key, tids in holders.items():
        if len(tids) > MAX_KEY_FANOUT:
            note = (
                f"{len(tids) - MAX_KEY_FANOUT} later traces carrying request id {key} not considered: "
                f"at most {MAX_KEY_FANOUT} traces share one id, the first to arrive"
            )
            for tid in tids[:MAX_KEY_FANOUT]:
                notes.setdefault(tid, note)
    return notes


def key_blocks(group: set[str], pairs: Sequence[KeyHolder]) -> list[list[str]]:
    """The traces of `group` that each request key links (its first `MAX_KEY_FANOUT` holders,
    in order of arrival), ordered by when each key's first trace arrived: the units a split
    keeps whole. `pairs` as `Store.traces_for_keys` gives them (each key's traces by arrival)."""
    holders: dict[str, list[str]] = {}
    first_seen: dict[str, int] = {}
    last = 2**63
    for key, tid, first in pairs:
        if tid not in group:
            continue
        members = holders.setdefault(key, [])
        if len(members) < MAX_KEY_FANOUT:
            members.append(tid)
            first_seen.setdefault(key, last if first is None else first)
    order = sorted(holders, key=lambda k: (first_seen[k], k))
    return [holders[k] for k in order]


def fits(group: set[str], sizes: Mapping[str, int], max_traces: int, max_spans: int) -> bool:
    """Is `group` within both bounds (one request, no split)?"""
    return len(group) <= max_traces and sum(sizes.get(t, 0) for t in group) <= max_spans


def split_group(
    group: set[str],
    sizes: Mapping[str, int],
    max_traces: int,
    max_spans: int,
    blocks: Sequence[Sequence[str]] = (),
) -> list[list[str]]:
    """`group`'s traces cut into consecutive parts of at most `max_traces` traces and
    `max_spans` spans (`sizes`: spans per trace; a trace bigger than `max_spans` is a part of
    its own). One part, in id order, when the group is within both bounds.

    Why: traces linked pairwise by ids form one group however long the chain (120 traces of
    10,000 spans were assembled as one 1.2M-span request: 30 s and 1.26 GB). The parts follow
    `blocks` (`key_blocks`: the traces each request id links, earliest key first), each block's
    traces not yet placed kept together in one part where they fit; traces no block names
    follow in id order. So the traces of a request that arrived before a chain of junk traces
    linked to it stay one request, and traces arriving later change only the last parts: a
    group re-assembled is split the same way up to where it grew.
    """
    if fits(group, sizes, max_traces, max_spans):
        return [sorted(group)]
    parts: list[list[str]] = [[]]
    count = {"spans": 0}
    placed: set[str] = set()

    def place(unit: list[str]) -> None:
        n = sum(sizes.get(t, 0) for t in unit)
        if len(unit) > 1 and (len(unit) > max_traces or n > max_spans):
            for t in unit:  # a unit that fits no part: its traces one by one
                place([t])
            return
        current = parts[-1]
        if current and (len(current) + len(unit) > max_traces or count["spans"] + n > max_spans):
            parts.append([])
            count["spans"] = 0
        parts[-1].extend(unit)
        count["spans"] += n

    for block in [*blocks, *([t] for t in sorted(group))]:
        unit = [t for t in block if t in group and t not in placed]
        placed.update(unit)
        if unit:
            place(unit)
    return parts


def split_note(traces: int, spans: int, parts: int, max_traces: int, max_spans: int) -> str:
    """The coverage note (`coverage.rejected`) of each part of a split group."""
    return (
        f"traces linked by request ids formed one group of {traces} traces and {spans} spans, assembled "
        f"in {parts} parts, each request id's first traces together: at most {max_traces} traces and "
        f"{max_spans} spans are one request (max_group_traces, max_group_spans)"
    )
