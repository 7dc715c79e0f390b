"""`RequestSummary.to_dict` is written out by hand for speed; it must stay what
`dataclasses.asdict` gives, field for field, whatever the summary holds."""

from __future__ import annotations

import dataclasses

from railtrace.model import Flag, KVSummary, RequestSummary
from railtrace.topology import Topology
from railtrace.verdicts import judge
from tests.verdicts.helpers import facts, kv


def test_to_dict_equals_asdict_for_a_judged_summary(fleet: Topology) -> None:
    summary = judge(facts(kvf=kv(devices=["rc_mlx5/mlx5_1:1"])), fleet)
    assert summary.flags and summary.kv_transfer is not None
    assert summary.to_dict() == dataclasses.asdict(summary)


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
    assert out == dataclasses.asdict(summary)
    assert list(out) == [f.name for f in dataclasses.fields(RequestSummary)]
    out["kv_transfer"]["devices"].append("x")
    out["trace_ids"].append("x")
    out["breakdown_s"]["x"] = 1.0
    assert summary.kv_transfer.devices == ["mlx5_0:1"] and len(summary.trace_ids) == 2
    assert "x" not in summary.breakdown_s
