"""Structured output: what a request's tokens must match (a JSON schema, a regex, one of several
strings, a grammar) and the per-request state that turns it into a token mask each step.

`spec` is the contract: `StructuredOutput`, a frozen, hashable value that `SamplingParams` carries
from the API to the engine. Everything else here compiles and applies it.
"""

from wicore.structured.spec import StructuredOutput

__all__ = ["StructuredOutput"]
