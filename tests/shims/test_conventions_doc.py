"""docs/conventions.md is generated from the registry and must not drift from it."""

from __future__ import annotations

from railtrace_tracing import semconv as sc
from railtrace_tracing.docgen import DEFAULT_PATH, render


def test_conventions_doc_matches_registry() -> None:
    assert DEFAULT_PATH.read_text(encoding="utf-8") == render(), (
        "docs/conventions.md disagrees with tracing/semconv.py: run `python -m railtrace_tracing.docgen`"
    )


def test_every_registered_name_is_documented() -> None:
    text = render()
    for a in sc.ATTRIBUTES:
        assert f"`{a.key}`" in text
    for m in sc.METRICS:
        assert f"`{m.name}`" in text
    for f in sc.FlagName:
        assert f"`{f.value}`" in text
