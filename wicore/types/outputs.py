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


@dataclass(frozen=True, init=False)
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

    def __init__(
        self,
        request_id: str,
        new_token_ids: list[int],
        finished: bool,
        finish_reason: str | None = None,
        num_prompt_tokens: int = 0,
        num_cached_tokens: int = 0,
        error: str | None = None,
        logprobs: list[Logprobs] | None = None,
        prompt_logits: np.ndarray | None = None,
    ) -> None:
        """The fields above, set at once: a frozen dataclass's own __init__ sets them one
        `object.__setattr__` at a time (~1.7 us against ~0.7 on the 2-core VM), and the scheduler
        makes one a running request a step (issue 32). tests/types keeps this signature the fields'."""
        self.__dict__.update(
            request_id=request_id,
            new_token_ids=new_token_ids,
            finished=finished,
            finish_reason=finish_reason,
            num_prompt_tokens=num_prompt_tokens,
            num_cached_tokens=num_cached_tokens,
            error=error,
            logprobs=logprobs,
            prompt_logits=prompt_logits,
        )


def merge_outputs(outputs: list[RequestOutput]) -> RequestOutput:
    """Consecutive outputs of one request as one: their tokens (and logprobs) in order, the last's
    end. A consumer that fell behind sends this instead of one message a step (the Ray replicas)."""
    if len(outputs) == 1:
        return outputs[0]
    first, last = outputs[0], outputs[-1]
    logprobs = [lp for out in outputs for lp in out.logprobs or []]
    prompt_logits = next((out.prompt_logits for out in outputs if out.prompt_logits is not None), None)
    return RequestOutput(
        first.request_id,
        [token for out in outputs for token in out.new_token_ids],
        last.finished,
        last.finish_reason,
        last.num_prompt_tokens,
        last.num_cached_tokens,
        last.error,
        logprobs or None,
        prompt_logits,
    )


@dataclass(frozen=True)
class Completion:
    """One request run to its end by `Engine.generate`."""

    token_ids: list[int]
    finish_reason: str | None
    num_prompt_tokens: int
    error: str | None = None
    prompt_logits: np.ndarray | None = None  # [num_prompt_tokens, vocab], when asked for
