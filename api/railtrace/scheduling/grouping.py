"""Which traces make one request, as far as scheduling needs to know: the traces that share a
request key (hops of one request that arrived in separate traces) are loaded and assembled
together. Assembly then decides, span by span, which of them really join
(`railtrace.assembly.stitch`, through the same `UnionFind`, and the join rules).
"""

from __future__ import annotations

from collections.abc import Mapping

from railtrace.assembly.stitch import UnionFind

MAX_KEY_FANOUT = 32  # a "key" shared by more traces than this is not one request's id


def group_traces(
    ready: dict[str, int], keys: dict[str, set[str]], pairs: list[tuple[str, str]]
) -> list[set[str]]:
    """Groups of traces that share a request key (union-find), each holding a ready trace.

    `pairs` lists each key's traces in order of first arrival. A key held by more than
    `MAX_KEY_FANOUT` traces is not one request's alone (junk, or a client reusing an id): it
    joins only the traces that came first, so traces sent later with the id cannot undo a
    stitch already made; assembly's join rules then judge those (`railtrace.assembly.joins`).
    """
    holders: dict[str, dict[str, None]] = {}  # ordered sets
    for key, tid in pairs:
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


def excess_notes(keys: dict[str, set[str]], pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Per trace that got stitched through a key held by too many traces, the note for its
    request's evidence (`coverage.rejected`): how many traces with that key were left out."""
    holders: dict[str, list[str]] = {}
    for key, tid in pairs:
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


def split_group(
    group: set[str], sizes: Mapping[str, int], max_traces: int, max_spans: int
) -> list[list[str]]:
    """`group`'s traces in id order, cut into consecutive parts of at most `max_traces` traces
    and `max_spans` spans (`sizes`: spans per trace; a trace bigger than `max_spans` is a part
    of its own). One part when the group is within both bounds.

    Why: traces linked pairwise by ids form one group however long the chain (120 traces of
    10,000 spans were assembled as one 1.2M-span request: 30 s and 1.26 GB). Parts by id order
    are the same however the traces arrived, so a group re-assembled is split the same way.
    """
    parts: list[list[str]] = [[]]
    spans = 0
    for t in sorted(group):
        n = sizes.get(t, 0)
        if parts[-1] and (len(parts[-1]) >= max_traces or spans + n > max_spans):
            parts.append([])
            spans = 0
        parts[-1].append(t)
        spans += n
    return parts


def split_note(traces: int, spans: int, parts: int, max_traces: int, max_spans: int) -> str:
    """The coverage note (`coverage.rejected`) of each part of a split group."""
    return (
        f"traces linked by request ids formed one group of {traces} traces and {spans} spans, assembled "
        f"in {parts} parts by trace id: at most {max_traces} traces and {max_spans} spans are one "
        "request (max_group_traces, max_group_spans)"
    )
