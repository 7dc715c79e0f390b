"""Where the shared topology fixtures live (see tests/shared_paths.py)."""

from __future__ import annotations

from pathlib import Path

from tests.shared_paths import FIXTURES, SHARED

DRANET = FIXTURES / "topology" / "dranet"
HERE = Path(__file__).parent / "fixtures"

__all__ = ["DRANET", "HERE", "SHARED"]
