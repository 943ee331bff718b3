"""The gate in front of every route: the Host header, the API key, the rate limits and the body's size.

request ─► check_host ─► authenticate (401; 10 quick failures from one address: 429)
        ─► check_rate (per key, or per address without keys) ─► read_json (413, 415, 408)
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import ClientDisconnect, HTTPConnection, Request

from wicore.api.auth import Authenticator, client_address
from wicore.api.errors import APIError
from wicore.api.http import parse_json
from wicore.api.ratelimit import RateLimiter
from wicore.api.settings import ServerSettings

FAILED_KEY_LOCKOUT = "failed_key_lockout"  # the code of the 429 after too many failed keys from one address


class Gate:
    """Who may ask (Host, API key, rate) and how much they may send (`body_limit` bytes)."""

    def __init__(self, settings: ServerSettings, body_limit: int) -> None:
        self.settings = settings
        self.body_limit = body_limit
        self.auth = Authenticator(settings.api_keys)
        self.limiter = RateLimiter(settings.rate_limit_rpm, settings.rate_limit_burst) if settings.rate_limit_rpm else None
        self.failed_auth = RateLimiter(
            settings.failed_auth_per_minute,
            burst=10,
            reason="failed-key lockout: too many wrong or missing API keys from this address",
            code=FAILED_KEY_LOCKOUT,
        )

    def guard(self, request: Request) -> None:
        client = client_address(request)
        self.check_host(request)
        key = self.authenticate(client, request.headers.get("authorization"))
        self.check_rate(key or client)

    def authenticate(self, client: str, authorization: str | None) -> str | None:
        """The key an Authorization header carries (None when auth is off), or a 401."""
        try:
            return self.auth.check(authorization)
        except APIError:
            self.failed_auth.check(client)  # past 10 quick failures from one address: 429s
            raise

    def check_rate(self, key: str) -> None:
        """A 429 when `key` (the API key, or the client address without keys) is over its rate."""
        if self.limiter is not None:
            self.limiter.check(key)

    def check_host(self, conn: HTTPConnection) -> None:
        allowed = self.settings.allowed_hosts
        if allowed:
            host = conn.headers.get("host", "")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if name.strip("[]") not in allowed:
                raise APIError(400, f"Host {host!r} is not served here (set an API key to serve other names)", code="bad_host")

    async def read_json(self, request: Request) -> Any:
        limit = self.body_limit
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise APIError(413, f"the request body has {declared} bytes; the limit is {limit}", code="body_too_large")
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if not self.settings.api_keys and kind != "application/json":  # a cross-site form cannot send JSON
            raise APIError(415, f"Content-Type must be application/json, not {kind or 'none'!r}", code="unsupported_media_type")
        body = bytearray()

        async def receive() -> None:
            async for chunk in request.stream():
                body.extend(chunk)
                if len(body) > limit:
                    raise APIError(413, f"the request body is over the limit of {limit} bytes", code="body_too_large")

        timeout = self.settings.body_timeout_seconds
        try:
            await asyncio.wait_for(receive(), timeout)
        except ClientDisconnect:  # gone mid-body: nobody to answer, nothing to log
            raise APIError(499, "the client closed the connection", code="client_closed") from None
        except asyncio.TimeoutError:
            raise APIError(408, f"the request body did not arrive within {timeout:g} s", code="request_timeout") from None
        return parse_json(body)

    def read_message(self, text: str) -> Any:
        """A WebSocket message (wicore.api.websocket) as JSON, held to the body limit."""
        limit = self.body_limit
        if len(text) > limit or len(text.encode("utf-8", "surrogatepass")) > limit:
            raise APIError(413, f"the message is over the limit of {limit} bytes", code="body_too_large")
        return parse_json(text)
