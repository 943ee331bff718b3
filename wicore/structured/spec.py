"""What a constrained request's output must match: the value `SamplingParams.structured` holds.

A plain frozen dataclass of strings, so it is hashable (the compiled-grammar cache is keyed by it),
picklable (Ray replicas) and free of any grammar library: the API builds it from `response_format`,
`structured_outputs`, `guided_*` or `tool_choice`; the engine compiles it once per distinct value.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class StructuredKind(str, enum.Enum):
    JSON = "json"  # `value`: a JSON schema, as JSON text
    JSON_OBJECT = "json_object"  # any JSON object; `value` is empty
    REGEX = "regex"  # `value`: a regular expression the whole output must match
    CHOICE = "choice"  # `value`: a JSON array of strings; the output is exactly one of them
    GRAMMAR = "grammar"  # `value`: a Lark grammar (llguidance's dialect; GBNF-style rules accepted)


@dataclass(frozen=True)
class StructuredOutput:
    kind: StructuredKind
    value: str = ""
    field: str = "response_format"  # the request field it came from: errors name it
