"""Shapes of the contract report, the roll-up rule, the /metrics gauge and the REST filter.

Kept apart from the audit logic so the service can filter and export a report without
re-running the audit, and so the JSON shape (docs/contract.md) lives in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from railtrace_tracing.semconv import ContractStatus, Obligation

OBLIGATIONS: tuple[str, ...] = tuple(o.value for o in Obligation)
STATUSES: tuple[str, ...] = tuple(s.value for s in ContractStatus)
OK, BROKEN, UNKNOWN = ContractStatus.OK.value, ContractStatus.BROKEN.value, ContractStatus.UNKNOWN.value


@dataclass(slots=True)
class Evidence:
    """One fact that decided (or would decide) an obligation, named by the object it is about."""

    # "gpu/<node>/<device>", "nic/<node>/<device>", "node/<name>", "claim/<ns>/<name>", "request/<id>"
    object: str
    message: str
    missing: list[str] = field(default_factory=list)  # attribute names the object does not publish
    link: str | None = None  # /api/v1/requests/{trace_id} for offending requests


@dataclass(slots=True)
class ObligationResult:
    obligation: str
    status: str
    summary: str
    evidence: list[Evidence] = field(default_factory=list)
    counts: dict[str, int | float] = field(default_factory=dict)


@dataclass(slots=True)
class Subject:
    """One audited prefill/decode pod, or a claim template judged offline."""

    kind: str  # "pod" | "template"
    name: str
    namespace: str | None
    node: str | None
    pool: str
    role: str | None
    obligations: dict[str, ObligationResult]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(slots=True)
class Rollup:
    """Status of each obligation over a group (node, pool, fleet), with the member counts behind it."""

    name: str
    obligations: dict[str, dict[str, Any]]  # obligation -> {"status", "counts": {ok, broken, unknown}}
    members: int = 0


@dataclass(slots=True)
class ContractReport:
    mode: str  # "offline" (topology only) | "online" (topology and recent requests)
    generated_at: str
    config: dict[str, Any]
    subjects: list[Subject]
    nodes: list[Rollup]
    pools: list[Rollup]
    fleet: Rollup
    node_findings: dict[str, ObligationResult] = field(
        default_factory=dict
    )  # node -> its own discovered check
    inputs: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON shape (docs/contract.md)."""
        return {
            "mode": self.mode,
            "generated_at": self.generated_at,
            "config": dict(self.config),
            "inputs": dict(self.inputs),
            "fleet": _rollup_dict(self.fleet),
            "pools": [_rollup_dict(r, "pool") for r in self.pools],
            "nodes": [
                {**_rollup_dict(r, "node"), "discovered_check": _result_dict(self.node_findings[r.name])}
                if r.name in self.node_findings
                else _rollup_dict(r, "node")
                for r in self.nodes
            ],
            "pods": [_subject_dict(s) for s in self.subjects if s.kind == "pod"],
            "templates": [_subject_dict(s) for s in self.subjects if s.kind == "template"],
            "warnings": list(self.warnings),
        }


def worst(statuses: Iterable[str]) -> str:
    """Roll-up rule: any broken -> broken; else any unknown -> unknown; else ok. Nothing -> unknown."""
    seen = list(statuses)
    if not seen:
        return UNKNOWN
    if BROKEN in seen:
        return BROKEN
    if UNKNOWN in seen:
        return UNKNOWN
    return OK


def rollup(name: str, members: Iterable[Mapping[str, str]]) -> Rollup:
    """Roll each obligation up over members, each a mapping obligation -> status (missing keys skipped)."""
    members = list(members)
    obligations: dict[str, dict[str, Any]] = {}
    for obligation in OBLIGATIONS:
        statuses = [m[obligation] for m in members if obligation in m]
        counts = {s: statuses.count(s) for s in STATUSES}
        obligations[obligation] = {"status": worst(statuses), "counts": counts}
    return Rollup(name=name, obligations=obligations, members=len(members))


def contract_gauges(report: ContractReport) -> dict[tuple[str, str], int]:
    """Values of `llm_d_tracing_contract_obligations{obligation,status}`: audited pods and templates per pair.

    Every (obligation, status) pair is present, zeros included, so a status that clears drops
    to 0 instead of leaving a stale series behind.
    """
    gauges = {(o, s): 0 for o in OBLIGATIONS for s in STATUSES}
    for subject in report.subjects:
        for obligation, result in subject.obligations.items():
            gauges[(obligation, result.status)] += 1
    return gauges


def filter_report(
    report: ContractReport,
    *,
    pod: str | None = None,
    node: str | None = None,
    pool: str | None = None,
    obligation: str | None = None,
    status: str | None = None,
) -> dict[str, Any]:
    """The report as JSON, narrowed for `GET /api/v1/contract?pod=&node=&pool=&obligation=&status=`.

    `pod` matches `name` or `namespace/name`; `status` keeps rows where the chosen obligation
    (or, without `obligation`, any obligation) has that status; `obligation` also trims every
    row to that one obligation. Unknown filter values raise ValueError (the route answers 400).
    """
    if obligation is not None and obligation not in OBLIGATIONS:
        raise ValueError(f"unknown obligation {obligation!r}; one of {', '.join(OBLIGATIONS)}")
    if status is not None and status not in STATUSES:
        raise ValueError(f"unknown status {status!r}; one of {', '.join(STATUSES)}")
    doc = report.to_dict()

    def status_ok(row: dict[str, Any]) -> bool:
        if status is None:
            return True
        obls = row["obligations"]
        keys = [obligation] if obligation else list(obls)
        return any(obls[k]["status"] == status for k in keys if k in obls)

    def trim(row: dict[str, Any]) -> dict[str, Any]:
        if obligation:
            row = {**row, "obligations": {k: v for k, v in row["obligations"].items() if k == obligation}}
        return row

    def keep_subject(row: dict[str, Any]) -> bool:
        if pod and pod not in (row["name"], f"{row['namespace']}/{row['name']}"):
            return False
        if node and row["node"] != node:
            return False
        if pool and row["pool"] != pool:
            return False
        return status_ok(row)

    doc["pods"] = [trim(r) for r in doc["pods"] if keep_subject(r)]
    doc["templates"] = [trim(r) for r in doc["templates"] if keep_subject(r)]
    if pod:
        nodes_of_pods = {r["node"] for r in doc["pods"]}
        doc["nodes"] = [r for r in doc["nodes"] if r["node"] in nodes_of_pods]
        pools_of_pods = {r["pool"] for r in doc["pods"]}
        doc["pools"] = [r for r in doc["pools"] if r["pool"] in pools_of_pods]
    doc["nodes"] = [trim(r) for r in doc["nodes"] if (not node or r["node"] == node) and status_ok(r)]
    doc["pools"] = [trim(r) for r in doc["pools"] if (not pool or r["pool"] == pool) and status_ok(r)]
    doc["fleet"] = trim(doc["fleet"])
    doc["filters"] = {
        k: v
        for k, v in (
            ("pod", pod),
            ("node", node),
            ("pool", pool),
            ("obligation", obligation),
            ("status", status),
        )
        if v is not None
    }
    return doc


# -- JSON helpers ------------------------------------------------------------------------


def _result_dict(r: ObligationResult) -> dict[str, Any]:
    d = asdict(r)
    d.pop("obligation", None)
    d["evidence"] = [{k: v for k, v in e.items() if v not in (None, [])} for e in d["evidence"]]
    return d


def _subject_dict(s: Subject) -> dict[str, Any]:
    return {
        "kind": s.kind,
        "name": s.name,
        "namespace": s.namespace,
        "node": s.node,
        "pool": s.pool,
        "role": s.role,
        "obligations": {k: _result_dict(v) for k, v in s.obligations.items()},
    }


def _rollup_dict(r: Rollup, key: str | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if key:
        d[key] = r.name
    d["members"] = r.members
    d["obligations"] = {k: dict(v) for k, v in r.obligations.items()}
    return d
