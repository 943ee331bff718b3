"""OpenAI's harmony format (gpt-oss): every answer is messages on channels, a call is a message to a function.

The chat template's generation prompt ends with `<|start|>assistant`; the model goes on with

    <|channel|>analysis<|message|>The user wants the weather.<|end|>           reasoning
    <|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>         content (a preamble)
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>
                                                                               a call (`<|call|>` ends the turn)
or  <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>          content

A header is `[<|start|>ROLE][ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT][ [<|constrain|>]TYPE]`
up to `<|message|>` (the recipient may stand before or after the channel); the body runs to `<|end|>`,
`<|call|>`, `<|return|>` (or `<|endoftext|>`, or the end of the text). The analysis channel is
reasoning (vLLM's `reasoning_content`); a message to `functions.NAME` is a call of NAME with its body
as the arguments (a body that is not a JSON object, or an undeclared NAME, is content); every other
body is content. Text outside a well-formed header (a model that writes no channels) is content as
written. Headers and end tokens are never content.

The markers are special tokens of the model's vocabulary: the text is decoded with them
(`reads_special_tokens`). While streaming, reasoning and content go as they are written, less a
suffix that may begin an end token; a call goes when its `<|call|>` (or the end) arrives.
"""

from __future__ import annotations

import json
import re

from wicore.api.tools.formats.base import ToolFormat, json_rule, lark_string, tool_list
from wicore.api.tools.request import Function
from wicore.api.tools.scan import BracketMemo, Call, Scan

START, MESSAGE, CHANNEL, CONSTRAIN = "<|start|>", "<|message|>", "<|channel|>", "<|constrain|>"
END, CALL, RETURN, END_OF_TEXT = "<|end|>", "<|call|>", "<|return|>", "<|endoftext|>"
ENDS = (END, CALL, RETURN, END_OF_TEXT)
FUNCTIONS = "functions."

_RECIPIENT = r"\s*to=(?P<{}>[^\s<]+)"
HEADER = re.compile(
    rf"(?:{re.escape(START)}[^\s<]*)?(?:{_RECIPIENT.format('to1')})?\s*"
    rf"(?:{re.escape(CHANNEL)}(?P<channel>[\w-]+))?(?:{_RECIPIENT.format('to2')})?"
    rf"(?:\s*(?:{re.escape(CONSTRAIN)})?[\w-]*)?\s*"
)


class Harmony(ToolFormat):
    name = "harmony"
    reads_special_tokens = True
    reads_every_answer = True

    def scan(self, text: str, final: bool, names: frozenset[str], memo: BracketMemo | None = None) -> Scan:
        scan = Scan()
        pos = 0
        while pos < len(text):
            body = text.find(MESSAGE, pos)
            end, marker = _first_end(text, pos)
            if body < 0 or (end is not None and end < body):  # no header before the next end: stray text
                if end is None and not final:
                    return scan  # it may still become a header
                stop = len(text) if end is None else end
                scan.content(pos, stop)
                scan.skip(stop + len(marker))
                pos = stop + len(marker)
                continue
            header = HEADER.fullmatch(text, pos, body)
            start = body + len(MESSAGE)
            end, marker = _first_end(text, start)
            if end is None and not final:
                if header is not None and not _recipient(header):  # content or reasoning: stream it
                    _body(scan, header, start, _held(text, start))
                return scan
            stop = len(text) if end is None else end
            if header is None:  # a malformed header: the whole message is content as written
                scan.content(pos, stop)
            elif (recipient := _recipient(header)) is not None and (call := _call(recipient, text[start:stop], names)):
                scan.calls(pos, stop, [call])
            else:
                _body(scan, header, start, stop)
            scan.skip(stop + len(marker))
            pos = stop + len(marker)
        return scan

    def instructions(self, functions: tuple[Function, ...]) -> str:
        return (
            "# Tools\n\nCalls to these tools must go to the commentary channel: 'functions'. "
            "The functions (JSON schemas of their arguments):\n"
            f"{tool_list(functions)}"
        )

    def render_calls(self, calls: list[Call]) -> str:
        """Calls as the model writes them after the generation prompt (`<|start|>assistant`): one
        message each, the next ones with their own start."""
        return f"{START}assistant".join(_call_message(c.name, c.arguments_json) for c in calls)

    def render_results(self, results: list[str]) -> str:
        return "\n".join(f"The tool returned: {r}" for r in results)

    def grammar(self, functions: tuple[Function, ...], parallel: bool) -> str:
        """An analysis message if the model writes one (gpt-oss reasons before it calls), then one
        call on the commentary channel, the recipient after it as gpt-oss writes it, up to its
        arguments: `<|call|>` is one of the model's end tokens, which llguidance takes only where the
        grammar is complete (and the engine stops there), so it is no symbol of the grammar, and a
        turn holds one call whatever `parallel` says (the template renders one a turn too). The
        analysis body is any text (special tokens are no text: `<|end|>` closes it)."""
        rules = [
            "start: analysis? call",
            f'analysis: {CHANNEL} "analysis" {MESSAGE} /(.|\\n)+/ {END} {START} "assistant"',
            "call: " + " | ".join(f"call{i}" for i in range(len(functions))),
        ]
        for i, f in enumerate(functions):
            head = lark_string(f"commentary to={FUNCTIONS}{f.name} ")
            rules.append(f'call{i}: {CHANNEL} {head} {CONSTRAIN} "json" {MESSAGE} args{i}')
            rules.append(f"args{i}: {json_rule(f.parameters)}")  # its own root: its $refs hold
        return "\n".join(rules) + "\n"


def _body(scan: Scan, header: re.Match[str], start: int, stop: int) -> None:
    """text[start:stop], a body whose header is `header`: reasoning on the analysis channel, else content."""
    scan.skip(start)
    if header["channel"] == "analysis" and not _recipient(header):
        scan.reasoning(start, stop)
    else:
        scan.content(start, stop)


def _call_message(name: str, arguments_json: str) -> str:
    return f"{CHANNEL}commentary to={FUNCTIONS}{name} {CONSTRAIN}json{MESSAGE}{arguments_json}{CALL}"


def _first_end(text: str, start: int) -> tuple[int | None, str]:
    """(where the first end token at or after `start` is, that token), or (None, "")."""
    found = [(i, m) for m in ENDS if (i := text.find(m, start)) >= 0]
    return min(found) if found else (None, "")


def _held(text: str, start: int) -> int:
    """Where the sure part of an open body ends: before a suffix that may begin an end token."""
    end = len(text)
    for n in range(min(len(text) - start, max(len(m) for m in ENDS) - 1), 0, -1):
        if any(m.startswith(text[end - n :]) for m in ENDS):
            return end - n
    return end


def _recipient(header: re.Match[str]) -> str | None:
    return header["to1"] or header["to2"]


def _call(recipient: str, body: str, names: frozenset[str]) -> Call | None:
    """The call of a message to `functions.NAME`; None for another recipient, an undeclared name,
    or a body that is not a JSON object."""
    name = recipient.removeprefix(FUNCTIONS)
    if not recipient.startswith(FUNCTIONS) or name not in names:
        return None
    try:
        arguments = json.loads(body) if body.strip() else {}
    except ValueError:
        return None
    return Call(name, arguments) if isinstance(arguments, dict) else None
