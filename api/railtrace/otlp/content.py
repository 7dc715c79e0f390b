"""What an export may carry: the content filter that drops prompt and completion text (and any
key an operator adds) from every export before it becomes rows, and the byte scans that let the
usual export, which holds none of it, skip a parse.

Why the scans: an export call of 512 spans is ~370 KB, and each substring search over it costs about
as much as building a tenth of its rows. Content keys (prompt/completion text) are almost never
present. The C accelerator searches for all of them in one pass; without it, a few searches for
short substrings that every key contains rule most calls out, and only a hit pays for one search
per key.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from railtrace.otlp.accelerators import wirescan
from railtrace.otlp.decode import DEFAULT_DROP, parse_json, parse_protobuf
from railtrace_tracing import semconv

HINT_WIDTH = 8  # measured fastest over a 512-span call: fewer hints than 12, longer skips than 6
# Keys railtrace knows that are not content: hints must not be found inside them.
KNOWN_KEYS = tuple(a.key.encode() for a in semconv.ATTRIBUTES if not a.content)


def covering_substrings(
    needles: Iterable[bytes], avoid: Iterable[bytes] = (), width: int = HINT_WIDTH
) -> tuple[bytes, ...]:
    """A small set of substrings such that every needle contains at least one of them.

    Greedy set cover over the needles' substrings of `width` bytes, leaving out those found in
    `avoid` (keys that are in every export, like `gen_ai.request.id`: a hint they contain would
    always hit). A needle with no such substring stands for itself. If a buffer holds a needle,
    it holds that needle's covering substring, so finding none of them proves that none of the
    needles is there.
    """
    common = tuple(avoid)
    uncovered = set(needles)
    hints: list[bytes] = []
    while uncovered:
        candidates: dict[bytes, int] = {}
        for n in uncovered:
            subs = {n[i : i + width] for i in range(len(n) - width + 1)}
            subs = {s for s in subs if not any(s in a for a in common)} or {n}
            for s in subs:
                candidates[s] = candidates.get(s, 0) + 1
        best = max(sorted(candidates), key=lambda s: candidates[s])
        hints.append(best)
        uncovered = {n for n in uncovered if best not in n}
    return tuple(hints)


class KeyScan:
    """Whether serialized bytes may hold any of some keys: `False` is certain, `True` is not."""

    def __init__(self, needles: Iterable[bytes], avoid: Iterable[bytes] = KNOWN_KEYS) -> None:
        self.needles = tuple(sorted({n for n in needles if n}))
        self.hints = covering_substrings(self.needles, avoid)

    def __call__(self, raw: bytes) -> bool:
        if wirescan is not None:  # one pass over the bytes for all the needles
            return bool(wirescan.contains_any(raw, self.needles))
        return any(h in raw for h in self.hints) and any(n in raw for n in self.needles)


# Attribute keys dropped at ingest by default: the registry's content attributes and the
# prefixes of flattened message keys (`semconv.CONTENT_ATTRIBUTE_PATTERNS`).
DEFAULT_DROP_ATTRIBUTES: tuple[str, ...] = (*semconv.CONTENT_ATTRIBUTES, *semconv.CONTENT_ATTRIBUTE_PATTERNS)


class ContentFilter:
    """Drops configured attribute keys (exact, or prefix with a trailing `*`) from resources,
    spans, span events and span links of an export, before anything is stored.

    A byte scan rules out the usual export that carries none of them, so only exports that
    may hold content pay for a parse here (the store parses the returned message, not the
    bytes, so there is still one parse per export)."""

    def __init__(self, keys: Iterable[str]) -> None:
        exact: set[str] = set()
        prefixes: list[str] = []
        for key in keys:
            key = key.strip()
            if not key:
                continue
            if key.endswith("*"):
                prefixes.append(key[:-1])
            else:
                exact.add(key)
        self.exact = frozenset(exact)
        self.prefixes = tuple(prefixes)
        self.needles = tuple(sorted({k.encode() for k in (*self.exact, *self.prefixes) if k}))
        self._scan = KeyScan(self.needles)
        # Whether what passes this filter is free of every content attribute the store knows,
        # so that the row builder need not search the call again.
        self.covers_content = all(self.drops(k) for k in DEFAULT_DROP)

    def __bool__(self) -> bool:
        return bool(self.needles)

    def drops(self, key: str) -> bool:
        return key in self.exact or (bool(self.prefixes) and key.startswith(self.prefixes))

    def may_match(self, raw: bytes, media: str = "application/x-protobuf") -> bool:
        if media == "application/json" and b"\\u" in raw:
            return True  # a key spelled with JSON escapes would slip past the byte scan
        return self._scan(raw)

    def _strip(self, container: Any) -> int:
        dropped = 0
        for i in range(len(container) - 1, -1, -1):
            if self.drops(container[i].key):
                del container[i]
                dropped += 1
        return dropped

    def strip(self, request: ExportTraceServiceRequest) -> int:
        """Remove matching attributes in place; returns how many were dropped."""
        dropped = 0
        for rs in request.resource_spans:
            dropped += self._strip(rs.resource.attributes)
            for ss in rs.scope_spans:
                dropped += self._strip(ss.scope.attributes)
                for s in ss.spans:
                    dropped += self._strip(s.attributes)
                    for e in s.events:
                        dropped += self._strip(e.attributes)
                    for link in s.links:
                        dropped += self._strip(link.attributes)
        return dropped

    def apply(self, raw: bytes, media: str) -> bytes | ExportTraceServiceRequest:
        """The body unchanged when it cannot hold a matching key, else the parsed, stripped
        request (raises `PayloadError` for a body that is not an export request)."""
        if not self.needles or not self.may_match(raw, media):
            return raw
        request = parse_json(raw) if media == "application/json" else parse_protobuf(raw)
        self.strip(request)
        return request


def content_filter(keys: Sequence[str] | None) -> ContentFilter:
    """The configured keys (default: `DEFAULT_DROP_ATTRIBUTES`); the registry's content
    attributes are dropped whatever the configuration says."""
    return ContentFilter([*semconv.CONTENT_ATTRIBUTES, *(DEFAULT_DROP_ATTRIBUTES if keys is None else keys)])
