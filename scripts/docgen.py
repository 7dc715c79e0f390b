"""Generate `docs/conventions.md` from the name registry (`python scripts/docgen.py`).

The registry is the source of truth; a test fails when the committed document and the
registry disagree, so the doc can never drift. `--check` exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import sys
from enum import StrEnum
from pathlib import Path

from railtrace_tracing import semconv as sc

DEFAULT_PATH = Path(__file__).resolve().parents[1] / "docs" / "conventions.md"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    """The whole document, deterministic for a given registry."""
    out: list[str] = [
        "# Conventions: span names, attributes, flags, metrics, environment",
        "",
        "Generated from `tracing/railtrace_tracing/semconv.py` by `python scripts/docgen.py`; "
        "do not edit by hand.",
        "",
        "## Span names",
        "",
        "| name | what |",
        "|---|---|",
    ]
    out += [f"| `{_cell(name)}` | {_cell(desc)} |" for name, desc in sc.SPAN_NAMES.items()]
    out += ["", "## Attributes", "", "| key | type | unit | origin | allowed | description |"]
    out += ["|---|---|---|---|---|---|"]
    for a in sc.ATTRIBUTES:
        allowed = ", ".join(f"`{v}`" for v in a.allowed)
        desc = a.description + (" **Content: dropped at ingest, never stored.**" if a.content else "")
        out.append(f"| `{a.key}` | {a.type} | {a.unit} | {a.origin} | {allowed} | {_cell(desc)} |")
    out += ["", "## Value sets", ""]
    enums = [
        v for v in vars(sc).values() if isinstance(v, type) and issubclass(v, StrEnum) and v is not StrEnum
    ]
    for enum in enums:
        out.append(f"- `{enum.__name__}`: " + ", ".join(f"`{v.value}`" for v in enum))
    out += ["", "## Flags", "", "| flag | meaning |", "|---|---|"]
    out += [f"| `{f.value}` | {_cell(sc.FLAG_DESCRIPTIONS.get(f, ''))} |" for f in sc.FlagName]
    out += ["", "## Metrics", "", "| name | type | labels | description |", "|---|---|---|---|"]
    for m in sc.METRICS:
        out.append(f"| `{m.name}` | {m.type} | {', '.join(m.labels)} | {_cell(m.description)} |")
    bounded = ", ".join(f"`{label}`" for label in sc.BOUNDED_LABELS)
    out += [
        "",
        f"Labels whose values are not from a fixed set ({bounded}: senders choose models, nodes"
        " and NICs) are bounded: values listed in the settings or"
        " known to the topology, then the first `metrics_label_values` others seen, get series of their"
        f" own; the rest are counted under `{sc.LABEL_OTHER}`, and a family holds at most"
        ' `metrics_max_series` series (docs/deploy.md, "Metrics").',
    ]
    out += ["", "## Environment variables (shims)", "", "| variable | meaning |", "|---|---|"]
    out += [f"| `{k}` | {_cell(v)} |" for k, v in sc.ENV_VARS.items()]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", type=Path, default=DEFAULT_PATH)
    p.add_argument("--check", action="store_true", help="exit 1 if the file differs from the registry")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date: run python scripts/docgen.py", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
