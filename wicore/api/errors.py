"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}`, one mapping from WiCore's.

APIError(status, message, param=...)  raised anywhere in a route
error_response(exc)                   the JSONResponse a client sees
CORSMiddleware                        Starlette's, with a refused preflight in that shape

What Hypercorn answers itself, before the app sees a request, it answers with an empty body
(Hypercorn 0.18 has no hook for it): a 400 for bytes that are not HTTP/1.1 (h11 cannot parse
them), a 431 for headers still incomplete past 16 KiB (h11's max incomplete size), and no reply
at all to a connection closed for not finishing its headers in time (docs/API.md, "Errors").
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware as StarletteCORSMiddleware
from starlette.responses import JSONResponse, Response

from wicore.errors import ContextLengthError, EngineDiedError, OverloadedError, RequestError, StructuredOutputError, WiCoreError

# HTTP status -> OpenAI error type, where it is not invalid_request_error (4xx) or server_error (5xx).
_TYPES = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}


class APIError(Exception):
    """An error a route returns to the client as is."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error"),
                "param": self.param,
                "code": self.code,
            }
        }


def from_wicore(exc: WiCoreError, param: str | None = None) -> APIError:
    """A user-fixable engine error as the HTTP error a client can act on; `param` names the
    request field a prompt error is about."""
    if isinstance(exc, ContextLengthError):
        return APIError(400, str(exc), param=param, code="context_length_exceeded")
    if isinstance(exc, StructuredOutputError):  # the constraint, not the prompt, is what is wrong
        return APIError(400, str(exc), param=exc.field, code="invalid_schema")
    if isinstance(exc, EngineDiedError):  # the server is stopping: another one may answer
        return APIError(503, str(exc), code="engine_died")
    if isinstance(exc, OverloadedError):
        return APIError(503, str(exc), code="overloaded", headers={"Retry-After": "1"})
    if isinstance(exc, RequestError):
        return APIError(400, str(exc), param=param, code="invalid_request")
    return APIError(500, str(exc), code="internal_error")


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


class CORSMiddleware(StarletteCORSMiddleware):
    """Starlette's CORS middleware; a preflight it refuses is a 400 in OpenAI's shape (Starlette
    answers text/plain "Disallowed CORS origin")."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        refused = bytes(response.body).decode().removeprefix("Disallowed CORS ")  # "origin, method, headers"
        origin = request_headers["origin"]
        message = f"CORS preflight from {origin!r} refused: its {refused} is not allowed (see wicore serve --cors-origin)"
        headers = {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}
        return error_response(APIError(400, message, code="cors_not_allowed", headers=headers))
