"""Reading topology inputs from files and folders into a `TopologyBuilder`.

Which parser a file gets is decided by its content, not its name: YAML/JSON documents
(Kubernetes objects, `List`s, multi-document files, Helm templates with `{{ }}` placeholders,
railtrace's own topology YAML), `nvidia-smi topo -m` text, or nccl-tests "Using devices" output.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from railtrace.topology.builder import TopologyBuilder
from railtrace.topology.model import Topology
from railtrace.topology.nvsmi import looks_like_nccl_devices, looks_like_topo_matrix

RAILTRACE_API_PREFIX = "railtrace"
RAILTRACE_KIND = "Topology"
_SKIP_SUFFIXES = {".md", ".rst", ".png", ".jpg", ".gz", ".tar", ".zip", ".pyc"}
_HELM_LINE = re.compile(r"^\s*\{\{-?.*-?\}\}\s*$")
_HELM_EXPR = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}")
_NODE_DIRECTIVE = re.compile(r"^\s*#\s*node\s*:\s*(\S+)", re.IGNORECASE | re.MULTILINE)


class TopologyError(Exception):
    """Topology input that cannot be read at all (missing path, broken YAML/JSON, unknown text)."""


def is_railtrace_doc(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and str(doc.get("apiVersion", "")).startswith(RAILTRACE_API_PREFIX)
        and doc.get("kind") == RAILTRACE_KIND
    )


def _expand(paths: Sequence[str | os.PathLike[str]]) -> list[tuple[Path, bool]]:
    """Files to read, with whether the user named them explicitly (folders skip docs silently)."""
    out: list[tuple[Path, bool]] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                # Dot-folders too: a mounted ConfigMap keeps each key twice, in `..<timestamp>/`.
                hidden = any(part.startswith(".") for part in f.relative_to(p).parts)
                if f.is_file() and f.suffix.lower() not in _SKIP_SUFFIXES and not hidden:
                    out.append((f, False))
        elif p.is_file():
            out.append((p, True))
        else:
            raise TopologyError(f"{p}: no such file or folder")
    return out


def _strip_helm(text: str) -> str:
    """Helm templates: drop directive-only lines, turn `{{ expr }}` into a plain placeholder string."""
    lines = [ln for ln in text.splitlines() if not _HELM_LINE.match(ln)]
    return "\n".join(
        _HELM_EXPR.sub(lambda m: "HELM-" + re.sub(r"[^A-Za-z0-9]+", "-", m.group(1)).strip("-"), ln)
        for ln in lines
    )


def _parse_documents(text: str, path: Path) -> list[Any]:
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            data = json.loads(text)
            return data if isinstance(data, list) else [data]
        except json.JSONDecodeError:
            pass  # YAML flow style is also valid; fall through
    if "{{" in text:
        text = _strip_helm(text)
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise TopologyError(f"{path}:{where} not valid YAML/JSON ({getattr(exc, 'problem', exc)})") from exc


def add_file(builder: TopologyBuilder, path: Path, explicit: bool = True) -> None:
    """Add one file's content to the builder; unrecognised text is a warning, broken YAML an error."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TopologyError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    if b"\x00" in raw[:4096]:
        raise TopologyError(f"{path}: binary file, not a topology input")
    text = raw.decode("utf-8", errors="replace")
    source = str(path)
    builder.add_source(source)
    if looks_like_topo_matrix(text):
        m = _NODE_DIRECTIVE.search(text)
        node = m.group(1) if m else path.stem
        if not m:
            builder.warn(
                f"{path}: nvidia-smi topo -m has no `# node: NAME` line; node name taken from the file name"
            )
        try:
            builder.add_nvidia_smi(text, node=node, source=source)
        except ValueError as exc:
            raise TopologyError(f"{path}: nvidia-smi topo -m: {exc}") from exc
        return
    if looks_like_nccl_devices(text):
        builder.add_nccl_devices(text, source=source)
        return
    if path.suffix.lower() in (".txt", ".log", ".out") or not _looks_structured(text):
        builder.warn(
            f"{path}: not a recognised topology input (Kubernetes YAML/JSON, nvidia-smi topo -m, "
            "railtrace YAML); skipped"
        )
        return
    docs = _parse_documents(text, path)
    used = 0
    for doc in docs:
        if is_railtrace_doc(doc):
            try:
                builder.add_railtrace_doc(doc, source=source)
            except ValueError as exc:
                raise TopologyError(f"{path}: {exc}") from exc
            used += 1
        elif isinstance(doc, dict) and ("kind" in doc or isinstance(doc.get("items"), list)):
            builder.add_k8s_object(doc, source=source)
            used += 1
        elif isinstance(doc, list):
            for item in doc:
                builder.add_k8s_object(item, source=source)
                used += 1
        else:
            builder.warn(f"{path}: a document without `kind` was skipped")
    if not used:
        builder.warn(f"{path}: no Kubernetes objects or railtrace topology found")


def _looks_structured(text: str) -> bool:
    return bool(
        re.search(r"^\s*(apiVersion|kind|items|nodes|resourceClaims|---)\b", text, re.MULTILINE)
    ) or text.lstrip().startswith(("{", "["))


def load_into(builder: TopologyBuilder, paths: Iterable[str | os.PathLike[str]]) -> TopologyBuilder:
    for path, explicit in _expand(list(paths)):
        add_file(builder, path, explicit)
    return builder


def load_paths(paths: Sequence[str | os.PathLike[str]]) -> Topology:
    """Files and folders of any supported input → one Topology (TopologyError if any cannot be read)."""
    if not paths:
        raise TopologyError("no topology paths given")
    return load_into(TopologyBuilder(), paths).build()
