"""`/api/v1/stats/timeseries` and `/api/v1/stats/transfers` on both stores, against the request
list and `/api/v1/stats` of the same window (the demo's store, through the real pipeline)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import pytest


def _everything(api: httpx.Client) -> list[dict[str, Any]]:
    return api.get("/api/v1/requests", params={"limit": 1000}).json()["items"]


def _window(api: httpx.Client) -> tuple[int, int]:
    ns = sorted(_ns(s["start"]) for s in _everything(api))
    return ns[0], ns[-1] + 1


def _ns(iso: str) -> int:
    from datetime import datetime

    whole, _, frac = iso.rstrip("Z").replace("+00:00", "").partition(".")
    base = int(datetime.fromisoformat(whole + "+00:00").timestamp()) * 10**9
    return base + int((frac or "0").ljust(9, "0")[:9])


@pytest.mark.parametrize("pad_h", [0.5, 30])  # minute buckets from index entries; hours from rollups
def test_buckets_add_up_to_the_stats_of_the_window(any_api: httpx.Client, pad_h: float) -> None:
    lo, hi = _window(any_api)
    since, until = lo - int(pad_h * 3600e9), hi + int(pad_h * 3600e9)
    params = {"since": f"{since / 1e9:.9f}", "until": f"{until / 1e9:.9f}"}
    got = any_api.get("/api/v1/stats/timeseries", params={**params, "buckets": 100})
    assert got.status_code == 200, got.text
    body = got.json()
    assert (body["step_s"] >= 3600) == (pad_h > 3)
    assert len(body["buckets"]) <= 100
    assert body["buckets"][0]["start_ns"] >= since and body["buckets"][-1]["end_ns"] <= until
    by_path = any_api.get("/api/v1/stats", params={"group_by": "path_class", **params}).json()["groups"]
    by_flag = any_api.get("/api/v1/stats", params={"group_by": "flag", **params}).json()["groups"]
    paths: Counter[str] = Counter()
    flags: Counter[str] = Counter()
    for b in body["buckets"]:
        assert b["requests"] == sum(b["path_class"].values())
        paths.update(b["path_class"])
        flags.update(b["flags"])
    assert body["requests"] == sum(g["requests"] for g in by_path) == len(_everything(any_api))
    assert dict(paths) == {g["path_class"]: g["requests"] for g in by_path}
    assert dict(flags) == {g["flag"]: g["requests"] for g in by_flag}
    # Each request counts in the bucket of its start.
    per_bucket = Counter()
    for s in _everything(any_api):
        t = _ns(s["start"])
        per_bucket[next(i for i, b in enumerate(body["buckets"]) if b["start_ns"] <= t < b["end_ns"])] += 1
    assert {i: b["requests"] for i, b in enumerate(body["buckets"]) if b["requests"]} == dict(per_bucket)
    busy = [b for b in body["buckets"] if b["requests"]]
    assert all(b["ttft_s_p50"] is not None and b["ttft_s_p50"] <= b["ttft_s_p99"] for b in busy)


def test_a_window_that_cannot_be_cut_is_refused(api: httpx.Client) -> None:
    for params in (
        {},  # since is required
        {"since": "2024-01-02T00:00:00Z", "until": "2024-01-01T00:00:00Z"},
        {"since": "2020-01-01T00:00:00Z", "until": "2024-01-01T00:00:00Z"},  # over 92 days
        {"since": "2024-01-01T00:00:00Z", "buckets": 0},
    ):
        r = api.get("/api/v1/stats/timeseries", params=params)
        assert r.status_code in (400, 422), (params, r.text)
    r = api.get(
        "/api/v1/stats/transfers", params={"since": "2024-01-01T00:00:00Z", "until": "2024-01-03T00:00:00Z"}
    )
    assert r.status_code == 400 and "3 hours" in r.json()["detail"]


def test_transfers_count_each_request_with_a_kv_transfer(any_api: httpx.Client) -> None:
    lo, hi = _window(any_api)
    body = any_api.get(
        "/api/v1/stats/transfers", params={"since": lo / 1e9 - 1, "until": hi / 1e9 + 1}
    ).json()
    want: Counter[tuple[Any, ...]] = Counter()
    for s in _everything(any_api):
        kv = s.get("kv_transfer")
        if kv and kv.get("duration_s") is not None:
            key = (
                (s.get("prefill") or {}).get("node"),
                (s.get("decode") or {}).get("node"),
                kv["path_class"],
            )
            want[key] += 1
    got = Counter()
    for g in body["groups"]:
        got[(g["prefill_node"], g["decode_node"], g["path_class"])] += g["requests"]
    assert got == want and not body["truncated"]
