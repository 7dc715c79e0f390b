"""Parse UCX info logs into per-endpoint transport evidence.

UCX is the only component that knows which transport and NIC carried a KV transfer. With
`UCX_LOG_LEVEL=info` it prints one lane line per endpoint configuration, and with
`UCX_PROTO_INFO=y` one protocol table per (endpoint configuration, operation). This module
reads every shape seen in the wild (UCX 1.13 `ep_cfg[N]`, 1.15 `<ptr> inter-node cfg#N`,
1.19+/1.23 `<context> intra-node cfg#N`), keeps lines of interleaved processes apart, and
decides the data-path transport from the `ucp_put*`/`ucp_get*` table row when there is one
(the lane line can name a control lane that the data never uses).

Pure standard library: it runs inside engine processes and in the operator CLI.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace

from railtrace_tracing.semconv import Transport

_PREFIX = re.compile(r"^\[(?P<ts>[\d.]+)\]\s+\[(?P<proc>[^\]]*)\]\s?(?P<rest>.*)$")
_SRC = re.compile(r"^\s*\S+\.c:\d+\s+UCX\s+(?P<level>[A-Z]+)\s+(?P<msg>.*)$")
_LANE_NEW = re.compile(
    r"(?:^|\s)(?P<ctx>\S+)\s+(?P<scope>self|intra-node|inter-node)\s+cfg#(?P<cfg>\d+)\s+(?P<lanes>\w+\(.*)$"
)
_LANE_OLD = re.compile(r"ep_cfg\[(?P<cfg>\d+)\]:\s+(?P<lanes>\w+\(.*)$")
_LANE_GROUP = re.compile(r"(\w+)\(([^)]*)\)")
_TITLE_NEW = re.compile(r"^(?P<ctx>.+?)\s+(?:(?P<scope>self|intra-node|inter-node)\s+)?cfg#(?P<cfg>\d+)$")
_TITLE_OLD = re.compile(r"^(?P<ctx>.*?)\s*ep_cfg\[(?P<cfg>\d+)\]$")
_SHARE = re.compile(r"(\d+(?:\.\d+)?)% on (\S+)")
_MEMORY = re.compile(r"\b((?:cuda|rocm)/[^\s,|]+)")
_NIXL_WARN = re.compile(r"were detected, but .* support was not found|not available, please use", re.I)

# UCX transport-layer names (`UCX_TLS`, the `tl` of a `tl/dev` lane) by transport class. This is
# the one classification of lanes: the shim's evidence and the service's verdicts both use it.
_RDMA_TLS = ("rc", "dc", "ud", "srd")  # and their `_verbs` / `_mlx5` / `_efa` variants
_NVLINK_TLS = frozenset({"cuda_ipc", "rocm_ipc"})
# `shm` is UCX's alias for the shared-memory transports; a lane names the transport itself.
_SHM_TLS = frozenset({"cma", "knem", "xpmem", "sysv", "posix", "self", "mm", "shm"})
_STAGING_TLS = frozenset({"cuda_copy", "gdr_copy", "rocm_copy", "rocm_gdr"})
# Lane keys that carry RMA (NIXL read/write), best first.
_RMA_LANES = ("rma_bw", "rma", "rma_am")
_OTHER_LANES = ("tag", "am_bw", "am")


def classify(lane: str) -> Transport | None:
    """Transport class of one `tl/dev` lane (`rc_mlx5/mlx5_3:1` → rdma, `tcp/eth1` → tcp,
    `cuda_ipc/cuda` → nvlink, `cma/memory` → shm); None for local staging copies (`cuda_copy`),
    which move no KV bytes between engines; unknown for a transport this table does not know."""
    tl = lane.split("/", 1)[0].strip().lower()
    if tl in _RDMA_TLS or tl.split("_", 1)[0] in _RDMA_TLS:
        return Transport.RDMA
    if tl in _NVLINK_TLS:
        return Transport.NVLINK
    if tl in _SHM_TLS:
        return Transport.SHM
    if tl == "tcp":
        return Transport.TCP
    if tl in _STAGING_TLS:
        return None
    return Transport.UNKNOWN


def parse_config_cell(cell: str) -> tuple[list[str], list[float]]:
    """`72% on A and 28% on B` → ([A, B], [0.72, 0.28]); `A 50% on path0 and …` → ([A], [1.0])."""
    cell = cell.strip()
    shares = _SHARE.findall(cell)
    if shares and not cell.split()[0].endswith("%"):
        # Multi-path on one device: the shares name paths, not devices.
        return [cell.split()[0]], [1.0]
    if shares:
        devices = [d for _, d in shares]
        return devices, [round(float(p) / 100.0, 4) for p, _ in shares]
    if not cell:
        return [], []
    return [cell.split()[0]], [1.0]


def _operation(text: str) -> str:
    t = text.lower()
    if "ucp_get" in t or "memory read" in t:
        return "read"
    if "ucp_put" in t or "memory write" in t:
        return "write"
    if "ucp_tag" in t or "tagged message" in t:
        return "tag"
    if "ucp_am" in t or "active message" in t:
        return "am"
    if "atomic" in t:
        return "amo"
    return "other"


def _variant_rank(text: str) -> int:
    """NIXL's data path is the `(multi)` variant of put/get; plain next; others last."""
    if "(multi)" in text:
        return 0
    if "*(" in text:
        return 2
    return 1


@dataclass
class ProtoRow:
    range: str
    description: str
    config: str


@dataclass
class ProtoTable:
    """One UCX_PROTO_INFO table."""

    title: str
    operation_text: str = ""
    rows: list[ProtoRow] = field(default_factory=list)

    @property
    def operation(self) -> str:
        return _operation(self.operation_text)

    def data_row(self) -> ProtoRow | None:
        """The row covering KV-block sizes: the one reaching `inf`, else the largest."""
        for row in self.rows:
            if row.range.replace(" ", "").endswith("inf"):
                return row
        return self.rows[-1] if self.rows else None


@dataclass
class Evidence:
    """Which transport one endpoint configuration used for one operation, and why we think so."""

    process: str
    context: str
    scope: str
    cfg: int
    operation: str  # read | write | tag | am | rma (lane line) | ""
    transport: Transport
    devices: list[str]
    split: list[float]
    protocol: str
    source: str  # proto_info | lane_line
    evidence: str
    memory: str = ""
    warnings: list[str] = field(default_factory=list)
    peer: str = ""  # NIXL agent of the peer when this endpoint is known to be the one to it

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["transport"] = self.transport.value
        return d


@dataclass
class Endpoint:
    """One endpoint configuration (`cfg#N` / `ep_cfg[N]`) of one UCX context in one process."""

    process: str
    context: str
    scope: str
    cfg: int
    style: str  # "cfg#" | "ep_cfg"
    lanes: dict[str, list[str]] = field(default_factory=dict)
    lane_line: str = ""
    tables: list[ProtoTable] = field(default_factory=list)
    order: int = 0
    offset: int = -1  # byte offset in the log of the first line naming this endpoint (-1: unknown)

    @property
    def is_self(self) -> bool:
        return self.scope == "self"

    def evidence(self, operation: str | None = None) -> list[Evidence]:
        """Per-operation evidence: PROTO_INFO put/get/tag rows win; the lane line only without them."""
        out: list[Evidence] = []
        best: dict[str, tuple[int, ProtoTable]] = {}
        for table in self.tables:
            op = table.operation
            if op not in ("read", "write", "tag", "am"):
                continue
            rank = _variant_rank(table.operation_text)
            if op not in best or rank <= best[op][0]:
                best[op] = (rank, table)  # later tables of the same rank supersede earlier ones
        for op, (_, table) in best.items():
            if operation and op != operation:
                continue
            row = table.data_row()
            if row is None:
                continue
            devices, split = parse_config_cell(row.config)
            transport = _pick(devices, split)
            mem = _MEMORY.search(table.operation_text)
            out.append(
                Evidence(
                    self.process,
                    self.context,
                    self.scope,
                    self.cfg,
                    op,
                    transport,
                    devices,
                    split,
                    row.description,
                    "proto_info",
                    f"ucx proto_info {self._label()} {table.operation_text.split(' by ')[-1].split(' ')[0]}"
                    f" {row.range} {row.description}: {row.config}",
                    memory=mem.group(1) if mem else "",
                )
            )
        have = {e.operation for e in out}
        want = [operation] if operation else ["read", "write"]
        # Lane lines only when UCX printed no tables for this endpoint at all (PROTO_INFO off or
        # old UCX): with tables present, a missing put/get table means "not used yet", and the
        # lane line's rma_am lane is known to disagree with what protocol v2 picks.
        if self.lanes and not self.tables and not (have & set(want)) and operation in (None, "read", "write"):
            lane_ev = self._lane_evidence()
            if lane_ev is not None:
                out.append(lane_ev)
        if operation == "tag" and "tag" not in have and "tag" in self.lanes and not self.tables:
            lane_ev = self._lane_evidence(keys=("tag",))
            if lane_ev is not None:
                lane_ev.operation = "tag"
                out.append(lane_ev)
        return out

    def _label(self) -> str:
        return (
            f"{self.context} {self.scope} cfg#{self.cfg}".replace("  ", " ").strip()
            if self.style == "cfg#"
            else f"{self.context} ep_cfg[{self.cfg}]".strip()
        )

    def _lane_evidence(self, keys: tuple[str, ...] = _RMA_LANES + _OTHER_LANES) -> Evidence | None:
        for key in keys:
            lanes = [ln for ln in self.lanes.get(key, []) if classify(ln) is not None]
            if not lanes:
                continue
            transport = _best_class(lanes)
            devices = [ln for ln in lanes if classify(ln) == transport]
            op = "rma" if key in _RMA_LANES else key
            return Evidence(
                self.process,
                self.context,
                self.scope,
                self.cfg,
                op,
                transport,
                devices,
                [],
                "",
                "lane_line",
                f"ucx lane line {self._label()} {key}({' '.join(self.lanes[key])})",
            )
        return None


_CLASS_ORDER = (Transport.RDMA, Transport.NVLINK, Transport.SHM, Transport.TCP, Transport.UNKNOWN)


def _best_class(lanes: list[str]) -> Transport:
    classes = {classify(ln) for ln in lanes}
    for c in _CLASS_ORDER:
        if c in classes:
            return c
    return Transport.UNKNOWN


def _pick(devices: list[str], split: list[float]) -> Transport:
    """The class carrying the largest share (first listed on a tie); staging-only → unknown."""
    shares: dict[Transport, float] = {}
    for dev, share in zip(devices, split or [1.0] * len(devices), strict=False):
        c = classify(dev)
        if c is not None:
            shares[c] = shares.get(c, 0.0) + share
    if not shares:
        return Transport.UNKNOWN
    return max(shares.items(), key=lambda kv: kv[1])[0]


@dataclass
class UcxLog:
    """Everything read from one or more UCX logs."""

    endpoints: list[Endpoint] = field(default_factory=list)
    warnings: dict[str, list[str]] = field(default_factory=dict)  # process → warnings
    versions: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    agents: list[str] = field(default_factory=list)  # NIXL agent names announced

    def data_endpoints(self) -> list[Endpoint]:
        """Endpoints to a peer (`self` endpoints, a worker's loopback, skipped)."""
        return [e for e in self.endpoints if not e.is_self]

    def evidence(self, context: str | None = None, operation: str | None = None) -> list[Evidence]:
        """Evidence of every peer endpoint, optionally for one context (NIXL agent) and operation."""
        out: list[Evidence] = []
        for ep in self.data_endpoints():
            if context is not None and ep.context != context:
                continue
            for ev in ep.evidence(operation):
                ev.warnings = list(self.warnings.get(ep.process, []))
                out.append(ev)
        return out

    def select(
        self,
        context: str | None = None,
        operation: str | None = None,
        windows: list[tuple[int, int]] | None = None,
        peer: str | None = None,
        exclude: list[tuple[int, int]] | None = None,
    ) -> Evidence | None:
        """The evidence for a transfer by `context` to `peer` doing `operation`.

        `windows` are the log byte ranges in which UCX printed the endpoint configuration to that
        peer (while NIXL connected to it): an endpoint first named there is the peer's own, and its
        evidence carries `peer`, unless it also lies in a window of another peer in `exclude`
        (connected at the same time). Otherwise the newest matching endpoint of the process is used
        and the evidence says it is the process's configuration, not a fact about this transfer.

        A NIXL agent name is the UCX context name from UCX 1.23; older NIXL printed
        `ucp_context_0`, so when no endpoint carries the agent's name and the log holds a single
        context, that context is used. Nothing matching → None (the caller reports `unknown`).
        """
        if windows:
            known, own = self._peer_evidence(context, operation, windows, exclude or [])
            if known and own is None:
                return None  # the peer's endpoint is known; UCX prints its table on first use
            if own is not None:
                own.peer = peer or ""
                own.evidence = f"{own.evidence} (endpoint to peer {peer})" if peer else own.evidence
                return own
        ev = self._select_process(context, operation)
        if ev is not None and peer:
            ev = replace(ev, warnings=[*ev.warnings, f"no UCX endpoint seen for peer {peer}"])
        return ev

    def _peer_evidence(
        self,
        context: str | None,
        operation: str | None,
        windows: list[tuple[int, int]],
        exclude: list[tuple[int, int]],
    ) -> tuple[bool, Evidence | None]:
        """(whether the peer's own endpoint is known, its evidence for `operation` if printed yet)."""
        keys = {
            (ep.process, ep.context, ep.cfg, ep.scope)
            for ep in self.data_endpoints()
            if ep.offset >= 0
            and any(s <= ep.offset < e for s, e in windows)
            and not any(s <= ep.offset < e for s, e in exclude)
        }
        if not keys:
            return False, None
        evs = [e for e in self.evidence(None, operation) if (e.process, e.context, e.cfg, e.scope) in keys]
        if not evs and operation in ("read", "write"):
            evs = [
                e
                for e in self.evidence(None, None)
                if e.operation == "rma" and (e.process, e.context, e.cfg, e.scope) in keys
            ]
        if any(ep.tables for ep in self.endpoints):
            # This UCX prints protocol tables (on an operation's first use): a lane line alone
            # is not the data path (it can name a control lane), so wait for the table.
            evs = [e for e in evs if e.source == "proto_info"]
        if not evs:
            return True, None
        evs.sort(key=lambda e: (e.source == "proto_info", self._order(e)))
        return True, replace(evs[-1])

    def _select_process(self, context: str | None, operation: str | None) -> Evidence | None:
        evs = self.evidence(context, operation)
        if not evs and context is not None:
            contexts = {e.context for e in self.data_endpoints()}
            if len(contexts) == 1 and not ({context} & contexts):
                evs = self.evidence(next(iter(contexts)), operation)
        if not evs and operation in ("read", "write"):
            evs = [e for e in self.evidence(context, None) if e.operation == "rma"]
        if not evs:
            return None
        # Prefer table evidence, then the newest endpoint configuration.
        evs.sort(key=lambda e: (e.source == "proto_info", self._order(e)))
        chosen = evs[-1]
        others = {(e.transport, tuple(e.devices)) for e in evs if e.source == chosen.source}
        if len(others) > 1:
            chosen.warnings = [*chosen.warnings, f"{len(others)} endpoint configurations disagree"]
        return chosen

    def _order(self, ev: Evidence) -> int:
        for ep in self.endpoints:
            if (ep.process, ep.context, ep.cfg, ep.scope) == (ev.process, ev.context, ev.cfg, ev.scope):
                return ep.order
        return 0


class _TableState:
    __slots__ = ("key", "offset", "op", "rows", "title")

    def __init__(self, offset: int = -1) -> None:
        self.title = ""
        self.op = ""
        self.rows: list[ProtoRow] = []
        self.offset = offset


class UcxLogParser:
    """Incremental parser: feed lines (as they are written) and read `.result` at any time."""

    def __init__(self) -> None:
        self.result = UcxLog()
        self._eps: dict[tuple[str, str, str, int], Endpoint] = {}
        self._tables: dict[str, _TableState] = {}
        self._n = 0
        self.offset = -1  # set by a caller that knows where the next line starts in the file

    # -- endpoints ----------------------------------------------------------------------
    def _endpoint(self, proc: str, style: str, ctx: str, scope: str, cfg: int, offset: int = -2) -> Endpoint:
        key = (proc, style, ctx if style == "cfg#" else "", cfg)
        ep = self._eps.get(key)
        if ep is None:
            self._n += 1
            ep = Endpoint(
                proc, ctx, scope, cfg, style, order=self._n, offset=self.offset if offset == -2 else offset
            )
            self._eps[key] = ep
            self.result.endpoints.append(ep)
        else:
            if ctx and not ep.context:
                ep.context = ctx
            if scope and not ep.scope:
                ep.scope = scope
        return ep

    def _close_table(self, proc: str) -> None:
        st = self._tables.pop(proc, None)
        if st is None or not st.title:
            return
        title = st.title
        m = _TITLE_NEW.match(title)
        if m:
            ep = self._endpoint(proc, "cfg#", m["ctx"], m["scope"] or "", int(m["cfg"]), st.offset)
        else:
            m2 = _TITLE_OLD.match(title)
            if not m2:
                return
            ep = self._endpoint(proc, "ep_cfg", m2["ctx"], "", int(m2["cfg"]), st.offset)
        ep.tables.append(ProtoTable(title, st.op, st.rows))

    # -- lines --------------------------------------------------------------------------
    def feed(self, line: str) -> None:
        line = line.rstrip("\r\n")
        m = _PREFIX.match(line)
        if m:
            proc_raw, rest = m["proc"], m["rest"]
            parts = proc_raw.split(":")
            proc = ":".join(p.strip() for p in parts[:2]) if len(parts) >= 2 else proc_raw.strip()
        else:
            proc, rest = "", line
        level = ""
        msg = rest.strip()
        sm = _SRC.match(rest)
        if sm:
            level, msg = sm["level"], sm["msg"].strip()
        if msg.startswith("+") and set(msg) <= set("+-"):
            st = self._tables.get(proc)
            if st is not None and st.rows:
                self._close_table(proc)  # the border under the data rows ends the table
            return
        if msg.startswith("|"):
            self._table_line(proc, msg)
            return
        if proc in self._tables:
            self._close_table(proc)
        self._text_line(proc, level, msg, line)

    def _table_line(self, proc: str, msg: str) -> None:
        cells = [c.strip() for c in msg.strip().strip("|").split("|")]
        st = self._tables.get(proc)
        if len(cells) == 1:
            text = cells[0]
            if st is not None and (st.rows or st.op):
                if st.op and not st.rows and not (_TITLE_NEW.match(text) or _TITLE_OLD.match(text)):
                    return
                self._close_table(proc)
                st = None
            if st is None:
                st = self._tables[proc] = _TableState(self.offset)
                st.title = text
            else:
                st.op = text
            return
        if len(cells) == 2 and ("ep_cfg[" in cells[0] or "cfg#" in cells[0]):
            if st is not None:
                self._close_table(proc)
            st = self._tables[proc] = _TableState(self.offset)
            st.title, st.op = cells
            return
        if st is None or len(cells) < 3:
            return
        if cells[0].lower() == "range" and cells[1].lower() == "description":
            return
        st.rows.append(ProtoRow(cells[0], cells[1], " | ".join(cells[2:]).strip()))

    def _text_line(self, proc: str, level: str, msg: str, raw: str) -> None:
        r = self.result
        if "Version " in msg and "loaded from" in msg:
            r.versions[proc] = msg.split("Version ", 1)[1].split()[0]
            return
        if msg.startswith("UCP version is"):
            r.versions[proc] = msg.split("UCP version is", 1)[1].strip().split()[0]
            return
        if msg.startswith("UCX_* env variable"):
            for tok in msg.split(":", 1)[1].split():
                if "=" in tok:
                    k, v = tok.split("=", 1)
                    r.env[k] = v
            return
        if "Initialized NIXL agent:" in msg:
            name = msg.split("Initialized NIXL agent:", 1)[1].strip()
            if name and name not in r.agents:
                r.agents.append(name)
            return
        if level in ("WARN", "ERROR") or _NIXL_WARN.search(msg):
            text = f"{level} {msg}".strip() if level else msg
            lst = r.warnings.setdefault(proc, [])
            if text not in lst:
                lst.append(text)
            return
        lm = _LANE_NEW.search(msg)
        if lm:
            ep = self._endpoint(proc, "cfg#", lm["ctx"], lm["scope"], int(lm["cfg"]))
            self._set_lanes(ep, lm["lanes"], msg)
            return
        om = _LANE_OLD.search(msg)
        if om:
            lanes = dict(_parse_lanes(om["lanes"]))
            scope = "self" if any(ln.startswith("self/") for v in lanes.values() for ln in v) else ""
            ep = self._endpoint(proc, "ep_cfg", "", scope, int(om["cfg"]))
            self._set_lanes(ep, om["lanes"], msg)
            if scope and not ep.scope:
                ep.scope = scope

    @staticmethod
    def _set_lanes(ep: Endpoint, lanes_text: str, msg: str) -> None:
        for key, lanes in _parse_lanes(lanes_text):
            ep.lanes[key] = lanes
        ep.lane_line = msg

    def feed_text(self, text: str) -> UcxLog:
        for line in text.splitlines():
            self.feed(line)
        return self.finish()

    def finish(self) -> UcxLog:
        for proc in list(self._tables):
            self._close_table(proc)
        return self.result


def _parse_lanes(text: str) -> Iterable[tuple[str, list[str]]]:
    for key, body in _LANE_GROUP.findall(text):
        yield key, body.split()


def parse_text(text: str) -> UcxLog:
    """Parse the whole text of a UCX log (or several concatenated)."""
    return UcxLogParser().feed_text(text)


def parse_file(path: str) -> UcxLog:
    with open(path, encoding="utf-8", errors="replace") as fh:
        parser = UcxLogParser()
        for line in fh:
            parser.feed(line)
    return parser.finish()
