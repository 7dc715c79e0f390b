"""Where the shared topology fixtures live: $RAILTRACE_SHARED, beside the checkout, or /work/shared."""

from __future__ import annotations

import os
from pathlib import Path

_CANDIDATES = [
    Path(os.environ["RAILTRACE_SHARED"]) if os.environ.get("RAILTRACE_SHARED") else None,
    Path(__file__).resolve().parents[3] / "shared",
    Path("/work/shared"),
]
SHARED = next(
    (p for p in _CANDIDATES if p is not None and (p / "fixtures" / "topology").is_dir()), Path("/work/shared")
)
DRANET = SHARED / "fixtures" / "topology" / "dranet"
HERE = Path(__file__).parent / "fixtures"
