"""Decompression is bounded whatever the gzip member structure: output stops at the limit,
at most MAX_GZIP_MEMBERS members, and each member costs zlib at most one step of input, not
the rest of the body (benchmarks/reliability/gzip_members.py has the timings)."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator

import httpx
import pytest
from google.rpc import status_pb2

from railtrace.otlp import PayloadError
from railtrace.otlp.bounds import INFLATE_STEP, MAX_GZIP_MEMBERS
from railtrace.otlp.decode import TooLarge, inflate_bounded
from railtrace.server.runner import Service
from railtrace.settings import Settings
from tests.reliability.reliability_helpers import PROTOBUF, post

EMPTY_MEMBER = gzip.compress(b"", mtime=0)


def test_one_and_several_members_inflate_to_their_concatenation() -> None:
    parts = [b"alpha" * 1000, b"", b"beta" * 50_000, bytes(range(256)) * 300]
    body = b"".join(gzip.compress(p, mtime=0) for p in parts)
    assert inflate_bounded(body, "gzip", 10**7) == b"".join(parts)
    assert inflate_bounded(gzip.compress(parts[2]), "x-gzip", 10**7) == parts[2]


def test_deflate_zlib_and_raw() -> None:
    data = b"span" * 100_000
    assert inflate_bounded(zlib.compress(data), "deflate", 10**7) == data
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert inflate_bounded(raw.compress(data) + raw.flush(), "deflate", 10**7) == data


def test_members_across_step_boundaries() -> None:
    """Members that straddle the step at which input is fed are read whole."""
    member = gzip.compress(bytes(range(256)) * 1000, mtime=0)  # incompressible-ish, ~ a few KB
    n = (3 * INFLATE_STEP) // len(member) + 2
    n = min(n, MAX_GZIP_MEMBERS)
    assert inflate_bounded(member * n, "gzip", 10**8) == bytes(range(256)) * 1000 * n


def test_too_many_members_is_refused() -> None:
    assert inflate_bounded(EMPTY_MEMBER * MAX_GZIP_MEMBERS, "gzip", 100) == b""
    with pytest.raises(PayloadError, match="members"):
        inflate_bounded(EMPTY_MEMBER * (MAX_GZIP_MEMBERS + 1), "gzip", 100)
    with pytest.raises(PayloadError, match="members"):
        inflate_bounded(EMPTY_MEMBER * 840_000, "gzip", 16 << 20)  # the 16 MiB attack body


def test_output_over_the_limit_and_truncated_input() -> None:
    with pytest.raises(TooLarge):
        inflate_bounded(gzip.compress(b"\0" * (1 << 20)), "gzip", 1000)
    with pytest.raises(TooLarge):  # spread over members
        inflate_bounded(gzip.compress(b"\0" * 600) * 2, "gzip", 1000)
    with pytest.raises(PayloadError, match="truncated"):
        inflate_bounded(gzip.compress(b"x" * 10_000)[:-10], "gzip", 10**6)
    with pytest.raises(PayloadError):
        inflate_bounded(gzip.compress(b"x") + b"garbage", "gzip", 10**6)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    db = tmp_path_factory.mktemp("gz") / "g.db"
    with (
        Service(Settings(db=f"sqlite:///{db}", port=0, grpc_port=0, topology=[])) as svc,
        httpx.Client(base_url=svc.http_url, timeout=60) as c,
    ):
        yield c


def test_a_body_of_many_empty_members_is_a_400(client: httpx.Client) -> None:
    r = post(client, EMPTY_MEMBER * 800_000, PROTOBUF, **{"content-encoding": "gzip"})
    assert r.status_code == 400
    assert "members" in status_pb2.Status.FromString(r.content).message
    assert client.get("/readyz").status_code == 200
