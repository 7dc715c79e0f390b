"""`GET /api/v1/stats/ttft`: TTFT quantiles per path class and pairing level, checked against the rows."""

from __future__ import annotations

import math

import httpx
import pytest

from railtrace.store.quantiles import quantile


def _all(api: httpx.Client) -> list[dict]:
    return api.get("/api/v1/requests", params={"limit": 1000}).json()["items"]


@pytest.mark.parametrize("group_by", ["path_class", "pairing_level"])
def test_quantiles_match_the_requests(any_api: httpx.Client, group_by: str) -> None:
    body = any_api.get("/api/v1/stats/ttft").json()
    items = _all(any_api)
    assert body["rows"] == len(items) and not body["truncated"]
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
            assert math.isclose(g[f"ttft_s_p{q}"], quantile(values, q / 100))


def test_quantile_is_nearest_rank() -> None:
    values = [float(i) for i in range(1, 101)]
    assert quantile(values, 0.5) == 50.0 and quantile(values, 0.99) == 99.0 and quantile([3.0], 0.9) == 3.0


def test_bad_range_and_empty_window(any_api: httpx.Client) -> None:
    assert any_api.get("/api/v1/stats/ttft", params={"since": 10, "until": 5}).status_code == 400
    assert any_api.get("/api/v1/stats/ttft", params={"since": 1, "until": 2}).json()["path_class"] == []
