"""Kubernetes and DRA names are spelled in one module (`railtrace.topology.k8s_keys`): a label,
driver, device attribute or annotation written as a string anywhere else in the service or the
shims is a second spelling that can drift from the one the builder reads."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from railtrace.topology import k8s_keys

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "api" / "railtrace" / "topology" / "k8s_keys.py"
# `<dns-subdomain>/<name>`: the shape of a qualified label, annotation or device attribute.
QUALIFIED = re.compile(r"\b[a-z0-9-]+(\.[a-z0-9-]+)+/[A-Za-z][\w.-]*")
OWN_API = "railtrace.io/"  # railtrace's own collect document, not a cluster's name


def names() -> set[str]:
    """Every qualified name the keys module defines (constants, their tuples and dict keys); a bare
    word such as the fallback label `role` is not a name another module could be said to spell."""
    out: set[str] = set()
    for name, value in vars(k8s_keys).items():
        if not name.isupper():
            continue
        items = value if isinstance(value, tuple) else value.keys() if isinstance(value, dict) else (value,)
        out |= {v for v in items if isinstance(v, str) and "." in v}
    return out


def strings(path: Path) -> list[tuple[int, str]]:
    """String constants of a module (f-string parts included), docstrings and comments excluded."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def second_spellings(path: Path, known: set[str], domains: set[str]) -> list[str]:
    """Strings of `path` that are, or contain, a known name or a new name of a known domain."""
    hits = []
    for line, text in strings(path):
        qualified = [m.group(0) for m in QUALIFIED.finditer(text) if not m.group(0).startswith(OWN_API)]
        if text in known or any(q in known or q.split("/")[0] in domains for q in qualified):
            hits.append(f"{path.name}:{line}: {text!r}")
    return hits


def domains(known: set[str]) -> set[str]:
    """The domains of the qualified names: a new name of one of them belongs in the keys module too."""
    return {n.split("/")[0] for n in known if "/" in n}


def test_every_kubernetes_name_is_spelled_in_the_keys_module_only() -> None:
    known = names()
    assert {k8s_keys.PCIE_ROOT, k8s_keys.ROLE_LABEL, k8s_keys.GCE_NETWORK_NAME} <= known
    elsewhere = []
    for path in sorted((ROOT / "api").rglob("*.py")) + sorted((ROOT / "tracing").rglob("*.py")):
        if path != HOME:
            elsewhere += second_spellings(path, known, domains(known))
    assert not elsewhere, "\n".join(elsewhere)


def test_the_check_sees_a_second_spelling(tmp_path: Path) -> None:
    """The scan finds a key spelled in code, inside an f-string and as a new name of a known
    domain, and leaves docstrings and railtrace's own API version alone."""
    src = tmp_path / "m.py"
    src.write_text(
        '"""Doc: resource.kubernetes.io/pcieRoot."""\n'
        'A = "resource.kubernetes.io/pcieRoot"\n'
        'B = f"{1} NIC dra.net/numaNode"\n'
        'C = "dra.net/someNewAttribute"\n'
        'D = "railtrace.io/v1alpha1"\n'
        'E = "no key here"\n'
    )
    known = names()
    hits = second_spellings(src, known, domains(known))
    assert sorted(h.split(":")[1] for h in hits) == ["2", "3", "4"], hits
