"""The service's optional C accelerators, each one the module or None when it is not built.

Why optional: an install without a C compiler must still work; every accelerated step has a
Python path with the same result, which the tests hold the two to. Setting
`RAILTRACE_PURE_PYTHON=1` makes the service take the Python paths even where an accelerator is
built (to rule one out when something looks wrong, or to measure what it saves). Ingest reads
it once, when this module is imported; the stored-span reader whenever a reader is made
(`railtrace.otlp.spans.span_reader`).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

PURE_PYTHON_ENV = "RAILTRACE_PURE_PYTHON"


def pure_python() -> bool:
    """Whether `RAILTRACE_PURE_PYTHON` asks for the Python paths."""
    return os.environ.get(PURE_PYTHON_ENV, "").strip().lower() in ("1", "true", "yes")


def built(name: str) -> ModuleType | None:
    """`railtrace.otlp.<name>` if it is built, else None (whatever the switch says)."""
    try:
        return importlib.import_module(f"railtrace.otlp.{name}")
    except ImportError:
        return None


def load(name: str) -> ModuleType | None:
    """`railtrace.otlp.<name>` if it is built and not switched off, else None."""
    return None if pure_python() else built(name)


wirescan = load("_wirescan")
