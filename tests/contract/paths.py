"""Where the contract tests' topology inputs live: the project's own fixtures, inside the repository."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
DRANET = TESTS / "fixtures" / "topology" / "dranet"
HERE = Path(__file__).parent / "fixtures"

__all__ = ["DRANET", "HERE"]
