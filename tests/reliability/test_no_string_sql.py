"""No SQL is built from strings with values in them.

Scans the service's source (AST, not text) for SQL keywords in f-strings, `%` formatting,
`.format()` and string concatenation. Each site found must be one of the few below, which
splice in only constants of the code (placeholders, column lists, a PRAGMA value from a
fixed set); every value from a request goes through bound parameters. A new site fails
this test until it is checked and listed here with its reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|PRAGMA|WHERE|CREATE|DROP|ALTER|VALUES|SET)\b")
MAINTENANCE = re.compile(r"\s*(ANALYZE|VACUUM|REINDEX)\b")  # statements that name only a table

# (file, start of the literal text) -> why it is safe.
ALLOWED = {
    ("api/railtrace/store/writes.py", "INSERT INTO span_chunks ("): "column list and placeholder constants",
    ("api/railtrace/store/writes.py", "INSERT INTO trace_keys"): "placeholder constant",
    ("api/railtrace/store/writes.py", "INSERT INTO resources "): "placeholder constant",
    ("api/railtrace/store/writes.py", "INSERT INTO traces "): "column list, placeholder and clause constants",
    ("api/railtrace/store/statements.py", "INSERT INTO traces "): "column list and clause constants",
    ("api/railtrace/store/statements.py", "SELECT  FROM (VALUES ) WHERE column1 IS NOT NULL"): (
        "multi-row form of the INSERTs above: their own text, generated column names, repeated placeholders"
    ),
    (
        "api/railtrace/store/upkeep.py",
        "ANALYZE",
    ): "ANALYZE takes no parameters; table names of api/railtrace/store/schema.py",
    (
        "api/railtrace/store/engine.py",
        "PRAGMA synchronous=",
    ): "PRAGMA takes no parameters; the value is a code default",
    (
        "api/railtrace/store/engine.py",
        "PRAGMA wal_autocheckpoint=",
    ): "PRAGMA takes no parameters; a code constant",
}


def _literal_text(node: ast.AST) -> str:
    if isinstance(node, ast.JoinedStr):
        return "".join(
            v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)
        )
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp):
        return _literal_text(node.left) + _literal_text(node.right)
    return ""


def string_built_sql() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted([*(ROOT / "api").rglob("*.py"), *(ROOT / "tracing").rglob("*.py")]):
        if "migrations" in path.parts:
            continue  # DDL written by hand, no values
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            built = None
            if isinstance(node, ast.JoinedStr) and any(
                isinstance(v, ast.FormattedValue) for v in node.values
            ):
                built = node
            elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
                if isinstance(node.left, (ast.Constant, ast.JoinedStr)) or isinstance(
                    node.right, (ast.Constant, ast.JoinedStr)
                ):
                    built = node
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "format"
                and isinstance(node.func.value, ast.Constant)
            ):
                built = node.func.value
            if built is None:
                continue
            text = _literal_text(built)
            keyworded = SQL.search(text) and re.search(r"\b(FROM|INTO|TABLE|PRAGMA|VALUES|WHERE|SET)\b", text)
            if keyworded or MAINTENANCE.match(text):
                found.append((rel, node.lineno, text.strip()))
    return found


def test_sql_is_never_built_from_strings() -> None:
    unexplained = []
    for rel, line, text in string_built_sql():
        if not any(rel == f and text.startswith(start) for f, start in ALLOWED):
            unexplained.append(f"{rel}:{line}: {text[:80]!r}")
    assert not unexplained, "SQL built from strings:\n" + "\n".join(unexplained)


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The detector itself: an f-string query with a value in it is found."""
    tree = ast.parse("q = f\"SELECT * FROM spans WHERE trace_id = '{tid}'\"")
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.JoinedStr))
    assert SQL.search(_literal_text(node))
