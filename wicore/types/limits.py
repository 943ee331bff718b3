"""The range of every numeric sampling setting, in one place: `SamplingParams` checks its fields
against it, the API's request parser (wicore.api.schemas) checks request bodies against it, and the
OpenAPI document (wicore.api.openapi) publishes it. OpenAI's ranges where OpenAI has the setting,
vLLM's where vLLM added it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Range:
    low: float
    high: float
    low_open: bool = False  # the low end itself is outside

    def __contains__(self, value: float) -> bool:
        return math.isfinite(value) and self.low <= value <= self.high and not (self.low_open and value == self.low)

    def __str__(self) -> str:
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"

    def json_schema(self) -> dict[str, Any]:
        """The range as OpenAPI 3.0 number bounds."""
        bounds: dict[str, Any] = {"minimum": self.low, "maximum": self.high}
        return {**bounds, "exclusiveMinimum": True} if self.low_open else bounds


TEMPERATURE = Range(0.0, 2.0)
TOP_P = Range(0.0, 1.0, low_open=True)
PRESENCE_PENALTY = Range(-2.0, 2.0)
FREQUENCY_PENALTY = Range(-2.0, 2.0)
MIN_P = Range(0.0, 1.0)
REPETITION_PENALTY = Range(0.0, 1e6, low_open=True)  # vLLM: > 0; 1 is off
LOGIT_BIAS = Range(-100.0, 100.0)
MAX_LOGPROBS = 20  # most alternatives a request may ask for (OpenAI's top_logprobs limit)

RANGES: dict[str, Range] = {
    "temperature": TEMPERATURE,
    "top_p": TOP_P,
    "presence_penalty": PRESENCE_PENALTY,
    "frequency_penalty": FREQUENCY_PENALTY,
    "min_p": MIN_P,
    "repetition_penalty": REPETITION_PENALTY,
}
