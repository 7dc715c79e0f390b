"""The repository stands alone: no test, fixture, benchmark or script reaches outside it.

A user clones the repository and runs the README's test command; nothing beside the checkout
exists for them. So every path the code builds from its own location must stay inside the
checkout, no file may name a folder that only exists on a development machine, no test may skip
because such a folder is missing, and the fixtures taken from public material say where their
facts come from.

The path check evaluates, in every Python file, each expression built from `__file__`
(`Path(__file__)`, `.resolve()`, `.parent`, `.parents[N]`, `/ "name"`, `os.path.dirname/join`,
and module names bound to such expressions) to the path it gives in this checkout; the shell
check counts the `..` after `dirname "$0"`. The detectors are themselves tested on known-bad code.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve()

# Folders that are not part of the repository's content (caches, environments, build output).
SKIP_DIRS = {
    ".git",
    ".venv",
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    ".schemathesis",
    "build",
    "dist",
    "node_modules",
    ".work",
}
MAX_BYTES = 4_000_000

# Text that only makes sense on a machine with extra folders next to the checkout.
FORBIDDEN_TEXT: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"RAILTRACE_SHARED"), "environment variable naming a folder outside the repository"),
    (re.compile(r"\bshared_paths\b"), "module that located fixtures outside the repository"),
    (re.compile(r"(?<![\w.-])shared/fixtures\b"), "a `shared/fixtures` folder outside the repository"),
    (re.compile(r"\.\./+shared\b"), "a `../shared` path outside the repository"),
    # Spelled so that this file does not itself contain the path it looks for.
    (re.compile(r"""["'`]/wor[k]/"""), "an absolute path on a development machine"),
]
# A test that skips because fixtures are absent hides a missing file instead of failing.
SKIP_FOR_MISSING = re.compile(
    r"skip(?:if)?\b[^\n]*(?:\bshared\b|fixtures? (?:not (?:present|found)|missing))", re.IGNORECASE
)
SHELL_DIRNAME = re.compile(
    r"""dirname\s+["']?\$(?:0|\{BASH_SOURCE\[0\]\}|BASH_SOURCE)["']?\s*\)["']?((?:/\.\.)*)"""
)

REAL_WORLD_FIXTURES = ("topology", "transport", "llmd")


def repository_files() -> Iterator[Path]:
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in SKIP_DIRS
            and not d.endswith(".egg-info")
            and not (Path(folder) == ROOT and d.startswith("railtrace-demo"))
        )
        for name in sorted(files):
            path = Path(folder) / name
            if path.suffix in {".pyc", ".so", ".db", ".sqlite"} or path.stat().st_size > MAX_BYTES:
                continue
            yield path


def read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


# -- path evaluation ---------------------------------------------------------------------------
class _Unknown(Exception):
    """The expression is not a path built from the file's location."""


class _FilePath:
    """A path derived from `__file__`: only these are judged, never plain string literals."""

    def __init__(self, path: str) -> None:
        self.path = os.path.normpath(path)


def _evaluate(node: ast.AST, env: dict[str, object], file: Path) -> object:
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int):
        return node.value
    if isinstance(node, ast.Name):
        if node.id == "__file__":
            return _FilePath(str(file))
        if node.id in env:
            return env[node.id]
        raise _Unknown
    if isinstance(node, ast.Attribute):
        base = _evaluate(node.value, env, file)
        if isinstance(base, _FilePath) and node.attr == "parent":
            return _FilePath(os.path.dirname(base.path))
        raise _Unknown
    if isinstance(node, ast.Subscript):
        if isinstance(node.value, ast.Attribute) and node.value.attr == "parents":
            base = _evaluate(node.value.value, env, file)
            index = _evaluate(node.slice, env, file)
            if isinstance(base, _FilePath) and isinstance(index, int):
                return _FilePath(str(Path(base.path).parents[index]))
        raise _Unknown
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        left = _evaluate(node.left, env, file)
        right = _evaluate(node.right, env, file)
        if isinstance(left, _FilePath) and isinstance(right, str):
            return _FilePath(os.path.join(left.path, right))
        raise _Unknown
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        for value in node.values:  # `os.environ.get(...) or <default path>`: judge the default
            try:
                return _evaluate(value, env, file)
            except _Unknown:
                continue
        raise _Unknown
    if isinstance(node, ast.Call):
        return _evaluate_call(node, env, file)
    raise _Unknown


def _call_name(func: ast.AST) -> str:
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts))


def _evaluate_call(node: ast.Call, env: dict[str, object], file: Path) -> object:
    name = _call_name(node.func)
    if name == "os.environ.get":
        if len(node.args) == 2:  # the default is what a checkout without the variable uses
            return _evaluate(node.args[1], env, file)
        raise _Unknown
    args = [_evaluate(a, env, file) for a in node.args]
    if name in ("Path", "pathlib.Path", "PurePath") and len(args) == 1:
        if isinstance(args[0], _FilePath):
            return args[0]
        raise _Unknown
    if name in ("os.path.dirname",) and isinstance(args[0], _FilePath):
        return _FilePath(os.path.dirname(args[0].path))
    if name in ("os.path.abspath", "os.path.realpath", "os.path.normpath") and isinstance(args[0], _FilePath):
        return args[0]
    if (
        name == "os.path.join"
        and args
        and isinstance(args[0], _FilePath)
        and all(isinstance(a, str) for a in args[1:])
    ):
        return _FilePath(os.path.join(args[0].path, *args[1:]))
    if isinstance(node.func, ast.Attribute):
        base = _evaluate(node.func.value, env, file)
        if isinstance(base, _FilePath):
            if node.func.attr in ("resolve", "absolute") and not args:
                return base
            if node.func.attr == "joinpath" and all(isinstance(a, str) for a in args):
                return _FilePath(os.path.join(base.path, *args))
    raise _Unknown


def _inside(path: str) -> bool:
    return path == str(ROOT) or path.startswith(str(ROOT) + os.sep)


def escaping_paths(source: str, file: Path) -> list[str]:
    """Every expression in `source` that builds a path from `file`'s location outside ROOT."""
    tree = ast.parse(source)
    env: dict[str, object] = {}
    assigns = sorted(
        (n for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.AnnAssign) and n.value is not None),
        key=lambda n: n.lineno,
    )
    for assign in assigns:
        targets = assign.targets if isinstance(assign, ast.Assign) else [assign.target]
        try:
            value = _evaluate(assign.value, env, file)  # type: ignore[arg-type]
        except (_Unknown, IndexError, TypeError):
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                env[target.id] = value
    found: list[str] = []
    lines: set[int] = set()
    for node in ast.walk(tree):  # outermost expressions first: one report per line
        if not isinstance(node, ast.expr) or node.lineno in lines:
            continue
        try:
            value = _evaluate(node, env, file)
        except (_Unknown, IndexError, TypeError):
            continue
        if isinstance(value, _FilePath) and not _inside(value.path):
            lines.add(node.lineno)
            found.append(f"line {node.lineno}: {ast.unparse(node)} -> {value.path}")
    return found


def escaping_shell(text: str, file: Path) -> list[str]:
    """`cd "$(dirname "$0")/../.."` style lines that climb above the repository root."""
    depth = len(file.relative_to(ROOT).parts) - 1  # folders between ROOT and the script
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in SHELL_DIRNAME.finditer(line):
            if match.group(1).count("..") > depth:
                found.append(f"line {number}: {line.strip()}")
    return found


def is_shell(path: Path, text: str) -> bool:
    return path.suffix in (".sh", ".bash") or (text.startswith("#!") and "sh" in text.splitlines()[0])


# -- the checks ----------------------------------------------------------------------------------
def offences() -> list[str]:
    out: list[str] = []
    for path in repository_files():
        if path == THIS:
            continue
        text = read_text(path)
        if text is None:
            continue
        rel = path.relative_to(ROOT)
        for pattern, why in FORBIDDEN_TEXT:
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                out.append(f"{rel}:{line}: {why}: {match.group(0)!r}")
        if path.suffix == ".py":
            out += [f"{rel}: path outside the repository, {o}" for o in escaping_paths(text, path)]
            for match in SKIP_FOR_MISSING.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                out.append(f"{rel}:{line}: skips when fixtures are missing instead of failing")
        elif is_shell(path, text):
            out += [f"{rel}: climbs above the repository, {o}" for o in escaping_shell(text, path)]
    return out


def test_nothing_points_outside_the_repository() -> None:
    found = offences()
    assert not found, "paths or names that reach outside the repository:\n" + "\n".join(found)


def test_the_scan_covers_tests_fixtures_benchmarks_and_scripts() -> None:
    """A scan that silently skipped these folders would pass for the wrong reason."""
    scanned = {p.relative_to(ROOT) for p in repository_files()}
    for expected in (
        Path("tests/conftest.py"),
        Path("tests/fixtures/topology/dranet/azure_aks_examples__gb300__resource-claim.yaml"),
        Path("tests/fixtures/transport/probe/two_read_tls_tcp.log"),
        Path("benchmarks/shims/run.py"),
        Path("scripts/setup-test-env"),
        Path(".ci/run"),
    ):
        assert expected in scanned, expected
    assert is_shell(ROOT / "scripts/setup-test-env", (ROOT / "scripts/setup-test-env").read_text())


@pytest.mark.parametrize("folder", REAL_WORLD_FIXTURES)
def test_fixtures_from_public_material_name_their_source(folder: str) -> None:
    """Every file taken from public material is listed in its folder's PROVENANCE.md."""
    base = ROOT / "tests" / "fixtures" / folder
    files = [p for p in base.rglob("*") if p.is_file() and p.name != "PROVENANCE.md"]
    assert files, f"{base} holds no fixtures"
    for path in files:
        provenance = path.parent / "PROVENANCE.md"
        assert provenance.is_file(), f"{path.relative_to(ROOT)} has no PROVENANCE.md beside it"
        assert f"`{path.name}`" in provenance.read_text(), (
            f"{path.relative_to(ROOT)} not in {provenance.name}"
        )


# -- the detectors catch what they are for --------------------------------------------------------
BAD_PYTHON = [
    'X = Path(__file__).resolve().parents[3] / "shared"',
    'X = Path(os.environ.get("ANY") or Path(__file__).resolve().parents[3] / "data")',
    "REPO = Path(__file__).resolve().parents[2]\nX = REPO.parent / 'data'",
    "HERE = Path(__file__).parent\nX = HERE.parents[2] / 'data'",
    "X = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), '..', 'data')",
    'X = Path(__file__).parent.parent.parent.parent / "data"',
    'X = Path(__file__).resolve().parent.joinpath("..", "..", "..", "data")',
    'X = Path(os.environ.get("DATA", Path(__file__).parents[3]))',
]
GOOD_PYTHON = [
    'X = Path(__file__).resolve().parents[1] / "fixtures" / "topology"',
    "HERE = Path(__file__).parent\nX = HERE.parent / 'fixtures'",
    "X = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'fixtures')",
    'X = Path("/nonexistent.log")',
    'X = Path(__file__).resolve().parents[1] / ".." / "tests"',
]


@pytest.mark.parametrize("source", BAD_PYTHON)
def test_path_detector_catches_escaping_paths(source: str) -> None:
    fake = ROOT / "tests" / "pkg" / "mod.py"  # two folders deep: parents[2] is the root
    assert escaping_paths(source, fake), source


@pytest.mark.parametrize("source", GOOD_PYTHON)
def test_path_detector_accepts_paths_inside(source: str) -> None:
    assert escaping_paths(source, ROOT / "tests" / "pkg" / "mod.py") == [], source


def test_path_detector_catches_the_old_fixture_locator() -> None:
    """The exact line that once located fixtures beside the checkout, one folder below the root."""
    old = (
        'SHARED = Path(os.environ.get("RAILTRACE_SHARED") or Path(__file__).resolve().parents[2] / "shared")'
    )
    assert escaping_paths(old, ROOT / "tests" / "locator.py")
    assert (
        escaping_paths('X = Path(__file__).resolve().parents[1] / "fixtures"', ROOT / "tests" / "x.py") == []
    )


def test_text_and_skip_detectors() -> None:
    bad = [
        'SHARED = os.environ["RAILTRACE_SHARED"]',
        "from tests.shared_paths import FIXTURES",
        "see shared/fixtures/llmd/otel-collector.yaml",
        'p = Path("../shared/fixtures")',
        'p = "/wor' + 'k/shared/x"',  # split, as FORBIDDEN_TEXT is, so this file holds no such path
    ]
    for line in bad:
        assert any(p.search(line) for p, _ in FORBIDDEN_TEXT), line
    for line in ('"req-shared"', "shared memory", "the shared database", "tests/fixtures/topology"):
        assert not any(p.search(line) for p, _ in FORBIDDEN_TEXT), line
    assert SKIP_FOR_MISSING.search('pytest.skip("shared topology fixtures not present")')
    assert SKIP_FOR_MISSING.search(
        'pytestmark = pytest.mark.skipif(not FIX.exists(), reason="fixtures missing")'
    )
    assert not SKIP_FOR_MISSING.search('pytest.skip("promtool not found")')


def test_shell_detector() -> None:
    script = ROOT / "scripts" / "tool"
    assert escaping_shell('cd "$(dirname "$0")/../.."', script)
    assert escaping_shell('DATA="$(dirname "${BASH_SOURCE[0]}")/../../shared"', script)
    assert escaping_shell('cd "$(dirname "$0")/.."', script) == []
