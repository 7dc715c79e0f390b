"""A topology change while the service runs: TopologyHolder.reload() changes verdicts without restart."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from railtrace.topology import TopologyError, TopologyHolder
from railtrace.verdicts import judge
from tests.verdicts.helpers import FLEET, facts, kv


def test_reload_after_editing_the_file_changes_the_verdict(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET.read_text())
    holder = TopologyHolder([str(path)])
    f = facts(kvf=kv(devices=[], local_gpu=None))
    before = judge(f, holder.get())
    assert {x.name for x in before.flags} == set() and holder.version == 1

    # The operator re-labels decode-b's allocation: it now holds gpu-1 with gpu-0's NIC.
    text = path.read_text().replace(
        "{name: decode-b, node: node-b, ip: 10.0.0.2, port: 8000, role: decode, gpus: [gpu-0]",
        "{name: decode-b, node: node-b, ip: 10.0.0.2, port: 8000, role: decode, gpus: [gpu-1]",
    )
    path.write_text(text)
    assert holder.reload() == 2
    after = judge(f, holder.get())
    assert "gpu_nic_mismatch" in {x.name for x in after.flags}
    assert after.decode["gpu"] == "gpu-1"


def test_broken_file_keeps_the_previous_topology(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET.read_text())
    holder = TopologyHolder([str(path)])
    old = holder.get()
    path.write_text("nodes: [unclosed\n")
    with pytest.raises(TopologyError, match="not valid YAML"):
        holder.reload()
    assert holder.get() is old and holder.version == 1 and "not valid YAML" in (holder.last_error or "")


def test_replace_is_atomic_for_concurrent_readers(tmp_path: Path) -> None:
    holder = TopologyHolder([str(FLEET)])
    seen: set[int] = set()
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            seen.add(len(holder.get().nodes))

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for _ in range(5):
        holder.reload()
    stop.set()
    for t in threads:
        t.join()
    assert seen == {6} and holder.version == 6
