"""Before/after summary of `benchmarks.shims.run` outputs, as in this folder's README.

    .venv/bin/python -m benchmarks.shims.summarize benchmarks/shims/results.json

`results.json` maps a label ("before", "after") to a list of run outputs. KV figures are the
median [min–max] over every round of every run; per-call CPU is the median over runs of each
run's median over rounds.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} [{min(values):.1f}–{max(values):.1f}]"


def summarize(label: str, runs: list[dict[str, Any]]) -> list[str]:
    rounds = [r for d in runs if "nixl_1MiB_read" in d for r in d["nixl_1MiB_read"]["per_round"]]
    lines = [f"== {label}: {len(runs)} runs, {len(rounds)} rounds"]
    for mode in ("off", "on", "inline"):
        for key in ("wall_us_median", "thread_cpu_us_median", "process_cpu_us_per_transfer"):
            if rounds:
                lines.append(f"  {mode:6} {key:30} {spread([r[mode][key] for r in rounds])}")
    for key in ("added_wall_us", "added_wall_pct", "added_thread_cpu_us", "added_process_cpu_us"):
        if rounds:
            lines.append(f"  {key:37} {spread([r[key] for r in rounds])}")
    for name in runs[0]["cpu_us_per_call"]:
        med = statistics.median(d["cpu_us_per_call"][name] for d in runs)
        lines.append(f"  {name:72} {med:8.1f}")
    per_request = statistics.median(d["cpu_us_per_request_all_python_shims"] for d in runs)
    lines.append(f"  {'one P/D request, all Python shims':72} {per_request:8.1f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    with open(args[0] if args else "benchmarks/shims/results.json") as fh:
        data = json.load(fh)
    for label, runs in data.items():
        print("\n".join(summarize(label, runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
