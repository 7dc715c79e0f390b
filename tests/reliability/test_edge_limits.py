"""Bounds of the HTTP and gRPC listeners before authentication: request-line length, header
count and bytes, a deadline for the request head, an idle timeout, and a connection limit that
slow clients cannot fill (normal exports and /readyz still answer while they hold it).
The long runs (1,000 slow connections, gigabyte floods) are benchmarks/reliability/edge_attacks.py."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from railtrace.server.runner import Service
from railtrace.settings import Settings
from tests.reliability.reliability_helpers import EXPORT_PATH, post

HEAD_TIMEOUT = 1.0
IDLE_TIMEOUT = 1.5
MAX_CONNECTIONS = 40


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    db = tmp_path_factory.mktemp("limits") / "l.db"
    s = Settings(
        db=f"sqlite:///{db}",
        port=0,
        grpc_port=0,
        topology=[],
        ingest_token="secret",
        head_timeout_s=HEAD_TIMEOUT,
        idle_timeout_s=IDLE_TIMEOUT,
        max_connections=MAX_CONNECTIONS,
        max_request_line_bytes=4096,
        max_headers=50,
        max_head_bytes=16 * 1024,
    )
    with Service(s) as service:
        yield service


def _connect(svc: Service) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", svc.http_port), timeout=10)
    return s


def _send_until_closed(s: socket.socket, first: bytes, filler: bytes, limit: int) -> int:
    """Bytes of `filler` sent after `first` before the service closed (or `limit`)."""
    sent = 0
    try:
        s.sendall(first)
        while sent < limit:
            s.sendall(filler)
            sent += len(filler)
    except OSError:
        pass
    return sent


def _status(s: socket.socket) -> str:
    try:
        return s.recv(200).split(b"\r\n", 1)[0].decode()
    except OSError as exc:
        return type(exc).__name__


def _closed_within(s: socket.socket, seconds: float) -> float | None:
    """Seconds until the service closed `s`, or None if still open after `seconds`."""
    start = time.monotonic()
    s.settimeout(seconds)
    try:
        while s.recv(4096):
            pass
        return time.monotonic() - start
    except TimeoutError:
        return None
    except OSError:
        return time.monotonic() - start


def test_a_long_request_line_is_414_before_it_is_read_whole(svc: Service) -> None:
    with _connect(svc) as s:
        sent = _send_until_closed(s, b"GET /", b"a" * 4096, 64 << 20)
        assert _status(s) == "HTTP/1.1 414 URI Too Long" or sent < 1 << 20
        assert sent < 8 << 20  # cut off, not 64 MiB read


def test_too_many_headers_is_431(svc: Service) -> None:
    with _connect(svc) as s:
        head = (
            b"GET /readyz HTTP/1.1\r\nHost: a\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(60)) + b"\r\n"
        )
        s.sendall(head)
        assert _status(s) == "HTTP/1.1 431 Request Header Fields Too Large"


def test_a_header_flood_is_431_and_cut_off(svc: Service) -> None:
    with _connect(svc) as s:
        sent = _send_until_closed(s, b"POST /v1/traces HTTP/1.1\r\nX-A: ", b"a" * 65536, 256 << 20)
        assert sent < 16 << 20, sent  # a gigabyte-header client is stopped at the limit
        assert _status(s) in ("HTTP/1.1 431 Request Header Fields Too Large", "ConnectionResetError", "")


def test_a_head_trickled_a_byte_at_a_time_is_cut_off_at_its_deadline(svc: Service) -> None:
    with _connect(svc) as s:
        s.sendall(b"GET /readyz HTTP/1.1\r\n")
        start = time.monotonic()
        closed = False
        while time.monotonic() - start < HEAD_TIMEOUT + 5:
            try:
                s.sendall(b"X")
            except OSError:
                closed = True
                break
            s.settimeout(0.2)
            try:
                if s.recv(100) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
            except OSError:
                closed = True
                break
        assert closed, "a trickled head kept its connection"
        assert time.monotonic() - start < HEAD_TIMEOUT + 3


def test_idle_connections_are_closed(svc: Service) -> None:
    with _connect(svc) as fresh, _connect(svc) as used:
        used.sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
        assert _status(used) == "HTTP/1.1 200 OK"
        assert (_closed_within(fresh, IDLE_TIMEOUT + 3) or 99) < IDLE_TIMEOUT + 3
        assert (_closed_within(used, IDLE_TIMEOUT + 3) or 99) < IDLE_TIMEOUT + 3


def test_slow_clients_holding_every_connection_do_not_shut_out_exports(svc: Service) -> None:
    """Twice the connection limit of clients trickling their heads: exports (with the token)
    and /readyz still answer 200, because a new connection displaces the longest-waiting one."""
    stop = threading.Event()
    slow: list[socket.socket] = []
    for _ in range(2 * MAX_CONNECTIONS):
        s = _connect(svc)
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nX-Slow: ")
        slow.append(s)

    def trickle() -> None:
        while not stop.is_set():
            for s in slow:
                with contextlib.suppress(OSError):
                    s.sendall(b"a")
            stop.wait(0.2)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        body = ExportTraceServiceRequest().SerializeToString()
        codes = []
        with httpx.Client(base_url=svc.http_url, timeout=10) as client:
            for _ in range(10):
                codes.append(client.get("/readyz").status_code)
                r = post(client, body, authorization="Bearer secret")
                codes.append(r.status_code)
                time.sleep(0.1)
        assert set(codes) == {200}, codes
    finally:
        stop.set()
        t.join(5)
        for s in slow:
            s.close()


def test_slow_bodies_holding_every_connection_do_not_shut_out_exports(svc: Service) -> None:
    """Clients that send their head at once and then trickle a body (each request in progress,
    for up to `body_timeout_s`) on every connection: new exports are still served."""
    slow: list[socket.socket] = []
    head = b"POST /v1/traces HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer secret\r\n"
    head += b"Content-Type: application/x-protobuf\r\nContent-Length: 100000\r\n\r\n"
    for _ in range(MAX_CONNECTIONS):
        s = _connect(svc)
        s.sendall(head + b"\n")
        slow.append(s)
    try:
        time.sleep(2.5)  # past SLOW_BODY_S
        body = ExportTraceServiceRequest().SerializeToString()
        codes = []
        with httpx.Client(base_url=svc.http_url, timeout=10) as client:
            for _ in range(5):
                codes.append(client.get("/readyz").status_code)
                codes.append(post(client, body, authorization="Bearer secret").status_code)
        assert set(codes) == {200}, codes
    finally:
        for s in slow:
            s.close()


def test_grpc_metadata_over_the_limit_is_refused_and_calls_still_work(svc: Service) -> None:
    with grpc.insecure_channel(svc.grpc_endpoint) as channel:
        call = channel.unary_unary(EXPORT_PATH)
        body = ExportTraceServiceRequest().SerializeToString()
        with pytest.raises(grpc.RpcError):
            call(body, metadata=[("x-big", "a" * 64 * 1024), ("authorization", "Bearer secret")], timeout=10)
        assert call(body, metadata=[("authorization", "Bearer secret")], timeout=10) == b""
