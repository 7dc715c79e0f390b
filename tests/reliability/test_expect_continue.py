"""`Expect: 100-continue` with a declared body over the limit: an immediate 413 and a closed
connection, never `100 Continue` (which made such a client send 17 MiB for nothing, or wait
`body_timeout_s` for a 413 when it did not). Within the limit the client is told to continue."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from railtrace.server.runner import Service
from railtrace.settings import Settings
from tests.reliability.reliability_helpers import PROTOBUF

HEAD = (
    "POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {media}\r\n"
    "Content-Length: {length}\r\nExpect: 100-continue\r\n\r\n"
)


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    db = tmp_path_factory.mktemp("expect") / "e.db"
    with Service(Settings(db=f"sqlite:///{db}", port=0, grpc_port=0, topology=[])) as service:
        yield service


def _connect(svc: Service) -> socket.socket:
    return socket.create_connection(("127.0.0.1", svc.http_port), timeout=10)


def _read_until_closed(sock: socket.socket, deadline_s: float) -> bytes:
    got = b""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            return got
        got += chunk
    raise AssertionError(f"connection still open after {deadline_s}s; read {got[:200]!r}")


@pytest.mark.parametrize("media", [PROTOBUF, "application/json"])
def test_a_declared_17_mib_body_is_refused_before_100_continue(svc: Service, media: str) -> None:
    length = 17 * 1024 * 1024  # the default limit is 16 MiB; under the 64 MiB drained ones
    started = time.monotonic()
    with _connect(svc) as sock:
        sock.sendall(HEAD.format(media=media, length=length).encode())
        answer = _read_until_closed(sock, 10)
    took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"100 Continue" not in answer
    assert b"connection: close" in answer.lower()
    assert took < 5, took  # answered at once, not after body_timeout_s (30 s)


def test_a_body_within_the_limit_is_told_to_continue(svc: Service) -> None:
    with _connect(svc) as sock:
        sock.sendall(HEAD.format(media=PROTOBUF, length=0).encode().replace(b"Length: 0", b"Length: 2"))
        assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(b"\x0a\x00")  # one empty ResourceSpans
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    body = answer.split(b"\r\n\r\n", 1)[1]
    assert not ExportTraceServiceResponse.FromString(body).HasField("partial_success")
