"""Offline check of claim templates and unallocated claims: will the allocation keep GPU and NIC together?

Only the selector shapes used in published templates are understood (pcieRoot constraints,
pciBusID pins, rdmaDevice pins, numaNode pins, ifName prefixes); anything else is reported as
not understood rather than guessed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from railtrace.topology.k8s_keys import PCIE_ROOT
from railtrace.topology.model import (
    ALIGNED,
    GPU,
    MISALIGNED,
    NIC,
    NOT_APPLICABLE,
    UNKNOWN,
    Pairing,
    TemplateCheck,
)

_GPU_CLASSES = re.compile(r"(^|\.)(gpu|mig)\.", re.IGNORECASE)
_NIC_CLASSES = re.compile(r"(dranet|dra\.net|mrdma|netdev|efa|multinic|rdma|nic|sriov|^ib\.)", re.IGNORECASE)
_BUS_EQ = re.compile(r'pciBusID"?\]?\s*==\s*["\']([0-9a-fA-F:.]+)["\']')
_BUS_IN = re.compile(r"pciBusID\"?\]?\s+in\s+\[([^\]]*)\]")
_RDMA_DEV = re.compile(r'rdmaDevice"?\]?\s*==\s*["\']([^"\']+)["\']')
_NUMA = re.compile(r'numaNode"?\]?\s*==\s*(\d+)')
_IFNAME_PREFIX = re.compile(r'ifName\.startsWith\(\s*["\']([^"\']+)["\']\s*\)')
_GPU_PREFIX = re.compile(r"^gpu(\d+)$")


def _kind_of(device_class: str, classes: Mapping[str, str]) -> str:
    driver = classes.get(device_class, device_class)
    if _GPU_CLASSES.search(driver + ".") or driver.startswith("gpu.") or driver.startswith("mig."):
        return "gpu"
    if _NIC_CLASSES.search(driver) or _NIC_CLASSES.search(device_class):
        return "nic"
    return "other"


def _requests(spec: Mapping[str, Any], classes: Mapping[str, str]) -> list[dict[str, Any]]:
    out = []
    for r in (spec.get("devices") or {}).get("requests") or []:
        alternatives = r.get("firstAvailable") or [r.get("exactly") or r]
        for alt in alternatives:
            cls = str(alt.get("deviceClassName", ""))
            exprs = [str((s.get("cel") or {}).get("expression", "")) for s in alt.get("selectors") or []]
            text = " && ".join(exprs)
            bus = _BUS_EQ.findall(text) + [
                b.strip().strip("'\"") for m in _BUS_IN.findall(text) for b in m.split(",") if b.strip()
            ]
            req = {
                "name": r.get("name")
                if alt is r or alt is r.get("exactly")
                else f"{r.get('name')}/{alt.get('name')}",
                "request": r.get("name"),
                "deviceClassName": cls,
                "kind": _kind_of(cls, classes),
                "count": alt.get(
                    "count", 1 if alt.get("allocationMode", "ExactCount") == "ExactCount" else "all"
                ),
                "selectors": exprs,
                "pciBusIDs": bus,
                "rdmaDevice": (_RDMA_DEV.findall(text) or [None])[0],
                "numaNode": int(_NUMA.findall(text)[0]) if _NUMA.findall(text) else None,
                "ifNamePrefix": (_IFNAME_PREFIX.findall(text) or [None])[0],
            }
            out.append(req)
    return out


def check_template(
    obj: Mapping[str, Any],
    classes: Mapping[str, str],
    gpus: list[GPU],
    nics: list[NIC],
    pairings: Mapping[tuple[str, str], Pairing],
) -> TemplateCheck:
    md = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if obj.get("kind") == "ResourceClaimTemplate":
        spec = spec.get("spec") or {}
    reqs = _requests(spec, classes)
    constraints = [dict(c) for c in (spec.get("devices") or {}).get("constraints") or []]
    gpu_reqs = [r for r in reqs if r["kind"] == "gpu"]
    nic_reqs = [r for r in reqs if r["kind"] == "nic"]
    evidence: list[str] = []
    alignment = UNKNOWN

    def done(a: str) -> TemplateCheck:
        return TemplateCheck(
            kind=str(obj.get("kind", "")),
            name=str(md.get("name", "")),
            namespace=md.get("namespace"),
            requests=tuple(reqs),
            constraints=tuple(constraints),
            alignment=a,
            evidence=tuple(evidence),
        )

    if not gpu_reqs or not nic_reqs:
        prefixes = [r["ifNamePrefix"] for r in nic_reqs if r["ifNamePrefix"]]
        if prefixes:
            evidence.append(
                "NICs chosen by interface-name prefix " + ", ".join(prefixes) + " (GPU-named NICs)"
            )
        evidence.append(
            "requests " + ("no GPU" if not gpu_reqs else "no NIC") + "; GPU↔NIC alignment not expressed here"
        )
        return done(NOT_APPLICABLE)

    # 1. pcieRoot constraints.
    covered: set[str] = set()
    pcie_pairs: list[tuple[str, str]] = []
    for c in constraints:
        if c.get("matchAttribute") != PCIE_ROOT:
            continue
        names = [str(n) for n in (c.get("requests") or [r["request"] for r in reqs])]
        covered.update(names)
        pcie_pairs += [
            (g["request"], n["request"])
            for g in gpu_reqs
            for n in nic_reqs
            if g["request"] in names and n["request"] in names
        ]
        if not c.get("requests") and any(isinstance(r["count"], int) and r["count"] > 1 for r in reqs):
            evidence.append(
                "matchAttribute pcieRoot without `requests` applies to every request; with count > 1 all "
                "devices must share one root, which usually cannot be satisfied"
            )
    if pcie_pairs:
        uncovered = [g["request"] for g in gpu_reqs if g["request"] not in covered]
        evidence.append(f"GPU and NIC share {PCIE_ROOT}: " + ", ".join(f"{g}+{n}" for g, n in pcie_pairs))
        if uncovered:
            evidence.append("GPU requests without a pcieRoot constraint: " + ", ".join(uncovered))
            return done(MISALIGNED)
        return done(ALIGNED)

    statuses: list[str] = []
    for g in gpu_reqs:
        bus_ids = g["pciBusIDs"]
        targets = [x for x in gpus if x.pci_bus_id in bus_ids] if bus_ids else []
        for n in nic_reqs:
            if n["rdmaDevice"] and bus_ids:
                verdicts = []
                for gpu in targets:
                    p = pairings.get((gpu.node, gpu.name))
                    nic = next(
                        (c for c in nics if c.node == gpu.node and n["rdmaDevice"] in c.aliases()), None
                    )
                    if nic is None or p is None or p.method is None:
                        continue
                    ok = nic.name in p.nics
                    verdicts.append(ok)
                    evidence.append(
                        f"GPU {gpu.pci_bus_id} ({gpu.node}/{gpu.name}, NUMA {gpu.numa}) with {nic.label} "
                        f"(NUMA {nic.numa}): {'paired' if ok else 'not paired'} by {p.method}"
                    )
                if not verdicts:
                    evidence.append(
                        f"GPU {', '.join(bus_ids)} pinned with NIC {n['rdmaDevice']}: "
                        "devices not in the topology"
                    )
                    statuses.append(UNKNOWN)
                else:
                    statuses.append(ALIGNED if all(verdicts) else MISALIGNED)
            elif n["numaNode"] is not None:
                if not bus_ids:
                    evidence.append(
                        f"NICs pinned to NUMA {n['numaNode']} but the GPU is not pinned: "
                        "any GPU may be chosen"
                    )
                    statuses.append(MISALIGNED)
                    continue
                numas = {x.pci_bus_id: x.numa for x in targets if x.numa is not None}
                missing = [b for b in bus_ids if b not in numas]
                if missing:
                    evidence.append(
                        f"NICs pinned to NUMA {n['numaNode']}; NUMA of GPU {', '.join(missing)} not known "
                        "(the GPU driver publishes none; add it from nvidia-smi topo -m or railtrace YAML)"
                    )
                    statuses.append(UNKNOWN)
                    continue
                bad = [b for b, v in numas.items() if v != n["numaNode"]]
                evidence.append(
                    f"NICs pinned to NUMA {n['numaNode']}; GPUs "
                    + ", ".join(f"{b} NUMA {v}" for b, v in numas.items())
                )
                statuses.append(MISALIGNED if bad else ALIGNED)
            elif n["ifNamePrefix"] and _GPU_PREFIX.match(n["ifNamePrefix"]):
                evidence.append(f"NIC chosen by GPU-named interface prefix {n['ifNamePrefix']}")
                statuses.append(ALIGNED)
            elif _takes_every_nic(n, nics):
                evidence.append(
                    f"NIC request {n['request']} takes {n['count']} NICs, every RDMA NIC of the GPU nodes "
                    "known: each GPU gets its own NIC among them"
                )
                statuses.append(ALIGNED)
            else:
                evidence.append(f"nothing ties NIC request {n['request']} to GPU request {g['request']}")
                statuses.append(MISALIGNED)
    if MISALIGNED in statuses:
        alignment = MISALIGNED
    elif statuses and all(s == ALIGNED for s in statuses):
        alignment = ALIGNED
    return done(alignment)


def _takes_every_nic(req: dict[str, Any], nics: list[NIC]) -> bool:
    """A NIC request whose count equals the RDMA NIC count of every known node (e.g. 4gpu-8nic)."""
    count = req.get("count")
    per_node: dict[str, int] = {}
    for n in nics:
        if n.rdma:
            per_node[n.node] = per_node.get(n.node, 0) + 1
    return isinstance(count, int) and bool(per_node) and all(v == count for v in per_node.values())
