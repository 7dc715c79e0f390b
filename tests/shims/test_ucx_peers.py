"""Per-peer evidence from the UCX log: the endpoint configuration first printed while NIXL
connected to a peer is that peer's; overlapping connections and missing tables are not guessed."""

from __future__ import annotations

from railtrace_tracing.ucx.parser import UcxLog, UcxLogParser

P = "[1700000000.0] [host:9:0] "
SHM_EP = P + "    ucp_worker.c:1997 UCX  INFO    dec intra-node cfg#1 rma_am(tcp/lo)  am(tcp/lo cma/memory)"
TCP_EP = P + "    ucp_worker.c:1997 UCX  INFO    dec intra-node cfg#2 rma_am(tcp/lo)  am(tcp/lo)"
SHM_TABLE = [
    P + "  | dec intra-node cfg#1 |",
    P + "  | remote memory read by ucp_get*(multi) into host memory from host |",
    P + "  | 0..inf | zero-copy | cma/memory |",
]
TCP_TABLE = [
    P + "  | dec intra-node cfg#2 |",
    P + "  | remote memory read by ucp_get*(multi) into host memory from host |",
    P + "  | 0..inf | software emulation | tcp/lo |",
]


def parse(lines: list[str]) -> tuple[UcxLog, list[int]]:
    """Feed lines with their byte offsets, as the capture does; returns the offsets too."""
    parser, offsets, pos = UcxLogParser(), [], 0
    for line in lines:
        offsets.append(pos)
        parser.offset = pos
        parser.feed(line)
        pos += len(line.encode()) + 1
    return parser.finish(), [*offsets, pos]


def test_each_peer_gets_the_endpoint_printed_while_it_connected() -> None:
    log, off = parse([SHM_EP, TCP_EP, *SHM_TABLE, *TCP_TABLE])
    a = log.select("dec", "read", windows=[(off[0], off[1])], peer="prefill-a")
    b = log.select("dec", "read", windows=[(off[1], off[2])], peer="prefill-b")
    assert a is not None and a.transport.value == "shm" and a.peer == "prefill-a"
    assert b is not None and b.transport.value == "tcp" and b.peer == "prefill-b"
    assert "(endpoint to peer prefill-b)" in b.evidence


def test_known_endpoint_without_its_table_waits_instead_of_borrowing_another() -> None:
    log, off = parse([SHM_EP, TCP_EP, *SHM_TABLE])  # cfg#2's table not printed yet
    assert log.select("dec", "read", windows=[(off[1], off[2])], peer="prefill-b") is None


def test_overlapping_connections_and_unseen_peers_fall_back_to_the_process() -> None:
    log, off = parse([SHM_EP, TCP_EP, *SHM_TABLE, *TCP_TABLE])
    both = (off[0], off[2])  # two handshakes at once: both endpoints in both windows
    ev = log.select("dec", "read", windows=[both], peer="prefill-a", exclude=[both])
    assert ev is not None and ev.peer == "" and "no UCX endpoint seen for peer prefill-a" in ev.warnings
    late = log.select("dec", "read", windows=[(off[-1], off[-1] + 10)], peer="prefill-c")
    assert late is not None and late.peer == "" and late.warnings
