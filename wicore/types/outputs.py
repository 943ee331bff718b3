"""What a request is asked with besides its sampling (`Priority`) and what the engine reports
back (`RequestOutput` each step, `Completion` at the end of `Engine.generate`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from wicore.errors import RequestError
from wicore.types.sampling import Logprobs


class Priority(enum.IntEnum):
    LOW = 0
    NORMAL = 1
    HIGH = 2
    URGENT = 3

    @classmethod
    def parse(cls, value: str | int | Priority) -> Priority:
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                raise RequestError(f"priority {value!r}: choose low, normal, high or urgent") from None
        return cls(value)


@dataclass(frozen=True)
class RequestOutput:
    """What one step produced for a request: its new tokens, and whether it ended.

    `logprobs`, when the request asked for them, holds one entry per new token, in order.
    `prompt_logits`, when asked for, come with the first token: [num_prompt_tokens, vocab].
    """

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None = None  # "stop", "length", "abort", "deadline", "error"
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    error: str | None = None
    logprobs: list[Logprobs] | None = None
    prompt_logits: np.ndarray | None = None


@dataclass(frozen=True)
class Completion:
    """One request run to its end by `Engine.generate`."""

    token_ids: list[int]
    finish_reason: str | None
    num_prompt_tokens: int
    error: str | None = None
    prompt_logits: np.ndarray | None = None  # [num_prompt_tokens, vocab], when asked for
