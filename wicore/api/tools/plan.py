"""What a chat request with tools needs beyond its messages: the model's call format, the
prompt, and the grammar that enforces tool_choice required / a named function."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from wicore.api.errors import APIError
from wicore.api.tools.formats import FORMATS, ToolFormat, format_for_template
from wicore.api.tools.prompt import template_inputs
from wicore.api.tools.request import ToolRequest
from wicore.structured.spec import StructuredKind, StructuredOutput

if TYPE_CHECKING:
    from wicore.api.schemas import Options
    from wicore.inputs.tokenizer import Tokenizer


@dataclass(frozen=True)
class ToolPlan:
    """How a chat request's output is read: the model's call format and the request's tools."""

    format: ToolFormat
    tools: ToolRequest

    def structured(self) -> StructuredOutput | None:
        """The grammar of the calls tool_choice asks for (required, or a named function), or None for auto."""
        if not self.tools.is_enforced:
            return None
        grammar = self.format.grammar(self.tools.offered(), self.tools.parallel)
        return StructuredOutput(StructuredKind.GRAMMAR, grammar, field="tool_choice")


def tool_format(name: str | None, tokenizer: Tokenizer) -> ToolFormat:
    """The format named by --tool-call-parser, else the one the model's chat template implies."""
    return FORMATS[name] if name is not None else format_for_template(tokenizer.info.chat_template)


def chat_prompt(
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    tools: ToolRequest | None,
    fmt: ToolFormat,
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
) -> tuple[str, ToolPlan | None]:
    """The prompt text of a conversation with its tools (a 400 if the format cannot write one);
    `chat_template` replaces the model's (a server's --chat-template). The plan reads the answer:
    None without tools, unless the format reads every answer (harmony: its channels), which then
    gets the plan of no tools."""
    if tools is not None:
        try:
            fmt.check(tools.functions)
        except ValueError as exc:
            raise APIError(400, f"tools: {exc}", param="tools", code="invalid_value") from None
    rendered, template_tools = template_inputs(messages, tools, fmt, tokenizer.takes_tools)
    prompt = tokenizer.apply_chat_template(rendered, add_generation_prompt, chat_template, tools=template_tools)
    if tools is None:
        return prompt, ToolPlan(fmt, ToolRequest(())) if fmt.reads_every_answer else None
    return prompt, ToolPlan(fmt, tools)


def with_tool_grammar(options: Options, plan: ToolPlan | None) -> Options:
    """The options with the grammar tool_choice enforces; a 400 when response_format asks for another."""
    grammar = None if plan is None else plan.structured()
    if grammar is None:
        return options
    if options.structured is not None and plan is not None:
        asked = "required" if plan.tools.named is None else f"naming {plan.tools.named}"
        raise APIError(
            400,
            f"tool_choice: {asked} makes the output tool calls; it cannot also follow {options.structured.field}",
            param="tool_choice",
            code="invalid_value",
        )
    return replace(options, structured=grammar)
