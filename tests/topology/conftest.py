"""Where the shared real-world topology fixtures live (next to the checkout, or the shared folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shared_paths import FIXTURES

FIX = FIXTURES / "topology"


@pytest.fixture(scope="session")
def fix() -> Path:
    if not FIX.exists():
        pytest.skip("shared topology fixtures not present")
    return FIX
