"""A request whose id holds `/` opens on its own page in the browser: the page's URL carries the
id percent-encoded (`%2F`), the page is served, and the page asks the API for the same id."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import create_engine, delete, insert, select

from railtrace.server.ui import request_path
from railtrace.store.schema import requests
from tests.ui.ui_helpers import Page

RID = "tenant-a/batch 7/req#42"
TID = "f" * 31 + "1"


def _add_request(filled: Path) -> None:
    """One of the demo's requests again, under a request id with `/`, ` ` and `#`."""
    engine = create_engine(f"sqlite:///{filled / 'railtrace.db'}")
    try:
        with engine.begin() as conn:
            if conn.execute(select(requests.c.trace_id).where(requests.c.trace_id == TID)).first():
                return
            row = dict(conn.execute(select(requests).limit(1)).mappings().one())
            summary = orjson.loads(row["summary"])
            summary.update(trace_id=TID, trace_ids=[TID], request_id=RID)
            row.update(trace_id=TID, request_id=RID, summary=orjson.dumps(summary))
            conn.execute(insert(requests), [row])
    finally:
        engine.dispose()


def _remove_request(filled: Path) -> None:
    """The shared demo database as the other UI tests know it: its request count, and every
    request with its spans (this row has none)."""
    engine = create_engine(f"sqlite:///{filled / 'railtrace.db'}")
    try:
        with engine.begin() as conn:
            conn.execute(delete(requests).where(requests.c.trace_id == TID))
    finally:
        engine.dispose()


@pytest.fixture
def slashed_request(filled: Path) -> Iterator[None]:
    _add_request(filled)
    try:
        yield
    finally:
        _remove_request(filled)


@pytest.mark.usefixtures("slashed_request")
def test_a_request_id_with_a_slash_has_its_page(page: Page, service: Any) -> None:
    asked: list[str] = []
    page.page.on("request", lambda r: asked.append(r.url) if "/api/v1/requests/" in r.url else None)
    p = page.open(request_path(RID))
    assert request_path(RID) == "/requests/tenant-a%2Fbatch%207%2Freq%2342"
    text = p.inner_text("main")
    assert "Not found" not in text
    assert RID in text or TID in text
    assert any(u.endswith("/api/v1/requests/tenant-a%2Fbatch%207%2Freq%2342") for u in asked), asked
    assert not [e for e in page.errors if "404" not in e], page.errors
