"""Limits on the HTTP listener that hold before any request reaches the app (and so before
authentication): request-line length, header count and bytes, a deadline for the request
head, an idle timeout, and a connection limit that slow clients cannot fill.

uvicorn's httptools protocol has none of the first four: a client could send gigabytes of
headers (the parser keeps a header whole until it ends), a 200 MB URL, or trickle its head
forever. Its connection limit (`limit_concurrency`) answered 503 to everyone once that many
connections were open, which 1,000 connections sending a byte a second achieved. Here:

- the request head (request line and headers) may take `max_head_bytes` and `max_headers`
  headers, the request line `max_request_line_bytes`; past them 431 / 414 and close;
- the head must be complete within `head_timeout_s` of its first byte, else the connection
  is closed; a connection with no request in progress is closed after `idle_timeout_s`;
- at `max_connections` open connections a new one closes the connection that has waited
  longest for a request head (idle or slow), else the one whose request body has been
  trickling in longest (over `SLOW_BODY_S`); only when every connection is serving a request
  is the new one answered 503 and closed.

Subclasses uvicorn's protocol (`uvicorn.protocols.http.httptools_impl`, uvicorn 0.55) and
keeps its parsing and ASGI cycle; the hooks used are its parser callbacks and
`data_received`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from railtrace.settings import Settings


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_request_line_bytes: int = 8192
    max_headers: int = 100
    max_head_bytes: int = 64 * 1024
    head_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0
    max_connections: int = 1000


def http_limits(settings: Settings) -> HttpLimits:
    return HttpLimits(
        max_request_line_bytes=settings.max_request_line_bytes,
        max_headers=settings.max_headers,
        max_head_bytes=settings.max_head_bytes,
        head_timeout_s=settings.head_timeout_s,
        idle_timeout_s=settings.idle_timeout_s,
        max_connections=settings.max_connections,
    )


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a head over a limit."""


STATUS = {
    414: b"HTTP/1.1 414 URI Too Long\r\n",
    431: b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
    503: b"HTTP/1.1 503 Service Unavailable\r\n",
}


def bounded_protocol(limits: HttpLimits) -> type[HttpToolsProtocol]:
    """A protocol class for `uvicorn.Config(http=...)` that enforces `limits`."""

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._limits = limits
            self.timeout_keep_alive = limits.idle_timeout_s  # uvicorn's own setting takes whole seconds
            self._in_head = False  # a request's head has begun and is not complete
            self._waiting_since = time.monotonic()  # for a request head, since (idle or slow)
            self._head_bytes = 0
            self._header_count = 0
            self._refused: tuple[int, str] | None = None
            self._head_timer: asyncio.TimerHandle | None = None
            self._body_since = 0.0

        # -- connections -----------------------------------------------------------------

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= self._limits.max_connections and not _evict_one(self.connections):
                transport.write(_response(503, "too many connections"))
                transport.close()
                self.transport = transport
                return
            super().connection_made(transport)
            self._waiting_since = time.monotonic()
            self._arm_idle()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            if self.flow is None:  # refused in connection_made: uvicorn never set it up
                return
            super().connection_lost(exc)

        def _arm_idle(self) -> None:
            self._unset_keepalive_if_required()
            self.timeout_keep_alive_task = self.loop.call_later(
                self._limits.idle_timeout_s, self.timeout_keep_alive_handler
            )

        def on_response_complete(self) -> None:
            super().on_response_complete()  # arms the idle timer (`timeout_keep_alive`)
            self._waiting_since = time.monotonic()

        @property
        def waiting_for_head(self) -> bool:
            """No request of this connection is being served: idle, or its head still coming."""
            return self.cycle is None or self.cycle.response_complete or self._in_head

        # -- the request head ------------------------------------------------------------

        def data_received(self, data: bytes) -> None:
            if self._refused is not None or self.transport.is_closing():
                return
            if self.waiting_for_head:
                self._head_bytes += len(data)
                if self._head_timer is None:  # the first byte of a head: its deadline starts
                    self._head_timer = self.loop.call_later(self._limits.head_timeout_s, self._head_timeout)
            super().data_received(data)
            if self._refused is None and self._in_head and self._head_bytes > self._limits.max_head_bytes:
                self._refuse(431, "request head too large")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head = True
            self._header_count = 0

        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            if len(self.url) > self._limits.max_request_line_bytes:
                self._refused = (414, "request line too long")
                raise _Refused

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_count += 1
            if self._header_count > self._limits.max_headers:
                self._refused = (431, "too many headers")
                raise _Refused
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._body_since = time.monotonic()
            self._cancel_head_timer()
            super().on_headers_complete()

        @property
        def receiving_body_since(self) -> float | None:
            """When this connection's request began sending its body, if it still is."""
            cycle = self.cycle
            if cycle is None or cycle.response_complete or not cycle.more_body:
                return None
            return self._body_since

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._head_bytes = 0

        def send_400_response(self, msg: str) -> None:
            if self._refused is not None:  # a callback above stopped the parser
                status, message = self._refused
                self._refused = None
                self._refuse(status, message)
                return
            super().send_400_response(msg)

        def _refuse(self, status: int, message: str) -> None:
            self._refused = (status, message)
            self._cancel_head_timer()
            if not self.transport.is_closing():
                self.transport.write(_response(status, message))
                self.transport.close()

        def _head_timeout(self) -> None:
            """Still no complete head (a slow client, or bytes that never form a request)."""
            self._head_timer = None
            if self.waiting_for_head and not self.transport.is_closing():
                self.transport.close()

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def timeout_keep_alive_handler(self) -> None:
            if self._head_timer is not None:
                return  # a head has begun: its own deadline governs
            super().timeout_keep_alive_handler()

    return BoundedHttpToolsProtocol


# A request whose body has been arriving for longer than this may be closed to make room for
# a new connection when every connection is busy (an export's body takes milliseconds).
SLOW_BODY_S = 2.0


def _evict_one(connections: set[Any]) -> bool:
    """Make room: close the connection that has waited longest for a request head; failing
    that, the one whose request body has been arriving longest, if for over SLOW_BODY_S (a
    client trickling its body; its export was not acknowledged, so its exporter retries).
    False if every connection is serving a request."""
    open_ = [c for c in connections if c.transport is not None and not c.transport.is_closing()]
    waiting = [c for c in open_ if getattr(c, "waiting_for_head", False)]
    if waiting:
        victim = min(waiting, key=lambda c: c._waiting_since)
    else:
        now = time.monotonic()
        slow = [
            (since, c)
            for c in open_
            if (since := getattr(c, "receiving_body_since", None)) is not None and now - since > SLOW_BODY_S
        ]
        if not slow:
            return False
        victim = min(slow, key=lambda sc: sc[0])[1]
    victim.transport.close()
    connections.discard(victim)
    return True


def _response(status: int, message: str) -> bytes:
    body = message.encode()
    return (
        STATUS[status]
        + b"content-type: text/plain; charset=utf-8\r\n"
        + b"content-length: "
        + str(len(body)).encode()
        + b"\r\nconnection: close\r\n\r\n"
        + body
    )
