"""Where the shared real-world topology fixtures live (next to the checkout, or the shared folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

FIX = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "topology"
if not FIX.exists():
    FIX = Path("/work/shared/fixtures/topology")


@pytest.fixture(scope="session")
def fix() -> Path:
    if not FIX.exists():
        pytest.skip("shared topology fixtures not present")
    return FIX
