"""Limits on connections: how many may be open and how long headers may take (below the app),
how many engine requests one may have in flight (`InFlight`, in the app), and the watch that
cancels a request's work when its client goes away (`until_disconnect`).

Hypercorn has no cap on open connections (pgjones/hypercorn#81), so the listening socket is
wrapped: accepting one past `max_connections` writes a 503 in OpenAI's error shape and closes
it at once (a client that already sent its request may see a reset instead), and every
accepted socket counts itself out when it closes. A connection that has not finished a
request's headers within `header_timeout_seconds` (or sits idle that long between requests) is
closed by Hypercorn's keep-alive timer; a body must then arrive within ServerSettings'
`body_timeout_seconds` (a 408 from the app). Hypercorn's own `read_timeout` stays off: it
would cut a long stream, whose client sends nothing while it reads.

A slot is freed when the server closes its socket. Hypercorn (0.18) notices a client closing
an idle connection (after a response, or before sending a byte) only when that connection's
keep-alive timer ends, so such a connection holds its slot, and its file descriptor, for up to
`header_timeout_seconds`: clients that open a connection per request and close it can open at
most max_connections / header_timeout_seconds a second (50 with the defaults) before new ones
get the 503. Raise max_connections, or lower the header timeout, for such clients.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.requests import HTTPConnection, Request

from wicore.api.errors import APIError

T = TypeVar("T")


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 1000  # open TCP connections (each holds a file descriptor)
    header_timeout_seconds: float = 20.0  # to send a request's headers, or to idle between requests

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.header_timeout_seconds <= 0:
            raise ValueError("max_connections must be >= 1 and header_timeout_seconds > 0")

    def refusal(self) -> bytes:
        """The whole HTTP response a connection past the limit gets."""
        message = f"the server has {self.max_connections} connections open, its limit; retry later"
        body = json.dumps(
            {"error": {"message": message, "type": "server_error", "param": None, "code": "too_many_connections"}}
        ).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
            f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body


DEFAULT_LIMITS = ConnectionLimits()


class LimitedListener(socket.socket):
    """A listening socket that accepts at most `limits.max_connections` open connections.

    asyncio's accept loop calls accept() on the socket it was given, here this one; it stops
    at ConnectionAbortedError and tries again when the socket is next readable.
    """

    def __init__(self, listener: socket.socket, limits: ConnectionLimits) -> None:
        super().__init__(listener.family, listener.type, listener.proto, fileno=listener.detach())
        self.limits = limits
        self.num_open = 0

    def accept(self) -> tuple[socket.socket, Any]:
        fd, address = self._accept()  # type: ignore[attr-defined]
        if self.num_open >= self.limits.max_connections:
            with socket.socket(self.family, self.type, self.proto, fileno=fd) as refused:
                refused.setblocking(False)
                try:
                    refused.send(self.limits.refusal())  # a few hundred bytes: an empty send buffer takes them
                except OSError:
                    pass
            raise ConnectionAbortedError("connection limit reached")
        self.num_open += 1
        return _Counted(self, fd), address


class _Counted(socket.socket):
    """An accepted connection that takes itself off its listener's count once, when closed."""

    def __init__(self, listener: LimitedListener, fd: int) -> None:
        super().__init__(listener.family, listener.type, listener.proto, fileno=fd)
        self._listener: LimitedListener | None = listener

    def close(self) -> None:
        if self._listener is not None:
            self._listener.num_open -= 1
            self._listener = None
        super().close()


class InFlight:
    """Engine requests (choices) in flight per connection, so that one client cannot take the
    whole waiting queue: a connection that already has some in flight and would pass `limit`
    gets a 429 (its first request always passes: the queue's own limits apply to it). A
    connection is a WebSocket, or an HTTP connection (all the streams of an HTTP/2 one)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # 0: no limit
        self.counts: dict[Hashable, int] = {}

    def claim(self, connection: Hashable | None, num_requests: int) -> Callable[[], None]:
        """Count `num_requests` for `connection`; returns the callable that gives them back (once)."""
        if connection is None or self.limit <= 0:
            return lambda: None
        held = self.counts.get(connection, 0)
        if held and held + num_requests > self.limit:
            raise APIError(
                429,
                f"this connection has {held} requests queued or running and may have at most {self.limit} "
                "(each choice counts): wait for some to finish",
                code="too_many_in_flight",
                headers={"Retry-After": "1"},
            )
        self.counts[connection] = held + num_requests
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            left = self.counts.get(connection, 0) - num_requests
            if left > 0:
                self.counts[connection] = left
            else:
                self.counts.pop(connection, None)

        return release


def connection_of(conn: HTTPConnection) -> Hashable | None:
    """What identifies the connection a request came on: its client's address and port (the
    streams of one HTTP/2 connection share them)."""
    client = conn.scope.get("client")
    return None if client is None else tuple(client)


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result; if the client goes away first (a closed connection, an HTTP/2
    RST_STREAM: both reach the app as http.disconnect), cancel it, which aborts its engine
    requests, and raise the 499 that counts it."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise APIError(499, "the client closed the connection", code="client_closed")
    return task.result()  # re-raises the work's error
