"""docs/conventions.md is generated from the registry and must not drift from it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from railtrace_tracing import semconv as sc

# The generator is a tool of the checkout (scripts/docgen.py), not a module of any distribution.
_spec = importlib.util.spec_from_file_location(
    "railtrace_docgen", Path(__file__).resolve().parents[2] / "scripts" / "docgen.py"
)
assert _spec is not None and _spec.loader is not None
docgen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docgen)
DEFAULT_PATH, render = docgen.DEFAULT_PATH, docgen.render


def test_conventions_doc_matches_registry() -> None:
    assert DEFAULT_PATH.read_text(encoding="utf-8") == render(), (
        "docs/conventions.md disagrees with tracing/railtrace_tracing/semconv.py: "
        "run `python scripts/docgen.py`"
    )


def test_every_registered_name_is_documented() -> None:
    text = render()
    for a in sc.ATTRIBUTES:
        assert f"`{a.key}`" in text
    for m in sc.METRICS:
        assert f"`{m.name}`" in text
    for f in sc.FlagName:
        assert f"`{f.value}`" in text
