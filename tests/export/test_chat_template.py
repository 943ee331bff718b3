"""Chat templates (wicore.inputs.chat_template, through Tokenizer.apply_chat_template) on the real Gemma 3
270M's template against transformers' rendering of the same conversations; which templates take a message's
content as a list of parts. Tests that read the real vocabulary are marked slow."""

from __future__ import annotations

from typing import Any

import pytest

from wicore.errors import RequestError
from wicore.inputs.chat_template import reads_content_parts
from wicore.inputs.tokenizer import Tokenizer
from wicore.model.tokenizer_info import TokenizerInfo


@pytest.mark.parametrize(
    ("source", "reads_parts"),
    [
        ("{% for m in messages %}{{ m['content'] }}{% endfor %}", False),
        ("{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}", True),
        ("{% for m in messages %}{% set c = m['content'] %}{% for p in c %}{{ p }}{% endfor %}{% endfor %}", True),
        ("{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% endif %}{% endfor %}", True),
        ("{% for m in messages %}{% if m.content is not none %}{{ m.content }}{% endif %}{% endfor %}", False),
    ],
)
def test_which_templates_take_content_parts(source: str, reads_parts: bool) -> None:
    assert reads_content_parts(source) is reads_parts


CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "  Hi there! "},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "What is 2+2?"},
]

PARTS_CONVERSATION = [
    {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
    {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "text", "text": "日本語 😀"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "Nice."}], "tool_calls": None},
    {"role": "user", "content": [{"type": "text", "text": "More?"}]},
]


@pytest.mark.slow
def test_chat_template_exact(tok: Tokenizer) -> None:
    assert tok.apply_chat_template(CONVERSATION) == (
        "<bos><start_of_turn>user\nYou are terse.\n\nHi there!<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


@pytest.mark.slow
@pytest.mark.parametrize("messages", [CONVERSATION, PARTS_CONVERSATION], ids=["strings", "parts"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(
    tok: Tokenizer, hf: Any, info: TokenizerInfo, messages: list[dict[str, Any]], add_generation_prompt: bool
) -> None:
    ours = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    theirs = hf.apply_chat_template(
        messages, chat_template=info.chat_template, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours == theirs
    theirs_ids = hf.apply_chat_template(
        messages,
        chat_template=info.chat_template,
        tokenize=True,
        add_generation_prompt=add_generation_prompt,
        return_dict=False,
    )
    assert tok.encode(ours, add_bos=False) == list(theirs_ids)
    assert tok.encode(ours, add_bos=False).count(2) == 1  # one <bos>, written by the template


@pytest.mark.slow
def test_chat_template_parts(tok: Tokenizer) -> None:
    assert tok.apply_chat_template(PARTS_CONVERSATION[1:2]) == (
        "<bos><start_of_turn>user\nLook:日本語 😀<end_of_turn>\n<start_of_turn>model\n"
    )


@pytest.mark.slow
def test_chat_template_rejects_bad_conversations(tok: Tokenizer) -> None:
    with pytest.raises(RequestError, match="alternate"):
        tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    with pytest.raises(RequestError, match="empty"):
        tok.apply_chat_template([])
