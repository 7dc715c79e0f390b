"""The faults the simulator injected, where, and how well incidents localised them.

Ground truth is per scenario: the pods the fault was injected into (a decode pod whose UCX cannot
open its verbs devices; every pod of a pool whose claims lack a pcieRoot constraint or hold a
second NIC; the pool pair a blind router pairs; the decode pods whose exporter loses spans).
An incident's scope is the set of pods its flagged requests went through on the part it names
(`scope.pods`). Scope precision: the share of incidents whose pods all belong to one injected
fault; recall: the share of faulty pods some incident names (docs/simulator.md, "Incidents
against ground truth").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from railtrace.simulator.fleet import Fleet
from railtrace.simulator.scenarios import Scenario


@dataclass(frozen=True, slots=True)
class Fault:
    scenario: str
    what: str
    pods: frozenset[str]


def injected_faults(fleet: Fleet, scenarios: Iterable[Scenario]) -> list[Fault]:
    out: list[Fault] = []
    for sc in scenarios:
        pods = [p for p in fleet.pods if p.scenario == sc.name]
        every = frozenset(p.name for p in pods)
        if sc.tcp_nodes:
            out += [
                Fault(sc.name, f"UCX on {p.name} cannot open its verbs devices", frozenset({p.name}))
                for p in pods
                if not p.rdma_ok
            ]
        if not sc.aligned:
            out.append(Fault(sc.name, "claims without a pcieRoot constraint", every))
        if sc.second_rail:
            out.append(Fault(sc.name, "claims hold a second NIC on another rail", every))
        if sc.router == "blind":
            out.append(Fault(sc.name, "router pairs blind to topology", every))
        if sc.decode_spans_lost:
            decode = frozenset(p.name for p in pods if p.role == "decode")
            out.append(Fault(sc.name, "decode exporters lose their spans", decode))
    return out


def localisation(incidents: list[dict[str, Any]], fleet: Fleet, faults: list[Fault]) -> dict[str, Any]:
    """Per scenario: incidents, those within an injected fault, faulty pods named; and overall."""
    scenario_of = {p.name: p.scenario for p in fleet.pods}
    per: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(p.scenario for p in fleet.pods):
        per[name] = {"incidents": 0, "correct": 0, "faulty_pods": 0, "named": 0, "faults": 0}
    faulty: dict[str, set[str]] = {}
    for f in faults:
        faulty.setdefault(f.scenario, set()).update(f.pods)
        per[f.scenario]["faults"] += 1
    named: set[str] = set()
    scoped = [i for i in incidents if i["scope"].get("kind") != "request"]
    scoped_ok = 0
    for inc in incidents:
        pods = set(inc["scope"].get("pods") or [])
        scenarios = {scenario_of.get(p) for p in pods}
        only = next(iter(scenarios)) if len(scenarios) == 1 else None
        ok = bool(pods) and any(pods <= f.pods for f in faults)
        named |= pods if ok else set()
        scoped_ok += ok and inc["scope"].get("kind") != "request"
        for sc in scenarios:
            if sc in per:
                per[sc]["incidents"] += 1
                per[sc]["correct"] += ok and sc == only
    for sc, pods in faulty.items():
        per[sc]["faulty_pods"] = len(pods)
        per[sc]["named"] = len(pods & named)
    for row in per.values():
        row["precision"] = _ratio(row["correct"], row["incidents"])
        row["recall"] = _ratio(row["named"], row["faulty_pods"])
    total_inc = sum(r["incidents"] for r in per.values())
    total_ok = sum(r["correct"] for r in per.values())
    total_pods = sum(r["faulty_pods"] for r in per.values())
    total_named = sum(r["named"] for r in per.values())
    return {
        "per_scenario": per,
        "precision": _ratio(total_ok, total_inc),
        # Over the incidents a shared part explains (single-request ones left out).
        "precision_scoped": _ratio(scoped_ok, len(scoped)),
        "single_request": len(incidents) - len(scoped),
        "recall": _ratio(total_named, total_pods),
    }


def _ratio(a: int, b: int) -> float | None:
    return round(a / b, 4) if b else None
