"""The part of TraceQL Grafana's search builder writes: one or more `{...}` spansets joined by
`&&`, each a conjunction of `field op value`; and the legacy `tags=` logfmt.

Regular expressions (`=~`, `!~`) run in RE2, as in Tempo (Go's regexp is RE2 syntax): matching
takes time linear in the text whatever the pattern, so a pattern cannot make a search hold
the interpreter. What RE2 cannot compile (backreferences, lookaround) is refused, as is a
pattern over `MAX_PATTERN_CHARS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson
import re2

from railtrace.model import Span

# The tokenizer and number forms are fixed patterns over a query of at most 2000 characters;
# none can backtrack more than linearly.
TOKEN = re.compile(
    r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<op>&&|\|\||!=|=~|!~|>=|<=|=|>|<)|(?P<brace>[{}()])"""
    r"""|(?P<word>[A-Za-z0-9_.:\-/]+))"""
)
DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)$")
NUMBER = re.compile(r"-?\d+(\.\d+)?")
# `key=value` or, skipped, any other run of non-space: matched at successive positions, so the
# whole `tags=` parameter is read in linear time (a search at every offset is quadratic).
LOGFMT = re.compile(r'\s*(?:([^\s=]+)=("(?:[^"\\]|\\.)*"|\S+)|\S+)')
UNITS = {"ns": 1, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9}
INTRINSICS = (
    "name",
    "status",
    "duration",
    "kind",
    "traceDuration",
    "rootServiceName",
    "rootName",
    "nestedSetParent",  # -1 on a root span (Traces Drilldown counts traces by `nestedSetParent<0`)
)
STATUS = {0: "unset", 1: "ok", 2: "error"}
KIND = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}

# Longest regular expression accepted: far above what a search builder writes, and a bound on
# the size of what RE2 compiles.
MAX_PATTERN_CHARS = 1000
# Memory RE2 may use for one compiled pattern (and its DFA cache); beyond it compiling fails.
PATTERN_MAX_MEM = 8 << 20


def _re2_options() -> Any:
    options = re2.Options()
    options.max_mem = PATTERN_MAX_MEM
    options.log_errors = False  # a refused pattern is the client's 400, not a line in our log
    return options


RE2_OPTIONS = _re2_options()


class TraceQLError(ValueError):
    """A query outside the supported subset, or a pattern RE2 cannot run: HTTP 400."""


@dataclass(slots=True)
class Cond:
    scope: str  # "resource" | "span" | "any" | "intrinsic"
    key: str
    op: str
    value: Any


@dataclass(slots=True)
class Spanset:
    conds: list[Cond] = field(default_factory=list)


def compile_pattern(text: str) -> Any:
    """`text` as an RE2 pattern (matched whole, as Tempo does), or a TraceQLError saying why not."""
    if len(text) > MAX_PATTERN_CHARS:
        raise TraceQLError(f"regular expression longer than {MAX_PATTERN_CHARS} characters")
    try:
        return re2.compile(text, RE2_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise TraceQLError(
            f"regular expression {text[:40]!r} cannot be run: {reason}"
            " (RE2 syntax: no backreferences or lookaround)"
        ) from None


def parse_traceql(q: str) -> list[Spanset]:
    """`{a && b} && {c}` into spansets of conditions; `||`, pipelines and aggregates are refused."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    q = q.strip()
    while pos < len(q):
        m = TOKEN.match(q, pos)
        if not m or m.end() == pos:
            raise TraceQLError(f"cannot read the query at {q[pos : pos + 20]!r}")
        pos = m.end()
        kind = m.lastgroup or ""
        tokens.append((kind, m.group(kind)))
    if not tokens:
        return [Spanset()]
    sets: list[Spanset] = []
    i = 0

    def expect(kind: str, text: str | None = None) -> str:
        nonlocal i
        if i >= len(tokens) or tokens[i][0] != kind or (text is not None and tokens[i][1] != text):
            got = tokens[i][1] if i < len(tokens) else "the end"
            raise TraceQLError(f"expected {text or kind} but found {got!r}")
        i += 1
        return tokens[i - 1][1]

    while True:
        expect("brace", "{")
        ss = Spanset()
        while not (i < len(tokens) and tokens[i] == ("brace", "}")):
            if ss.conds:
                if i < len(tokens) and tokens[i][1] == "||":
                    raise TraceQLError("`||` is not supported: use one query per alternative")
                expect("op", "&&")
            name = expect("word")
            op = expect("op")
            if op in ("&&", "||"):
                raise TraceQLError(f"a condition needs a value after {name}")
            kind, raw = tokens[i] if i < len(tokens) else ("", "")
            if kind not in ("str", "word"):
                raise TraceQLError(f"a condition needs a value after {name} {op}")
            i += 1
            ss.conds.append(condition(name, op, raw, kind == "str"))
        expect("brace", "}")
        sets.append(ss)
        if i == len(tokens):
            return sets
        if tokens[i][1] == "||":
            raise TraceQLError("`||` between spansets is not supported")
        if tokens[i][1] == "|":
            raise TraceQLError("pipelines (`|`) are not supported")
        expect("op", "&&")


def condition(name: str, op: str, raw: str, quoted: bool) -> Cond:
    """One `name op value`; a regex value compiled (RE2) here, once per query."""
    value: Any
    if quoted:
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise TraceQLError(f"cannot read the string {raw[:40]}") from None
    elif m := DURATION.match(raw):
        value = float(m.group(1)) * UNITS[m.group(2)]
    elif NUMBER.fullmatch(raw):
        value = float(raw)
    else:
        value = raw  # status and kind enums, booleans
    if op in ("=~", "!~"):
        value = compile_pattern(str(value))
    for prefix, scope in (("resource.", "resource"), ("span.", "span"), (".", "any")):
        if name.startswith(prefix):
            return Cond(scope, name[len(prefix) :], op, value)
    bare = name.split(":", 1)[-1]  # trace:duration, span:name, ...
    alias = {"duration": "traceDuration"} if name.startswith("trace:") else {}
    bare = alias.get(bare, bare)
    if bare not in INTRINSICS:
        raise TraceQLError(f"unknown field {name!r}: use resource.<key>, span.<key>, .<key> or {INTRINSICS}")
    if op in ("=~", "!~") and bare in ("duration", "traceDuration"):
        raise TraceQLError(f"{op} needs a string field")
    return Cond("intrinsic", bare, op, value)


def logfmt(tags: str) -> list[Cond]:
    """The legacy `tags=` parameter: `key=value key2="value two"`."""
    out = []
    pos = 0
    while pos < len(tags):
        m = LOGFMT.match(tags, pos)
        if m is None or m.end() == pos:  # only trailing space is left
            break
        pos = m.end()
        if m.group(1) is None:
            continue
        raw = m.group(2)
        try:
            value = orjson.loads(raw) if raw.startswith('"') else raw
        except orjson.JSONDecodeError:
            raise TraceQLError(f"cannot read the tag value {raw[:40]}") from None
        key = m.group(1)
        scope = "intrinsic" if key in ("name", "status") else "any"
        if key == "service.name":
            scope = "resource"
        out.append(Cond(scope, key, "=", value))
    return out


def compare(actual: Any, op: str, wanted: Any) -> bool:
    """`actual op wanted` as TraceQL means it; a list matches if any item does (all, for negations)."""
    if isinstance(actual, list):
        return (
            any(compare(a, op, wanted) for a in actual)
            if op not in ("!=", "!~")
            else all(compare(a, op, wanted) for a in actual)
        )
    if actual is None:
        return op in ("!=", "!~")
    if op == "=":
        return bool(actual == wanted or str(actual) == str(wanted))
    if op == "!=":
        return not (actual == wanted or str(actual) == str(wanted))
    if op in ("=~", "!~"):
        pattern = wanted if not isinstance(wanted, str) else compile_pattern(re2.escape(wanted))
        found = pattern.fullmatch(str(actual)) is not None
        return bool(found) if op == "=~" else not found
    try:
        a, w = float(actual), float(wanted)
    except (TypeError, ValueError):
        return False
    return {">": a > w, ">=": a >= w, "<": a < w, "<=": a <= w}[op]


def span_matches(s: Span, conds: list[Cond], root: Span | None, trace_ns: int) -> bool:
    """Whether span `s` meets every condition (intrinsics of the trace from `root`, `trace_ns`)."""
    for c in conds:
        if c.scope == "intrinsic":
            actual: Any = {
                "name": s.name,
                "status": STATUS.get(s.status_code, "unset"),
                "kind": KIND.get(s.kind, "unspecified"),
                "duration": s.end_ns - s.start_ns,
                "traceDuration": trace_ns,
                "rootServiceName": root.service_name if root else None,
                "rootName": root.name if root else None,
                "nestedSetParent": -1 if s is root else 1,
            }[c.key]
        elif c.scope == "resource":
            actual = s.resource.get(c.key)
        elif c.scope == "span":
            actual = s.attributes.get(c.key)
        else:
            actual = s.attributes.get(c.key, s.resource.get(c.key))
        if not compare(actual, c.op, c.value):
            return False
    return True
