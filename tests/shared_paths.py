"""Where the shared real-world fixtures live: `shared/` beside the checkout (also in CI), or
`$RAILTRACE_SHARED`."""

from __future__ import annotations

import os
from pathlib import Path

SHARED = Path(os.environ.get("RAILTRACE_SHARED") or Path(__file__).resolve().parents[2] / "shared")
FIXTURES = SHARED / "fixtures"
