"""/v1/ws: the chat and completion endpoints over one WebSocket, several requests in flight.

    client                                              server
    {"type": "auth", "api_key": K}                 ─►                         (when keys are set)
                                                   ◄─  {"type": "auth", "ok": true}
    {"type": "chat", "id": "a", "body": {...}}     ─►  (a POST /v1/chat/completions body)
    {"type": "completion", "id": "b", "body": ...} ─►  (a POST /v1/completions body)
                                                   ◄─  {"type": "chunk", "id": "a", "chunk": {chat.completion.chunk}}
    {"type": "cancel", "id": "b"}                  ─►
                                                   ◄─  {"type": "done", "id": "b", "usage": {...}, "cancelled": true}
                                                   ◄─  {"type": "done", "id": "a", "usage": {...}, "cancelled": false}
                                                   ◄─  {"type": "error", "id": "c" or null, "status": 400, "error": {...}}

Shutdown: `OpenSockets.drain` closes every socket with no request in flight at once (1001, going
away) and each other one after its last request's frame; a request sent meanwhile gets a 503.

A request runs the HTTP endpoints' own code: API.prepare (the same parsing, checks and 400s),
API.start (queueing, all choices or none), streaming.chunks (the SSE chunk objects), the same
rate limit per message and the same OpenAI error objects, with the HTTP status beside them. Every
request ends with exactly one `done` or `error` frame. A socket that closes aborts its requests
(their KV blocks go back to the pool at the next engine step).

Auth: an `Authorization: Bearer KEY` header on the upgrade request, or (browsers cannot set
headers on a WebSocket) a message `{"type": "auth", "api_key": KEY}`, within the body timeout
of the upgrade (one deadline: other frames meanwhile do not extend it). Browsers are held to the same origins as CORS: the page's own, or a `--cors-origin`.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from starlette.websockets import WebSocket, WebSocketDisconnect

from wicore.api.auth import client_address
from wicore.api.errors import APIError, error_response
from wicore.api.streaming import chunks, stream_error

if TYPE_CHECKING:
    from wicore.api.app import API
    from wicore.api.generation import Generation

ROUTE = "/v1/ws"
KINDS = {"chat": True, "completion": False}  # request type -> is_chat
MAX_ID_CHARS = 256
POLICY_VIOLATION = 1008  # the close code of a socket that never authenticated in time
GOING_AWAY = 1001  # the close code of a socket the server closes because it is shutting down


def origin_allowed(headers: Any, cors_origins: tuple[str, ...]) -> bool:
    """A browser's page may open the socket from the server's own origin or a CORS origin;
    clients that send no Origin (not browsers) may too."""
    origin = headers.get("origin")
    if origin is None or "*" in cors_origins or origin in cors_origins:
        return True
    return urlsplit(origin).netloc == headers.get("host")


class OpenSockets:
    """The sockets open now, so that a shutdown can close them instead of waiting on idle ones."""

    def __init__(self) -> None:
        self.open: set[Connection] = set()
        self.is_draining = False

    async def drain(self) -> None:
        """From now on, close each socket once it has no request in flight (the idle ones now)."""
        self.is_draining = True
        await asyncio.gather(*(conn.close_if_idle() for conn in list(self.open)))


class Connection:
    """One open socket: its key, its requests in flight (client id -> task), one sender at a time."""

    def __init__(self, api: API, websocket: WebSocket) -> None:
        self.api = api
        self.ws = websocket
        self.client = client_address(websocket)
        self.is_authenticated = not api.settings.api_keys
        self.key: str | None = None
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.sockets: OpenSockets = api.sockets
        self.is_closed = False
        self._send_lock = asyncio.Lock()

    async def send(self, frame: dict[str, Any]) -> None:
        if self.is_closed:
            return
        async with self._send_lock:
            try:
                await self.ws.send_text(json.dumps(frame, ensure_ascii=False, separators=(",", ":")))
            except (WebSocketDisconnect, RuntimeError, OSError):  # gone: the receive loop ends the rest
                self.is_closed = True

    async def send_error(self, request_id: str | None, exc: APIError) -> None:
        frame: dict[str, Any] = {"type": "error", "id": request_id, "status": exc.status, **exc.body()}
        if "Retry-After" in exc.headers:
            frame["retry_after"] = int(exc.headers["Retry-After"])
        await self.send(frame)

    # -- the socket's life ------------------------------------------------------------
    async def serve(self) -> None:
        try:
            self.api.check_host(self.ws)
            if not origin_allowed(self.ws.headers, self.api.settings.cors_origins):
                raise APIError(403, f"origin {self.ws.headers['origin']!r} may not open this socket", code="bad_origin")
            authorization = self.ws.headers.get("authorization")
            if authorization is not None:
                self.key = self.api.authenticate(self.client, authorization)
                self.is_authenticated = True
        except APIError as exc:  # refused before it opened: an HTTP answer in OpenAI's shape
            await self.ws.send_denial_response(error_response(exc))
            return
        await self.ws.accept()
        self.sockets.open.add(self)
        try:
            if not self.sockets.is_draining:
                await self._receive_all()
        finally:
            self.sockets.open.discard(self)
            self.is_closed = True
            tasks = list(self.tasks.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _receive_all(self) -> None:
        """Messages until the socket closes; one that has not authenticated within the body
        timeout of its upgrade is closed, however many frames it sends meanwhile."""
        timeout = self.api.settings.body_timeout_seconds
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                if self.is_authenticated:
                    message = await self.ws.receive()
                else:
                    left = deadline - asyncio.get_running_loop().time()
                    if left <= 0:
                        raise asyncio.TimeoutError
                    message = await asyncio.wait_for(self.ws.receive(), left)
            except asyncio.TimeoutError:
                await self.ws.close(POLICY_VIOLATION, f"no auth message within {timeout:g} s")
                return
            if message["type"] == "websocket.disconnect":
                return
            await self.handle(message.get("text"))

    async def close_if_idle(self) -> None:
        """Close the socket (going away) when the server drains and no request runs on it."""
        if self.is_closed or self.tasks or not self.sockets.is_draining:
            return
        self.is_closed = True
        async with self._send_lock:
            try:
                await self.ws.close(GOING_AWAY, "the server is shutting down")
            except (WebSocketDisconnect, RuntimeError, OSError):
                pass

    # -- one message ------------------------------------------------------------------
    async def handle(self, text: str | None) -> None:
        request_id, kind = None, None
        try:
            if text is None:
                raise APIError(400, "send text frames of JSON, not binary ones", code="invalid_message")
            message = self.api.read_message(text)
            if not isinstance(message, dict):
                raise APIError(400, "a message must be a JSON object with a 'type'", param="type", code="invalid_message")
            kind = message.get("type")
            if kind not in ("auth", "cancel", *KINDS):
                request_id = readable_id(message)  # the error frame still says which request it answers
                raise APIError(
                    400, f"type: expected auth, chat, completion or cancel, got {kind!r}", param="type", code="invalid_message"
                )
            if kind == "auth":
                await self.authenticate(message)
                return
            request_id = self.request_id(message)
            if kind == "cancel":
                await self.cancel(request_id)
            else:
                self.submit(request_id, KINDS[kind], message.get("body"))
        except Exception as exc:  # an error frame; the socket and its other requests go on
            error = stream_error(exc, request_id)
            if kind in ("chat", "completion"):  # a request refused before it ran (auth, rate, id): counted as HTTP's are
                self.api.metrics.observe_request(ROUTE, error.status)
            await self.send_error(request_id, error)

    @staticmethod
    def request_id(message: dict[str, Any]) -> str:
        value = message.get("id")
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
            raise APIError(400, f"id: expected a string of 1 to {MAX_ID_CHARS} characters", param="id", code="invalid_message")
        return value

    async def authenticate(self, message: dict[str, Any]) -> None:
        key = message.get("api_key")
        self.key = self.api.authenticate(self.client, f"Bearer {key}" if isinstance(key, str) else None)
        self.is_authenticated = True
        await self.send({"type": "auth", "ok": True})

    def submit(self, request_id: str, is_chat: bool, body: Any) -> None:
        if not self.is_authenticated:
            raise APIError(401, 'missing API key: send {"type": "auth", "api_key": KEY} first', code="invalid_api_key")
        if self.sockets.is_draining:
            raise APIError(503, "the server is shutting down: retry on another server", code="server_shutting_down")
        if request_id in self.tasks:
            raise APIError(400, f"id: request {request_id!r} is still running on this socket", param="id", code="duplicate_id")
        self.api.check_rate(self.key or self.client)
        self.tasks[request_id] = asyncio.create_task(self.run(request_id, is_chat, body))

    async def cancel(self, request_id: str) -> None:
        task = self.tasks.get(request_id)
        if task is None:
            raise APIError(404, f"id: no request {request_id!r} is running on this socket", param="id", code="not_running")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def run(self, request_id: str, is_chat: bool, body: Any) -> None:
        """One request, from its body to its `done` or `error` frame; cancelled, it aborts."""
        gen: Generation | None = None
        error: APIError | None = None
        status = 200
        try:
            gen = self.api.start(await self.api.prepare(is_chat, body), connection=self)  # this socket's share
            async for c in chunks(gen.base, is_chat, gen.choices, gen.usage, False, gen.logprobs, self.api.streams):
                await self.send({"type": "chunk", "id": request_id, "chunk": c})
        except asyncio.CancelledError:
            status = 499
            if self.is_closed:  # the socket went away (or the server is stopping): nobody to tell
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]  # the client's cancel, answered below
        except Exception as exc:
            error = stream_error(exc, request_id)
            status = error.status
        finally:
            if gen is not None:
                gen.abort()
            self.tasks.pop(request_id, None)  # before the last frame: the client may reuse the id
            self.api.metrics.observe_request(ROUTE, status)
        if error is not None:
            await self.send_error(request_id, error)
        else:
            usage = None if gen is None else gen.usage()  # None: cancelled before it was queued
            await self.send({"type": "done", "id": request_id, "usage": usage, "cancelled": status == 499})
        await self.close_if_idle()


def readable_id(message: dict[str, Any]) -> str | None:
    """The message's id where it is a valid one, else None (for an error frame about the message)."""
    try:
        return Connection.request_id(message)
    except APIError:
        return None


async def websocket_route(websocket: WebSocket) -> None:
    await Connection(websocket.app.state.api, websocket).serve()
