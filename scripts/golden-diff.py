"""Compare the golden summaries of the work tree with those of a commit, ignoring some keys.

Why: a new summary key moves every golden copy; reviewing that diff by eye cannot tell "only
the new key" from "the new key and a changed verdict". Exit status 1 when anything else moved.

    .venv/bin/python scripts/golden-diff.py [--rev HEAD] [--ignore cost ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

GOLDEN = Path("tests/assembly/golden")


def _strip(value: Any, ignore: set[str]) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v, ignore) for k, v in value.items() if k not in ignore}
    if isinstance(value, list):
        return [_strip(v, ignore) for v in value]
    return value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--ignore", nargs="*", default=["cost"])
    args = ap.parse_args()
    ignore, moved = set(args.ignore), 0
    for path in sorted(GOLDEN.glob("*.jsonl")):
        old = subprocess.run(
            ["git", "show", f"{args.rev}:{path}"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        new = path.read_text().splitlines()
        same = len(old) == len(new) and all(
            _strip(json.loads(a), ignore) == _strip(json.loads(b), ignore)
            for a, b in zip(old, new, strict=True)
        )
        moved += not same
        what = f"only {', '.join(sorted(ignore))} moved" if same else "MOVED"
        print(f"{path}: {len(new)} records, {what}")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.exit(main())
