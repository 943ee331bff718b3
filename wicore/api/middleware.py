"""Two guards around the routes, inside the status counter and CORS (so both see their answers).

    StatusCounter ─► CORS ─► HeaderLimit ─► InternalErrors ─► Starlette's exception handlers ─► routes

HeaderLimit     a request whose request line and headers exceed 16 KiB gets a 431 in OpenAI's
                shape. Hypercorn's h11 refuses headers still incomplete past 16 KiB, but takes
                larger ones that arrive complete in one read.
InternalErrors  an exception no handler took becomes one logged traceback (with a request id)
                and a 500 in OpenAI's shape. Starlette's own last-resort handler re-raises after
                answering so that the server logs it too: every 500 was logged twice.
"""

from __future__ import annotations

import logging
import uuid

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from wicore.api.errors import APIError, error_response

log = logging.getLogger("wicore.api")

MAX_HEADER_BYTES = 16 << 10  # h11's max incomplete event size, which Hypercorn uses


def header_bytes(scope: Scope) -> int:
    """The bytes of a request's line and headers, as sent (give or take the separators)."""
    line = len(scope.get("method", "GET")) + len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + 12
    return line + sum(len(name) + len(value) + 4 for name, value in scope.get("headers", ()))


class HeaderLimit:
    def __init__(self, app: ASGIApp, max_bytes: int = MAX_HEADER_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or header_bytes(scope) <= self.max_bytes:
            await self.app(scope, receive, send)
            return
        size = header_bytes(scope)
        error = APIError(431, f"the request's headers have {size} bytes; the limit is {self.max_bytes}", code="headers_too_large")
        if scope["type"] == "websocket":  # refused before the upgrade
            await send({"type": "websocket.close", "code": 1008, "reason": error.message[:120]})
            return
        await error_response(error)(scope, receive, send)


class InternalErrors:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            if started:  # too late to answer: the server logs it, once
                raise
            await internal_error(scope, exc)(scope, receive, send)


def internal_error(scope: Scope, exc: BaseException) -> Response:
    """The 500 of a bug while serving one request; its traceback goes to the log under an id."""
    request_id = uuid.uuid4().hex[:12]
    log.error("request %s (%s %s) failed", request_id, scope.get("method"), scope.get("path"), exc_info=exc)
    return error_response(APIError(500, f"internal error (request {request_id}); see the server log", code="internal_error"))
