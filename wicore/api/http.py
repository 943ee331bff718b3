"""HTTP plumbing the app's routes share: JSON bodies, and the error responses of the Starlette app
(the connection a request came on and the disconnect watcher are wicore.api.connections)."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from wicore.api.errors import APIError, error_response, from_wicore
from wicore.api.middleware import internal_error
from wicore.errors import WiCoreError

T = TypeVar("T")


def parse_json(body: bytes | bytearray | str) -> Any:
    """A request body (or a WebSocket message) as JSON, or the 400 that says what is wrong with it."""
    try:
        value = json.loads(body)
    except ValueError as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise APIError(400, "the request body's JSON is nested too deeply", code="invalid_json") from None
    try:  # JSON's \ud800 escapes can make strings no tokenizer (or UTF-8) takes
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(
            400, "the request body has a lone surrogate (an unpaired \\ud800-\\udfff escape)", code="invalid_json"
        ) from None
    return value


async def client_error(request: Request, exc: Exception) -> Response:
    """An APIError as it is; WiCore's errors and Starlette's own (404, 405) as the APIError they stand for."""
    if isinstance(exc, WiCoreError):
        exc = from_wicore(exc)
    elif isinstance(exc, HTTPException):  # its headers too: a 405's Allow
        exc = APIError(exc.status_code, str(exc.detail), code="http_error", headers=dict(exc.headers or {}))
    assert isinstance(exc, APIError)
    return error_response(exc)


async def internal_error_response(request: Request, exc: Exception) -> Response:
    """Starlette's last resort, for a bug in the middleware around InternalErrors (wicore.api.middleware)."""
    return internal_error(request.scope, exc)
