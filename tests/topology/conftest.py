"""The project's own topology fixtures (facts from public examples, see their PROVENANCE.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "topology"


@pytest.fixture(scope="session")
def fix() -> Path:
    return FIX
