"""Roll-up rule, the /metrics gauge values, the REST filters and `railtrace contract`.

What it shows: broken beats unknown beats ok at every level; the gauge has every
(obligation, status) pair; filters narrow the documented JSON; the CLI prints a table or that
JSON, exits 1 when something is broken (a CI gate), 2 on unreadable input, and reads recent
traffic back from a real store with `--db`.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from railtrace.cli import main
from railtrace.contract import OBLIGATIONS, STATUSES, audit, contract_gauges, filter_report, worst
from railtrace.contract.report import BROKEN, OK, UNKNOWN, rollup
from railtrace.model import Flag, KVSummary, RequestSummary, rfc3339
from railtrace.simulator.fleet import build_fleet
from railtrace.simulator.scenarios import resolve
from railtrace.topology import load_paths
from tests.contract.paths import DRANET, HERE

AZURE_GB300 = [
    DRANET / "azure_aks_examples__gb300__resource-claim.yaml",
    DRANET / "azure_aks_examples__gb300__resourceslice-dranet.yaml",
    DRANET / "azure_aks_examples__gb300__resourceslice-gpu.yaml",
]
NIXL = DRANET / "nixl-kv-transfer__resource-claim-template-aligned.yaml"
NIXL_NODE = HERE / "nixl-kv-transfer-h100-node.yaml"


def test_rollup_rule() -> None:
    assert worst([OK, UNKNOWN, BROKEN]) == BROKEN
    assert worst([OK, UNKNOWN]) == UNKNOWN
    assert worst([OK, OK]) == OK
    assert worst([]) == UNKNOWN  # nothing to judge is never ok
    r = rollup("g", [{"discovered": OK, "preserved": BROKEN}, {"discovered": UNKNOWN}])
    assert r.obligations["discovered"] == {"status": UNKNOWN, "counts": {OK: 1, BROKEN: 0, UNKNOWN: 1}}
    assert r.obligations["preserved"]["status"] == BROKEN
    assert r.obligations["verified"]["status"] == UNKNOWN


def test_gauges_and_filters_on_a_real_claim() -> None:
    report = audit(load_paths([str(p) for p in AZURE_GB300]))
    gauges = contract_gauges(report)
    assert set(gauges) == {(o, s) for o in OBLIGATIONS for s in STATUSES}
    assert gauges[("preserved", BROKEN)] == 1
    assert gauges[("verified", UNKNOWN)] == 1
    assert sum(v for (o, _), v in gauges.items() if o == "consumed") == len(report.subjects)

    doc = filter_report(report, obligation="preserved", status=BROKEN)
    assert [p["name"] for p in doc["pods"]] == ["nccl-test-dra-worker-0"]
    assert list(doc["pods"][0]["obligations"]) == ["preserved"]
    assert doc["filters"] == {"obligation": "preserved", "status": BROKEN}
    assert filter_report(report, status=OK, obligation="preserved")["pods"] == []
    assert filter_report(report, pod="default/nccl-test-dra-worker-0")["pods"]
    assert filter_report(report, node="elsewhere")["pods"] == []
    with pytest.raises(ValueError):
        filter_report(report, obligation="routed")
    with pytest.raises(ValueError):
        filter_report(report, status="fine")


def test_json_shape_is_serialisable_and_documented_keys_present() -> None:
    doc = audit(load_paths([str(p) for p in AZURE_GB300])).to_dict()
    assert set(doc) >= {
        "mode",
        "generated_at",
        "config",
        "inputs",
        "fleet",
        "pools",
        "nodes",
        "pods",
        "templates",
    }
    pod = doc["pods"][0]
    assert set(pod) == {"kind", "name", "namespace", "node", "pool", "role", "obligations"}
    assert set(pod["obligations"]) == set(OBLIGATIONS)
    assert set(pod["obligations"]["preserved"]) == {"status", "summary", "evidence", "counts"}
    json.dumps(doc)


def test_cli_table_and_exit_code_on_broken(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["contract"]
    for p in AZURE_GB300:
        argv += ["--topology", str(p)]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "preserved=BROKEN" in out
    assert "nccl-test-dra-worker-0" in out and "mlx5_2" in out
    assert "verified and consumed are unknown offline" in out


def test_cli_json_on_templates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["contract", "--topology", str(NIXL), "--topology", str(NIXL_NODE), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    tmpl = doc["templates"][0]
    assert tmpl["name"] == "h100-4gpu-4nic-numa-aligned"
    assert tmpl["obligations"]["preserved"]["status"] == OK
    # Discovered is broken: the tested node's NICs publish no rail, and that is reported by name.
    assert doc["fleet"]["obligations"]["discovered"]["status"] == BROKEN


def test_cli_input_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["contract"]) == 2
    assert "--topology" in capsys.readouterr().err
    assert main(["contract", "--topology", str(tmp_path / "missing.yaml")]) == 2
    assert "railtrace contract:" in capsys.readouterr().err


def test_cli_reads_recent_requests_from_the_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from railtrace.store import Store, make_engine, migrate

    fleet = build_fleet("a3-ultra", resolve(["topology-aware"]), seed=3)
    topo_dir = tmp_path / "topo"
    fleet.write(topo_dir)
    prefill = next(p for p in fleet.pods if p.role == "prefill")
    decode = next(p for p in fleet.pods if p.role == "decode" and p.node is not prefill.node)

    def leg(p):
        return {"pod": p.name, "node": p.node.name, "gpu": p.gpu.name, "nic": p.nic.rdma_device, "rail": None}

    now_ns = time.time_ns()
    summary = RequestSummary(
        trace_id="ab" * 16,
        request_id="r1",
        model="m",
        start=rfc3339(now_ns - 5_000_000_000),
        ttft_s=0.3,
        e2e_s=1.0,
        breakdown_s={},
        prefill=leg(prefill),
        decode=leg(decode),
        kv_transfer=KVSummary(
            transport="tcp", path_class="tcp", devices=["tcp/eth0"], evidence="ucx tcp/eth0"
        ),
        flags=[Flag("tcp_fallback", "TCP although both ends have RDMA")],
        pairing_level="subblock",
    )
    url = f"sqlite:///{tmp_path / 'rt.db'}"
    engine = make_engine(url)
    migrate(engine)
    Store(engine).save_assembly([summary], {}, [], now_ns)
    engine.dispose()

    assert main(["contract", "--topology", str(topo_dir), "--db", url, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["mode"] == "online" and doc["inputs"]["requests_in_window"] == 1
    by_name = {p["name"]: p for p in doc["pods"]}
    verified = by_name[decode.name]["obligations"]["verified"]
    assert verified["status"] == BROKEN
    assert verified["evidence"][0]["link"] == f"/api/v1/requests/{'ab' * 16}"
    assert by_name[prefill.name]["obligations"]["consumed"]["status"] == OK
    untouched = next(p for p in fleet.pods if p.name not in (prefill.name, decode.name))
    assert by_name[untouched.name]["obligations"]["verified"]["status"] == UNKNOWN
    assert datetime.fromisoformat(doc["generated_at"].replace("Z", "+00:00")).tzinfo is UTC

    # Traffic alone: verified is still judged; what needs the topology stays unknown.
    assert main(["contract", "--db", url, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    by_name = {p["name"]: p for p in doc["pods"]}
    assert set(by_name) == {prefill.name, decode.name}
    assert by_name[decode.name]["obligations"]["verified"]["status"] == BROKEN
    assert by_name[decode.name]["obligations"]["discovered"]["status"] == UNKNOWN
    assert by_name[decode.name]["obligations"]["preserved"]["status"] == UNKNOWN


def test_contract_cache_reuses_a_report_until_stale_or_new_topology(tmp_path: Path) -> None:
    from railtrace.contract import ContractCache
    from railtrace.store import Store, make_engine, migrate

    engine = make_engine(f"sqlite:///{tmp_path / 'rt.db'}")
    migrate(engine)
    store = Store(engine)
    topology = load_paths([str(p) for p in AZURE_GB300])
    clock = [100.0]
    cache = ContractCache(max_age_s=15.0, clock=lambda: clock[0])
    first = cache.get(topology, store)
    assert first.mode == "online"
    assert cache.get(topology, store) is first
    clock[0] += 16.0
    second = cache.get(topology, store)
    assert second is not first
    assert cache.get(load_paths([str(p) for p in AZURE_GB300]), store) is not second
    engine.dispose()
