"""The byte scan that rules out content attributes before an export call is parsed.

It is only an optimisation if it can never say "absent" for a call that holds a content key:
every key must contain one of the hints, whatever keys an operator configures.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from railtrace.otlp.content import KNOWN_KEYS, ContentFilter, KeyScan, content_filter, covering_substrings
from railtrace.otlp.decode import DEFAULT_DROP

KEYS = st.binary(min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(
    needles=st.lists(KEYS, min_size=1, max_size=12),
    avoid=st.lists(KEYS, max_size=8),
    width=st.integers(1, 16),
)
def test_every_needle_contains_a_hint(needles: list[bytes], avoid: list[bytes], width: int) -> None:
    hints = covering_substrings(needles, avoid, width)
    assert all(any(h in n for h in hints) for n in needles)


@settings(max_examples=300, deadline=None)
@given(
    needles=st.lists(KEYS, min_size=1, max_size=12), filler=st.binary(max_size=200), pick=st.integers(0, 11)
)
def test_a_buffer_holding_a_needle_is_never_ruled_out(needles: list[bytes], filler: bytes, pick: int) -> None:
    scan = KeyScan(needles)
    needle = needles[pick % len(needles)]
    assert scan(filler[:50] + needle + filler[50:])
    assert scan(filler) == any(n in filler for n in needles)


def test_hints_avoid_the_keys_every_export_carries() -> None:
    scan = KeyScan(k.encode() for k in DEFAULT_DROP)
    for hint in scan.hints:
        assert not any(hint in known for known in KNOWN_KEYS), hint
    assert len(scan.hints) < len(scan.needles)  # fewer searches than keys, or it saves nothing


def test_only_a_filter_with_every_content_key_spares_the_second_search() -> None:
    assert content_filter([]).covers_content  # the registry's content keys are always in
    assert content_filter(["x.secret"]).covers_content
    assert not ContentFilter(["x.secret"]).covers_content
    assert ContentFilter([*DEFAULT_DROP]).covers_content
