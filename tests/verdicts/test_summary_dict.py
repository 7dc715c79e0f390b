"""`RequestSummary.to_dict` is written out by hand for speed; it must stay what
`dataclasses.asdict` gives, field for field, whatever the summary holds -- but for
`kv_transfer.source`, a key only requests judged against a P2P KV source have."""

from __future__ import annotations

import dataclasses
from typing import Any

from railtrace.model import Flag, KVSummary, RequestSummary
from railtrace.topology import Topology
from railtrace.verdicts import judge
from tests.verdicts.helpers import facts, kv


def _asdict(summary: RequestSummary) -> dict[str, Any]:
    out = dataclasses.asdict(summary)
    if out["kv_transfer"] is not None and out["kv_transfer"]["source"] is None:
        del out["kv_transfer"]["source"]
    return out


def test_to_dict_equals_asdict_for_a_judged_summary(fleet: Topology) -> None:
    summary = judge(facts(kvf=kv(devices=["rc_mlx5/mlx5_1:1"])), fleet)
    assert summary.flags and summary.kv_transfer is not None
    assert summary.to_dict() == _asdict(summary)


def test_to_dict_equals_asdict_with_every_field_set_and_copies_containers() -> None:
    summary = RequestSummary(
        trace_id="a" * 32,
        request_id="r-1",
        model="m",
        start="2026-11-29T00:00:00Z",
        ttft_s=0.5,
        e2e_s=1.5,
        breakdown_s={"prefill": 0.25},
        prefill={"pod": "p", "node": "n", "gpu": None, "nic": None, "rail": None},
        decode={"pod": "d", "node": "m", "gpu": "0", "nic": "mlx5_0", "rail": "0"},
        kv_transfer=KVSummary("rdma", "same_rail", 1024, 0.01, ["mlx5_0:1"], "span x"),
        flags=[Flag("cross_rail", "because", "b" * 16)],
        trace_ids=["a" * 32, "c" * 32],
        span_count=9,
        complete=False,
        pairing_level="block",
    )
    out = summary.to_dict()
    assert out == _asdict(summary)
    assert list(out) == [f.name for f in dataclasses.fields(RequestSummary)]
    out["kv_transfer"]["devices"].append("x")
    out["trace_ids"].append("x")
    out["breakdown_s"]["x"] = 1.0
    assert summary.kv_transfer.devices == ["mlx5_0:1"] and len(summary.trace_ids) == 2
    assert "x" not in summary.breakdown_s


def test_to_dict_has_the_source_of_a_p2p_transfer() -> None:
    source = {"pod": "s", "node": "n2", "gpu": "1", "nic": "mlx5_1", "rail": "1"}
    kv = KVSummary("rdma", "rdma_cross_rail", 1024, 0.01, [], "pulled from s", source=source)
    summary = RequestSummary("a" * 32, None, None, "2026-11-29T00:00:00Z", None, None, {}, {}, {}, kv, [])
    out = summary.to_dict()
    assert out == dataclasses.asdict(summary) and out["kv_transfer"]["source"] == source
    out["kv_transfer"]["source"]["pod"] = "x"
    assert source["pod"] == "s"
