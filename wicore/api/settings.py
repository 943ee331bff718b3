"""What one `wicore serve` allows: keys, rate limits, body limits, CORS, hosts, images, the page."""

from __future__ import annotations

from dataclasses import dataclass, field

from wicore.api.images import ImageSettings
from wicore.api.tools.formats import FORMATS


@dataclass(frozen=True)
class ServerSettings:
    model_name: str = "gemma3-270m"
    api_keys: tuple[str, ...] = ()
    rate_limit_rpm: float = 0.0  # requests per minute per key; 0 = no limit
    rate_limit_burst: int | None = None
    max_body_bytes: int | None = None  # None: `body_limit`'s default
    cors_origins: tuple[str, ...] = ()
    # Host header names accepted (any port); empty: any. Set when serving without a key on a
    # loopback address, so a web page cannot reach the server by DNS rebinding.
    allowed_hosts: tuple[str, ...] = ()
    failed_auth_per_minute: float = 30.0  # wrong or missing keys one client address may send
    body_timeout_seconds: float = 30.0  # the whole request body must arrive within this (slow-drip uploads)
    images: ImageSettings = field(default_factory=ImageSettings)  # limits of image inputs (wicore.api.images)
    web: bool = True  # the page at / (wicore.api.web); /v1/ws stays either way
    # Engine requests (choices) one connection may have queued or running (wicore.api.connections.
    # InFlight); None: a quarter of the engine's waiting queue; 0: no limit.
    max_requests_per_connection: int | None = None
    # A chat template (jinja source) that replaces the model's (--chat-template FILE); None: the
    # model's own, and chat requests are refused where the model has none (a base model).
    chat_template: str | None = None
    tool_call_parser: str | None = None  # the models' tool-call format (wicore.api.tools.formats); None: from the chat template

    def __post_init__(self) -> None:
        if self.rate_limit_rpm < 0 or (self.max_body_bytes is not None and self.max_body_bytes < 1):
            raise ValueError("rate_limit_rpm must be >= 0 and max_body_bytes >= 1")
        if self.tool_call_parser is not None and self.tool_call_parser not in FORMATS:
            raise ValueError(f"tool_call_parser {self.tool_call_parser!r}: choose one of {', '.join(FORMATS)}")
        if self.max_requests_per_connection is not None and self.max_requests_per_connection < 0:
            raise ValueError("max_requests_per_connection must be >= 0 (0: no limit)")

    def requests_per_connection(self, max_waiting: int) -> int:
        """The in-flight limit of one connection on an engine that queues `max_waiting` requests."""
        if self.max_requests_per_connection is not None:
            return self.max_requests_per_connection
        return max(1, max_waiting // 4)

    def body_limit(self, takes_images: bool, max_tokens: int) -> int:
        """--max-body-bytes, or by default room for a prompt of `max_tokens` tokens at 16 bytes each
        (a token id and its comma; a token's text, JSON-escaped, is ~4-9) and at least 1 MiB, or
        32 MiB for a model that takes images (base64 in the body)."""
        return self.max_body_bytes or max((32 if takes_images else 1) << 20, 16 * max_tokens)
