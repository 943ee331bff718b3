"""Structured output: what a request's tokens must match (a JSON schema, a regex, one of several
strings, a grammar) and the per-request state that turns it into a token mask each step.

    spec.py       StructuredOutput: the contract SamplingParams carries from the API to the engine
    compiler.py   StructuredOutput -> compiled grammar (LRU-cached, limits) -> GrammarState
    state.py      GrammarState: masks, accept, rollback, finished
    bitmask.py    packed masks (32 tokens an int32 word) applied to NumPy logits

`spec` is free of any grammar library; the rest compiles and applies it (llguidance).
"""

from wicore.structured.spec import StructuredKind, StructuredOutput

__all__ = ["StructuredKind", "StructuredOutput"]
