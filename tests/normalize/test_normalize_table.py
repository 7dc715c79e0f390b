"""Every generation's span names map to the right role, current name and generation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from railtrace.model import Span
from railtrace.normalize import (
    engine_leg_hint,
    normalize_request_id,
    normalize_span,
    request_id_forms,
    span_request_keys,
)
from railtrace.normalize.table import RULES, lookup
from tests.fixtures.otlp_fixtures import load_expected, load_spans, scenario_names

DOC = Path(__file__).resolve().parents[2] / "docs" / "normalisation.md"


def make(name: str, service: str = "svc", scope: str = "", **attrs: object) -> Span:
    return Span(
        trace_id="0af7651916cd43dd8448eb211c80319c",
        span_id="b7ad6b7169203331",
        parent_span_id=None,
        name=name,
        kind=1,
        start_ns=1,
        end_ns=2,
        service_name=service,
        scope_name=scope,
        attributes=dict(attrs),
    )


@pytest.mark.parametrize("name", scenario_names())
def test_fixture_spans_normalise_as_expected(name: str) -> None:
    expected = load_expected(name)["spans"]
    spans = load_spans(name)
    assert {s.span_id for s in spans} == set(expected)
    for span in spans:
        normalize_span(span)
        span_name, role, canonical, generation = expected[span.span_id]
        assert span.name == span_name
        assert (span.role, span.canonical_name, span.generation) == (role, canonical, generation), span_name


@pytest.mark.parametrize(
    ("name", "service", "scope", "role", "canonical", "generation"),
    [
        ("gateway.request", "gateway-api-inference-extension/epp", "", "gateway", "gateway.request", "gie"),
        (
            "gateway.request",
            "llm-d-inference-scheduler",
            "gateway-api-inference-extension/epp/extproc",
            "gateway",
            "gateway.request",
            "v0.8",
        ),
        ("llm_d.epp.pd.profile_handler.pick", "x", "", "scheduling", "pick_pd_profile", "v0.8"),
        ("llm_d.epp.prerequest.pd_disaggregation", "x", "", "scheduling", "prepare_disaggregation", "v0.8"),
        ("llm_d.epp.scorer.prefix_cache", "x", "", "scheduling", "score_prefix_cache", "v0.8"),
        (
            "llm_d.epp.scorer.prefix-cache-scorer",
            "x",
            "",
            "scheduling",
            "llm_d.epp.scorer.prefix-cache-scorer",
            "current",
        ),
        ("pick_pd_profile", "x", "", "scheduling", "pick_pd_profile", "current"),
        ("tokenize_render /render", "x", "", "scheduling", "tokenize_render /render", "current"),
        ("llm_d.kv_cache.get_scores", "x", "", "kv_cache", "score_tokens", "v0.8"),
        ("llm_d.kv_cache.score_tokens", "x", "", "kv_cache", "score_tokens", "v0.10"),
        # GIE v1.5.0's body-based router names its span gateway.request too: not the EPP's.
        (
            "gateway.request",
            "gateway-api-inference-extension/bbr",
            "gateway-api-inference-extension/bbr/extproc",
            "other",
            "gateway.request",
            "gie",
        ),
        ("llm_d.pd_proxy.request", "pd-sidecar", "", "proxy", "forward_request", "v0.8"),
        ("llm_d.pd_proxy.GET /v1/models", "x", "", "proxy", "llm_d.pd_proxy.GET /v1/models", "current"),
        ("chunked_decode", "x", "", "decode", "chunked_decode", "current"),
        ("llm_d.kv_transfer", "vllm-decode", "", "kv_transfer", "llm_d.kv_transfer", "railtrace"),
        ("HTTP POST", "routing-proxy", "", "proxy", "HTTP POST", "current"),
        ("HTTP POST", "my-app", "", "other", "HTTP POST", ""),
        ("GET /metrics", "vllm-decode", "", "other", "GET /metrics", ""),
    ],
)
def test_names_of_each_generation(
    name: str, service: str, scope: str, role: str, canonical: str, generation: str
) -> None:
    span = normalize_span(make(name, service, scope))
    assert (span.role, span.canonical_name, span.generation) == (role, canonical, generation)


def test_pd_proxy_stage_generation_follows_the_connector() -> None:
    old = normalize_span(make("llm_d.pd_proxy.decode", **{"llm_d.pd_proxy.connector": "nixlv2"}))
    p2p = normalize_span(make("llm_d.pd_proxy.decode", **{"llm_d.pd_proxy.connector": "p2p"}))
    parallel = normalize_span(make("llm_d.pd_proxy.prefill", **{"llm_d.pd_proxy.parallel_dispatch": True}))
    assert (old.role, old.canonical_name, old.generation) == ("decode", "decode", "v0.8")
    assert (p2p.generation, parallel.generation, parallel.role) == ("current", "current", "prefill")


def test_router_shim_attributes_mark_railtrace() -> None:
    span = normalize_span(make("pick_endpoints", "llm-d-router/epp", **{"llm_d.router.profile": "decode"}))
    assert (span.role, span.generation) == ("scheduling", "railtrace")


@pytest.mark.parametrize(
    ("service", "attrs", "leg"),
    [
        ("unknown_service", {"llm_d.role": "prefill"}, "prefill"),
        ("vllm-prefill", {"gen_ai.usage.completion_tokens": 200}, "prefill"),  # service beats tokens
        ("vllm-decode", {}, "decode"),
        ("unknown_service", {"gen_ai.request.max_tokens": 1, "gen_ai.usage.completion_tokens": 1}, "prefill"),
        ("unknown_service", {"gen_ai.usage.completion_tokens": 7}, "decode"),
        ("unknown_service", {}, None),
    ],
)
def test_llm_request_leg_from_the_span_alone(service: str, attrs: dict[str, object], leg: str | None) -> None:
    span = make("llm_request", service, **attrs)
    assert engine_leg_hint(span)[0] == leg
    assert normalize_span(span).role == (leg or "decode")


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("chatcmpl-3F2B8C1E-9a4d-4e7b-8c2f-5d1a6b7e9c01", "3f2b8c1e-9a4d-4e7b-8c2f-5d1a6b7e9c01"),
        ("cmpl-3f2b8c1e-9a4d-4e7b-8c2f-5d1a6b7e9c01-0", "3f2b8c1e-9a4d-4e7b-8c2f-5d1a6b7e9c01"),
        ("3f2b8c1e-9a4d-4e7b-8c2f-123456789012", "3f2b8c1e-9a4d-4e7b-8c2f-123456789012"),
        ("req-7", "req-7"),
        ("abc", None),
        ("req\x00-7", None),  # NUL: no id of the stack's, and no database text can hold it
        (42, None),
        (None, None),
    ],
)
def test_request_id_normalisation(raw: object, key: str | None) -> None:
    assert normalize_request_id(raw) == key


UUID = "3f2b8c1e-9a4d-4e7b-8c2f-5d1a6b7e9c01"


@pytest.mark.parametrize(
    ("raw", "public", "engine"),
    [
        # vLLM's engine id: the public id plus `-<8 hex>` (input_processor.assign_request_id).
        (f"chatcmpl-{UUID}-99ae74c8", f"{UUID}-99ae74c8", UUID),
        (f"cmpl-{UUID}-0-99ae74c8", f"{UUID}-0-99ae74c8", UUID),
        (f"cmpl-{UUID}-3", UUID, UUID),
        # A UUID ends in 12 hex digits: nothing to strip either way.
        (UUID, UUID, UUID),
        # A client's own id ending in 8 hex digits stays whole when read as a public id.
        ("order-deadbeef", "order-deadbeef", "order"),
    ],
)
def test_engine_id_form(raw: str, public: str, engine: str) -> None:
    assert normalize_request_id(raw) == public
    assert normalize_request_id(raw, engine_form=True) == engine
    assert request_id_forms(raw) == list(dict.fromkeys([public, engine]))


def test_kv_span_request_id_joins_in_its_engine_form() -> None:
    kv = make(
        "llm_d.kv_transfer", "vllm-decode", **{"llm_d.kv_transfer.request_id": f"cmpl-{UUID}-0-99ae74c8"}
    )
    vllm = make("llm_request", "vllm-decode", **{"gen_ai.request.id": f"cmpl-{UUID}-0"})
    assert span_request_keys(kv) == span_request_keys(vllm) == [UUID]


def test_request_keys_read_every_join_attribute() -> None:
    span = make(
        "x",
        **{
            "llm_d.pd_proxy.request_id": "AAAA-1",
            "http.request.header.x-request-id": ["bbbb-2", "aaaa-1"],
            "gen_ai.request.id": "chatcmpl-cccc-3",
        },
    )
    assert span_request_keys(span) == ["aaaa-1", "bbbb-2", "cccc-3"]
    assert normalize_span(span).request_key == "aaaa-1"


def test_odd_input_never_raises_and_unknown_is_kept_verbatim() -> None:
    span = make("something.custom", **{"gen_ai.request.id": ["x" * 3]})
    span.attributes["weird"] = {"nested": [1, None]}
    assert (normalize_span(span).role, span.canonical_name, span.generation) == (
        "other",
        "something.custom",
        "",
    )
    broken = make("llm_request")
    broken.attributes = None  # type: ignore[assignment]
    assert normalize_span(broken).role == "decode"
    nameless = make("x")
    nameless.name = None  # type: ignore[assignment]
    assert normalize_span(nameless).role == "other"


def test_every_table_row_is_documented() -> None:
    text = DOC.read_text()
    for rule in RULES:
        shown = rule.pattern
        assert f"`{shown}`" in text, f"{shown} missing from docs/normalisation.md"
        if not rule.regex:
            assert lookup(rule.pattern) is rule
    assert re.search(r"clock skew", text, re.IGNORECASE)


def test_router_shim_generation_is_remembered_per_name_set_within_bounds(monkeypatch) -> None:
    """Whether a span carries a router-shim attribute is remembered per set of attribute names
    (an answer for every later span with the same names), within a bounded memory."""
    import railtrace.normalize as normalize

    monkeypatch.setattr(normalize, "_ROUTER_NAME_SETS", {})
    monkeypatch.setattr(normalize, "MAX_NAME_SETS", 2)
    shim = {"gen_ai.request.model": "m", "llm_d.router.chosen_endpoint": "10.0.0.1:8000"}
    plain = {"gen_ai.request.model": "m", "llm_d.routerless": "x"}
    for _ in range(2):  # the second time from what was remembered
        assert normalize_span(make("pick_endpoints", **shim)).generation == "railtrace"
        assert normalize_span(make("pick_endpoints", **plain)).generation != "railtrace"
    assert len(normalize._ROUTER_NAME_SETS) == 2
    normalize_span(make("pick_endpoints", other="y"))  # full: starts again
    assert len(normalize._ROUTER_NAME_SETS) == 1
    long_names = {"k" * 5000: 1, "llm_d.router.x": 1}  # too long to keep, still answered
    assert normalize_span(make("pick_endpoints", **long_names)).generation == "railtrace"
    assert tuple(long_names) not in normalize._ROUTER_NAME_SETS
