"""The tool-call formats by name (`wicore serve --tool-call-parser NAME`), and the one a chat
template implies when no name is given.

    template mentions      format
    <|channel|>            harmony       (gpt-oss: channels, calls as messages to functions.NAME)
    [ARGS]                 mistral_v11   (Mistral's v11 vocabulary on: [TOOL_CALLS]NAME[ARGS]{...} a call)
    [TOOL_CALLS]           mistral       (Mistral's v3 vocabulary: a JSON list of calls)
    <tool_call>            hermes        (Qwen 2.5, Hermes: JSON in <tool_call> tags)
    <|header_start|>, [func_name1(   pythonic   (Llama 4, pythonic Llama 3.2 templates)
    <|start_header_id|>    llama3_json   (Llama 3.1 / 3.2: a JSON object)
    <start_of_turn>        gemma         (Gemma: Google's prompt, Python calls)
    anything else          hermes        (ChatML models such as SmolLM2, and the rest)
"""

from __future__ import annotations

from wicore.api.tools.formats.base import ToolFormat
from wicore.api.tools.formats.harmony import Harmony
from wicore.api.tools.formats.hermes import Hermes
from wicore.api.tools.formats.llama3 import Llama3Json
from wicore.api.tools.formats.mistral import Mistral
from wicore.api.tools.formats.mistral_v11 import MistralV11
from wicore.api.tools.formats.pythonic import Gemma, Pythonic

FORMATS: dict[str, ToolFormat] = {
    f.name: f for f in (Hermes(), Llama3Json(), Pythonic(), Gemma(), Harmony(), Mistral(), MistralV11())
}

# Checked in order: the first marker the template holds names its format.
_TEMPLATE_MARKERS = (
    ("<|channel|>", "harmony"),
    ("[ARGS]", "mistral_v11"),
    ("[TOOL_CALLS]", "mistral"),
    ("<tool_call>", "hermes"),
    ("<|header_start|>", "pythonic"),
    ("[func_name1(", "pythonic"),
    ("<|start_header_id|>", "llama3_json"),
    ("<start_of_turn>", "gemma"),
)
DEFAULT = "hermes"


def format_for_template(chat_template: str) -> ToolFormat:
    """The format a model with this chat template writes its calls in."""
    name = next((name for marker, name in _TEMPLATE_MARKERS if marker in chat_template), DEFAULT)
    return FORMATS[name]


__all__ = ["FORMATS", "ToolFormat", "format_for_template"]
