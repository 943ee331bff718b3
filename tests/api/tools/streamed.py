"""Drive a ToolCallStream the way a choice does: text in pieces, then the finish."""

from __future__ import annotations

from wicore.api.tools.formats import FORMATS
from wicore.api.tools.plan import ToolPlan
from wicore.api.tools.request import Function, ToolRequest
from wicore.api.tools.scan import Call
from wicore.api.tools.stream import Released, ToolCallStream

WEATHER = Function(
    "get_weather",
    {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]},
    "The weather in a city",
)
TIME = Function("get_time", {"type": "object", "properties": {"zone": {"type": "string"}}})
NAMES = frozenset({"get_weather", "get_time"})


def streamed(format_name: str, text: str, step: int = 1, parallel: bool = True) -> list[tuple[int, str, list[Call]]]:
    """(characters pushed, content, calls) of every push that released something, `step` characters a push."""
    return [(n, r.content, r.calls) for n, r in releases(format_name, text, step, parallel) if r.content or r.calls]


def releases(format_name: str, text: str, step: int = 1, parallel: bool = True) -> list[tuple[int, Released]]:
    """(characters pushed, what the push released) of every push that released something."""
    stream = ToolCallStream(ToolPlan(FORMATS[format_name], ToolRequest((WEATHER, TIME), parallel=parallel)))
    out = []
    for i in range(0, len(text), step):
        released = stream.push(text[i : i + step])
        if released != Released():
            out.append((min(i + step, len(text)), released))
    released = stream.push("", final=True)
    if released != Released():
        out.append((len(text), released))
    return out


def joined(releases: list[tuple[int, str, list[Call]]]) -> tuple[str, list[Call]]:
    return "".join(r[1] for r in releases), [c for r in releases for c in r[2]]
