"""`GET /api/v1/stats/ttft`: TTFT quantiles per path class and pairing level, checked against the
rows (within the histograms' 1 %), and the bucket arithmetic they rest on."""

from __future__ import annotations

import math
import random
from collections import Counter

import httpx
import pytest

from railtrace.store.quantiles import histogram_quantile, quantile
from railtrace.store.rollup import NO_TTFT, RELATIVE_ERROR, ZERO_BUCKET, bucket_of, bucket_value


def near(got: float | None, want: float) -> bool:
    """Within the histograms' relative error of the exact nearest-rank value."""
    return got is not None and abs(got - want) <= RELATIVE_ERROR * want + 1e-12


def _all(api: httpx.Client) -> list[dict]:
    return api.get("/api/v1/requests", params={"limit": 1000}).json()["items"]


@pytest.mark.parametrize("group_by", ["path_class", "pairing_level"])
def test_quantiles_match_the_requests(any_api: httpx.Client, group_by: str) -> None:
    body = any_api.get("/api/v1/stats/ttft").json()
    items = _all(any_api)
    assert body["rows"] == len(items) and not body["truncated"]
    assert body["relative_error"] == RELATIVE_ERROR
    assert body[group_by]
    for g in body[group_by]:
        key = g[group_by]
        mine = [
            s
            for s in items
            if (
                (s.get("kv_transfer") or {}).get("path_class")
                if group_by == "path_class"
                else s.get("pairing_level")
            )
            == key
        ]
        values = sorted(s["ttft_s"] for s in mine if s["ttft_s"] is not None)
        assert g["requests"] == len(mine) and g["with_ttft"] == len(values)
        for q in (50, 90, 99):
            assert near(g[f"ttft_s_p{q}"], quantile(values, q / 100))


def test_quantile_is_nearest_rank() -> None:
    values = [float(i) for i in range(1, 101)]
    assert quantile(values, 0.5) == 50.0 and quantile(values, 0.99) == 99.0 and quantile([3.0], 0.9) == 3.0


def test_bad_range_and_empty_window(any_api: httpx.Client) -> None:
    assert any_api.get("/api/v1/stats/ttft", params={"since": 10, "until": 5}).status_code == 400
    assert any_api.get("/api/v1/stats/ttft", params={"since": 1, "until": 2}).json()["path_class"] == []


def test_a_bucket_answers_within_one_percent_of_every_value_it_holds() -> None:
    rng = random.Random(7)
    values = [10 ** rng.uniform(-5, 4) for _ in range(20_000)] + [1.0, 0.5, 2.0, 1e-6 * 1.0001]
    for v in values:
        assert near(bucket_value(bucket_of(v)), v), v
    assert bucket_of(None) == NO_TTFT and bucket_of(math.nan) == NO_TTFT
    assert bucket_of(0.0) == ZERO_BUCKET == bucket_of(1e-7) and bucket_value(ZERO_BUCKET) == 0.0
    assert bucket_of(0.3) < bucket_of(0.31) and bucket_of(3.0) > bucket_of(2.9)


@pytest.mark.parametrize("seed", range(5))
def test_histogram_quantiles_are_within_one_percent_of_the_exact_nearest_rank(seed: int) -> None:
    """Lognormal TTFTs (a long tail) with repeats and requests without a first token."""
    rng = random.Random(seed)
    values = [rng.lognormvariate(-1.5, 1.2) for _ in range(rng.randrange(1, 5_000))]
    values += values[: len(values) // 10]
    counts = Counter(bucket_of(v) for v in values)
    counts[NO_TTFT] += 17
    ordered = sorted(values)
    for q in (0.0, 0.001, 0.5, 0.9, 0.99, 0.999, 1.0):
        assert near(histogram_quantile(counts, q), quantile(ordered, q)), q
    assert histogram_quantile(Counter({NO_TTFT: 3}), 0.5) is None
