"""Harmony through a real engine and server: a tiny random gpt-oss export (tests/api/tools/gpt_oss_chat.py)
with gpt-oss's chat template and special tokens (slow layer: the export takes seconds).

A random model writes no channels of its own accord, so the answers that must hold them are made
by grammars: tool_choice required (the format's call grammar), and a request grammar that writes
an analysis message and then a final one. What the engine decodes (special tokens kept) is what
the parser reads: reasoning_content apart, tool_calls, no control token in any text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gpt_oss_chat import build

from wicore.api.app import ServerSettings, create_app
from wicore.api.server import ServerThread
from wicore.api.tools.formats import format_for_template
from wicore.engine.engine import Engine, EngineConfig
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.export.tokenizer import export_tokenizer_from_gguf

pytestmark = pytest.mark.slow

FORECAST = {
    "type": "function",
    "function": {
        "name": "get_forecast",
        "description": "The weather forecast of a city",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["unit", "days"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
# an analysis message, then a final one: what gpt-oss writes when it answers without a tool
THINK_THEN_ANSWER = (
    'start: <|channel|> "analysis" <|message|> /[a-z]{1,12}/ <|end|>'
    ' <|start|> "assistant" <|channel|> "final" <|message|> /[a-z]{1,12}/'
)  # (<|return|>, an end token, is no symbol of a grammar: the model's end follows a complete one)


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory) -> Iterator[tuple[str, object, Path]]:
    """(server url, HF model, HF folder)."""
    import transformers

    tmp = tmp_path_factory.mktemp("gpt_oss_chat")
    hf = build(tmp / "hf")
    export_model(open_source(str(hf)), tmp / "model", ExportConfig(), progress=lambda _: None)
    engine = Engine(EngineConfig(model_dir=tmp / "model", num_threads=2, host_tier_gb=0)).start()
    server = ServerThread(create_app(engine, ServerSettings(model_name="gpt-oss"))).start()
    yield server.url, transformers.AutoModelForCausalLM.from_pretrained(hf).eval(), hf
    server.stop()
    engine.stop()


def first_token(hf: Path, text: str) -> tuple[int, str]:
    """The first token of `text` in the tiny gpt-oss's vocabulary, and its text."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(hf / "tokenizer.json"))
    token = tokenizer.encode(text, add_special_tokens=False).ids[0]
    return token, tokenizer.decode([token])


def no_analysis(hf: Path) -> dict[str, int]:
    """A logit_bias that keeps the random model off the analysis channel the call grammar allows first
    (any tokenization of `analysis` may start it: the call's channel is the one pushed instead)."""
    return {str(first_token(hf, "commentary")[0]): 100}


def chat(url: str, **body: object) -> dict:
    response = httpx.post(f"{url}/v1/chat/completions", json={"model": "gpt-oss", "messages": ASK, **body}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def test_a_required_tool_answers_with_tool_calls(gpt_oss):
    choice = chat(gpt_oss[0], tools=[FORECAST], tool_choice="required", max_tokens=64, logit_bias=no_analysis(gpt_oss[2]))
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None and "reasoning_content" not in choice["message"]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_forecast"
    arguments = json.loads(call["function"]["arguments"])
    assert set(arguments) == {"unit", "days"} and arguments["unit"] in ("c", "f") and 1 <= arguments["days"] <= 9


def test_streamed_required_call_equals_the_answer(gpt_oss):
    body = {
        "model": "gpt-oss",
        "messages": ASK,
        "tools": [FORECAST],
        "tool_choice": "required",
        "max_tokens": 64,
        "temperature": 0,
        "logit_bias": no_analysis(gpt_oss[2]),
    }
    whole = chat(gpt_oss[0], **{k: v for k, v in body.items() if k not in ("model", "messages")})
    with httpx.stream("POST", f"{gpt_oss[0]}/v1/chat/completions", json={**body, "stream": True}, timeout=120) as response:
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    deltas = [json.loads(line)["choices"][0]["delta"] for line in lines[:-1]]
    arguments = "".join(c["function"].get("arguments", "") for d in deltas for c in d.get("tool_calls", []))
    assert arguments == whole["message"]["tool_calls"][0]["function"]["arguments"]
    assert "".join(d.get("content") or "" for d in deltas) == ""


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_forecast"}}])
def test_a_forced_call_may_follow_an_analysis_message(gpt_oss, tool_choice):
    """The call grammar lets gpt-oss reason first: biased to open the analysis channel and to close
    its body after one token, the random model writes the first token of `analysis` there, then the
    forced call."""
    hf = gpt_oss[2]
    (opening, text), (end, _) = first_token(hf, "analysis"), first_token(hf, "<|end|>")
    bias = {str(opening): 50, str(end): 100}
    choice = chat(gpt_oss[0], tools=[FORECAST], tool_choice=tool_choice, max_tokens=64, temperature=0, logit_bias=bias)
    assert choice["finish_reason"] == ("tool_calls" if tool_choice == "required" else "stop")  # named: OpenAI's "stop"
    assert choice["message"]["reasoning_content"] == text and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_forecast" and set(json.loads(call["function"]["arguments"])) == {"unit", "days"}


def test_past_reasoning_renders_as_gpt_oss_template_does_in_transformers(gpt_oss):
    """/tokenize's ids for a conversation with past reasoning are HF apply_chat_template's with that
    reasoning as `thinking`: kept before the pending call, dropped before the answered one."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(gpt_oss[2])
    call = {"id": "c1", "type": "function", "function": {"name": "get_forecast", "arguments": '{"unit": "c", "days": 2}'}}
    result = {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    first = [*ASK, {"role": "assistant", "reasoning_content": "Need it.", "tool_calls": [call]}, result]
    later = [*first, {"role": "assistant", "content": "Sunny.", "reasoning_content": "Say."}, *ASK]
    rendered = []
    for messages in (first, later):
        response = httpx.post(f"{gpt_oss[0]}/tokenize", json={"model": "gpt-oss", "messages": messages}, timeout=60)
        assert response.status_code == 200, response.text
        hf_messages = [
            {
                **{k: v for k, v in m.items() if k != "reasoning_content"},
                **({"thinking": m["reasoning_content"]} if "reasoning_content" in m else {}),
            }
            for m in messages
        ]
        hf_messages = [
            {
                **m,
                "tool_calls": [
                    {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                    for c in m["tool_calls"]
                ],
            }
            if "tool_calls" in m
            else m
            for m in hf_messages
        ]
        expected = tok.apply_chat_template(hf_messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        assert response.json()["tokens"] == list(expected)
        rendered.append(tok.decode(expected))
    assert "<|channel|>analysis<|message|>Need it.<|end|>" in rendered[0]
    assert "Need it." not in rendered[1] and "Say." not in rendered[1]


def test_reasoning_is_not_content(gpt_oss):
    choice = chat(gpt_oss[0], structured_outputs={"grammar": THINK_THEN_ANSWER}, max_tokens=40)
    message = choice["message"]
    assert choice["finish_reason"] == "stop"
    assert message["reasoning_content"].isalpha() and message["reasoning_content"].islower()
    assert message["content"].isalpha() and message["content"].islower()


def test_greedy_text_without_channels_equals_hf(gpt_oss):
    """An answer with no channels (the random model's own) is content as written: HF's greedy tokens
    on the prompt gpt-oss's template renders (HF's own apply_chat_template), decoded."""
    import torch
    import transformers

    url, model, hf = gpt_oss
    tok = transformers.AutoTokenizer.from_pretrained(hf)
    ids = tok.apply_chat_template(ASK, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)  # type: ignore[attr-defined]
    expected = tok.decode(out[0, len(ids) :], skip_special_tokens=False)
    assert "<|" not in expected  # (were there a channel, this test would say so)
    choice = chat(url, max_tokens=16, temperature=0)
    assert choice["message"] == {"role": "assistant", "content": expected}


def test_its_gguf_reads_as_harmony_and_ends_a_turn_at_a_call(gpt_oss, cache_dir, tmp_path):
    """llama.cpp's converter keeps the chat template in the GGUF and names <|return|> its eos token
    only: the export stops at <|call|> too (as generation_config.json says), and reads harmony."""
    from llama_cpp_peer import convert, converter_or_skip

    gguf = convert(converter_or_skip(cache_dir.parent), gpt_oss[2], tmp_path / "gpt-oss.gguf")
    info = export_tokenizer_from_gguf(gguf, tmp_path / "tokenizer")
    added = {t["content"]: t["id"] for t in json.loads((gpt_oss[2] / "tokenizer.json").read_text())["added_tokens"]}
    assert info.eos_token_ids == (added["<|return|>"], added["<|call|>"])
    assert info.has_chat_template and format_for_template(info.chat_template).name == "harmony"
