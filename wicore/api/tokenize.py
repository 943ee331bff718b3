"""vLLM's /tokenize and /detokenize: text or a conversation to token ids, and back.

    POST /tokenize    {"prompt": "text", "add_special_tokens": true}                 (a completion's prompt)
                      {"messages": [...], "add_generation_prompt": true}             (a chat's prompt)
                      optional: "model", "return_token_strs"
                  ◄─  {"count": n, "max_model_len": m, "tokens": [ids], "token_strs": [...] | null}
    POST /detokenize  {"tokens": [ids]}  ◄─  {"prompt": "text"}

The ids are the ones the chat and completion endpoints would run: the same tokenizer, bos token
and chat template (the server's --chat-template where given).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wicore.api.errors import APIError
from wicore.api.schemas import parse_messages


@dataclass(frozen=True)
class TokenizeRequest:
    prompt: str | None  # a completion's prompt, or None for messages
    messages: list[dict[str, Any]] | None
    add_special_tokens: bool  # the bos token in front of a plain prompt
    add_generation_prompt: bool  # a chat's: the assistant turn's opening
    return_token_strs: bool
    model: str | None


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code="invalid_value")


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(name, f"expected a boolean, got {type(value).__name__}")
    return value


def _model(body: dict[str, Any]) -> str | None:
    value = body.get("model")
    if value is not None and not isinstance(value, str):
        raise _bad("model", f"expected a string, got {type(value).__name__}")
    return value


def parse_tokenize(body: Any) -> TokenizeRequest:
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    has_prompt, has_messages = body.get("prompt") is not None, body.get("messages") is not None
    if has_prompt == has_messages:
        raise _bad("prompt", "send either prompt (a string) or messages (a conversation)")
    prompt = body.get("prompt")
    if has_prompt and not isinstance(prompt, str):
        raise _bad("prompt", f"expected a string, got {type(prompt).__name__}")
    messages = None
    if has_messages:
        messages, images = parse_messages(body)
        if images:
            raise APIError(400, "messages: /tokenize takes text only", param="messages", code="unsupported")
    return TokenizeRequest(
        prompt=prompt if has_prompt else None,
        messages=messages,
        add_special_tokens=_flag(body, "add_special_tokens", has_prompt),  # vLLM: true for prompts, false for chats
        add_generation_prompt=_flag(body, "add_generation_prompt", True),
        return_token_strs=_flag(body, "return_token_strs", False),
        model=_model(body),
    )


def parse_detokenize(body: Any, vocab_size: int) -> tuple[list[int], str | None]:
    """The token ids to decode (each within the vocabulary) and the model named, if any."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise _bad("tokens", "expected a list of token ids")
    outside = [t for t in tokens if not 0 <= t < vocab_size]
    if outside:
        raise _bad("tokens", f"token id {outside[0]} is out of the vocabulary (ids 0 to {vocab_size - 1})")
    return tokens, _model(body)
