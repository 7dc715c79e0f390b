"""`GET /api/v1/topology?summary=true`: the fleet page's counts, equal to the full model's."""

from __future__ import annotations

import httpx


def test_summary_counts_match_the_model(any_api: httpx.Client) -> None:
    full = any_api.get("/api/v1/topology").json()
    summary = any_api.get("/api/v1/topology", params={"summary": "true"}).json()
    assert summary["nodes"] == len(full["nodes"]) and summary["pods"] == len(full["pods"])
    assert summary["blocks"] == len(full["blocks"])
    assert summary["subblocks"] == sum(len(s) for s in full["blocks"].values())
    assert summary["rails"] == len(full["rails"])
    assert summary["warnings"] == full["warnings"]
    assert summary["discovery_gaps"] == [
        {"object": g["object"], "missing": g["missing"], "note": g.get("note", "")}
        for g in full["discovery_gaps"]
    ]
    # The full model is encoded once per model and answered the same way each time.
    assert any_api.get("/api/v1/topology").content == any_api.get("/api/v1/topology").content
