"""Request bodies of the OpenAI endpoints, parsed and checked: a 400 names the parameter.

Unknown fields are ignored, as OpenAI does; `null` means "not given". Known fields whose
feature WiCore lacks (echo, best_of, suffix, audio parts, the legacy functions) are refused with a
400 rather than silently ignored, so a client never gets an answer it did not ask for. Output
constraints (response_format, structured_outputs, guided_*) are parsed by wicore.api.structured,
tools by wicore.api.tools.

    image_url parts  {"type": "image_url", "image_url": {"url": ...}} (or "image_url": "<url>"):
                     the message keeps {"type": "image"} where the chat template places the
                     image; the URL goes to ChatRequest.images (wicore.api.images loads them)

    logprobs  chat: `logprobs: true` and `top_logprobs: 0..20`   completions: `logprobs: 0..5`
              both become Options.logprobs = how many alternatives per token (None: no logprobs)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wicore.api.errors import APIError
from wicore.api.images import ImagePart
from wicore.api.structured import parse_structured
from wicore.api.tools.request import ToolRequest, parse_tools, tool_message_fields
from wicore.structured.spec import StructuredOutput
from wicore.types.limits import (
    FREQUENCY_PENALTY,
    LOGIT_BIAS,
    MAX_LOGPROBS,
    MIN_P,
    PRESENCE_PENALTY,
    REPETITION_PENALTY,
    TEMPERATURE,
    TOP_P,
    Range,
)

PRIORITIES = ("low", "normal", "high", "urgent")
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_N = 16
MAX_STOPS = 16
MAX_TOP_LOGPROBS = MAX_LOGPROBS  # chat's top_logprobs
MAX_COMPLETION_LOGPROBS = 5  # completions' logprobs
MAX_LOGIT_BIAS = 300  # tokens one logit_bias may name (OpenAI's limit)


@dataclass(frozen=True)
class Options:
    """What both endpoints share: sampling, stop strings, how many choices, how to answer."""

    model: str | None = None
    max_tokens: int | None = None  # None: as many as the context leaves
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    priority: str = "normal"
    user: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None  # None: none; k: each token's logprob and the k most likely alternatives
    speculative: bool = True  # False: no draft tokens for this request, where the server speculates
    ignore_eos: bool = False  # vLLM's extension: generate through end-of-sequence tokens up to max_tokens
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), ids checked against the vocabulary later
    min_p: float = 0.0  # vLLM's extension
    repetition_penalty: float = 1.0  # vLLM's extension (prompt and output tokens)
    structured: StructuredOutput | None = None  # response_format / structured_outputs / guided_*: what the output matches


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, Any]]
    options: Options
    images: tuple[ImagePart, ...] = ()  # the image_url parts, in the order of the conversation
    tools: ToolRequest | None = None  # tools / tool_choice / parallel_tool_calls (wicore.api.tools)


@dataclass(frozen=True)
class CompletionRequest:
    prompts: list[str | list[int]]  # text, or token ids
    options: Options


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code="invalid_value")


def _int(body: dict[str, Any], name: str, lo: int | None = None, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, f"expected an integer, got {type(value).__name__}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise _bad(name, f"{value} is out of range [{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]")
    return value


def _number(body: dict[str, Any], name: str, allowed: Range, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(name, f"expected a number, got {type(value).__name__}")
    if value not in allowed:  # NaN (JSON's NaN literal) fails too
        raise _bad(name, f"{value} is out of range {allowed}")
    return float(value)


def _bool(body: dict[str, Any], name: str) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise _bad(name, f"expected a boolean, got {type(value).__name__}")
    return value


def _str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise _bad(name, f"expected a string, got {type(value).__name__}")
    return value


def _unsupported(name: str, what: str) -> APIError:
    return APIError(400, f"{name}: {what} is not supported by this server yet", param=name, code="unsupported")


def parse_stop(body: dict[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise _bad("stop", "expected a string or a list of strings")
    if len(value) > MAX_STOPS:
        raise _bad("stop", f"at most {MAX_STOPS} stop strings, got {len(value)}")
    return tuple(s for s in value if s)


def parse_priority(body: dict[str, Any]) -> str:
    value = body.get("priority")
    if value is None:
        return "normal"
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(PRIORITIES):
        return PRIORITIES[value]
    if isinstance(value, str) and value.lower() in PRIORITIES:
        return value.lower()
    raise _bad("priority", f"choose one of {', '.join(PRIORITIES)} (or 0-3)")


def parse_chat_logprobs(body: dict[str, Any]) -> int | None:
    """`logprobs: true` asks for logprobs, `top_logprobs` for that many alternatives per token."""
    wanted = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top and not wanted:
        raise _bad("top_logprobs", "needs logprobs: true")
    return (top or 0) if wanted else None


def parse_completion_logprobs(body: dict[str, Any]) -> int | None:
    """`logprobs: k` asks for each token's logprob and the k most likely alternatives."""
    return _int(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)


def parse_options(body: dict[str, Any], max_tokens_names: tuple[str, ...], logprobs: int | None = None) -> Options:
    """The shared fields; `max_tokens_names` in order of preference; `logprobs` as the endpoint read it.
    Checked in the order written here: a body with several bad fields is told about the first."""
    max_tokens = next((v for v in (_int(body, name, 1) for name in max_tokens_names) if v is not None), None)
    top_k = _int(body, "top_k", -1)
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise _bad("stream_options", "expected an object")
    return Options(
        max_tokens=max_tokens,
        top_k=0 if top_k is None or top_k < 0 else top_k,  # -1 (vLLM) and 0 both mean "off"
        include_usage=bool(stream_options and _bool(stream_options, "include_usage")),
        temperature=_number(body, "temperature", TEMPERATURE, default=1.0),
        top_p=_number(body, "top_p", TOP_P, default=1.0),
        presence_penalty=_number(body, "presence_penalty", PRESENCE_PENALTY, default=0.0),
        frequency_penalty=_number(body, "frequency_penalty", FREQUENCY_PENALTY, default=0.0),
        model=_str(body, "model"),
        seed=_int(body, "seed", -(2**63), 2**64 - 1),
        stop=parse_stop(body),
        n=_int(body, "n", 1, MAX_N) or 1,
        stream=bool(_bool(body, "stream")),
        priority=parse_priority(body),
        user=_str(body, "user"),
        logprobs=logprobs,
        speculative=_bool(body, "speculative") is not False,
        ignore_eos=bool(_bool(body, "ignore_eos")),
        logit_bias=parse_logit_bias(body),
        min_p=_number(body, "min_p", MIN_P, default=0.0),
        repetition_penalty=_number(body, "repetition_penalty", REPETITION_PENALTY, default=1.0),
        structured=parse_structured(body),
    )


def parse_logit_bias(body: dict[str, Any]) -> tuple[tuple[int, float], ...]:
    """OpenAI's `logit_bias`: {"token id": bias in LOGIT_BIAS}, at most MAX_LOGIT_BIAS entries."""
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise _bad("logit_bias", 'expected an object of token ids to biases, e.g. {"1234": -100}')
    if len(value) > MAX_LOGIT_BIAS:
        raise _bad("logit_bias", f"at most {MAX_LOGIT_BIAS} tokens, got {len(value)}")
    out = []
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit()):
            raise _bad("logit_bias", f"invalid key {key!r}: keys are token ids, non-negative integers")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or bias not in LOGIT_BIAS:
            raise _bad("logit_bias", f"the bias of token {key} is {bias!r}; biases are numbers in {LOGIT_BIAS}")
        out.append((int(key), float(bias)))
    return tuple(out)


def parse_messages(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[ImagePart]]:
    """The messages, and the image parts found in them in order."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "expected a non-empty list of messages")
    out: list[dict[str, Any]] = []
    images: list[ImagePart] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _bad(where, "expected an object with role and content")
        role = message.get("role")
        if role not in ROLES:
            raise _bad(f"{where}.role", f"{role!r}: choose one of {', '.join(ROLES)}")
        content = _content(message.get("content"), where, images)
        fields = tool_message_fields(message, role, where)  # an assistant's tool_calls, a tool's tool_call_id
        fields.update(_reasoning(message, role, where))
        out.append({"role": "system" if role == "developer" else role, "content": content, **fields})
    return out, images


def _reasoning(message: dict[str, Any], role: str, where: str) -> dict[str, str]:
    """A past assistant turn's reasoning (`reasoning_content`, vLLM's `reasoning` too) for the chat
    template, under the names templates read: `reasoning_content` (Qwen3's) and `thinking`
    (gpt-oss's, which keeps it only for a turn that ends in a tool call with no final answer after)."""
    for key in ("reasoning_content", "reasoning"):
        text = message.get(key)
        if text is None:
            continue
        if not isinstance(text, str):
            raise _bad(f"{where}.{key}", "expected a string")
        return {"reasoning_content": text, "thinking": text} if role == "assistant" and text else {}
    return {}


def _content(content: Any, where: str, images: list[ImagePart]) -> str | list[dict[str, str]]:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}.content", "expected a string or a list of content parts")
    parts = []
    for j, part in enumerate(content):
        param = f"{where}.content[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise _bad(param, "expected an object with a type")
        if part["type"] == "image_url":
            images.append(ImagePart(_image_url(part.get("image_url"), param), param))
            parts.append({"type": "image"})
            continue
        if part["type"] != "text":
            raise _unsupported(param, f"content of type {part['type']!r}")
        if not isinstance(part.get("text"), str):
            raise _bad(f"{param}.text", "expected a string")
        parts.append({"type": "text", "text": part["text"]})
    return parts


def _image_url(value: Any, param: str) -> str:
    """The URL of an image_url part: {"url": ...} as OpenAI sends it, or the URL itself."""
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise _bad(f"{param}.image_url", 'expected {"url": "data:image/png;base64,..."}')
    return url


def parse_prompts(body: dict[str, Any]) -> list[str | list[int]]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [list(prompt)]
        if all(isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompt):
            return [list(p) for p in prompt]
    raise _bad("prompt", "expected a string, a list of strings, or token ids")


def parse_chat(body: Any) -> ChatRequest:
    body = _object(body)
    refuse_legacy_functions(body)
    messages, images = parse_messages(body)
    options = parse_options(body, ("max_completion_tokens", "max_tokens"), parse_chat_logprobs(body))
    return ChatRequest(messages, options, tuple(images), parse_tools(body))


def refuse_legacy_functions(body: dict[str, Any]) -> None:
    """The legacy `functions` is not implemented: a 400 rather than plain text that a client would
    take for a call (`tools` is what works). Its "off" values pass."""
    if body.get("functions"):
        raise _unsupported("functions", "the legacy functions field (send tools)")
    if body.get("function_call") not in (None, "none"):
        raise _unsupported("function_call", "the legacy function_call field (send tool_choice)")


def parse_completion(body: Any) -> CompletionRequest:
    body = _object(body)
    if _bool(body, "echo"):
        raise _unsupported("echo", "echo")
    best_of = _int(body, "best_of", 1, MAX_N)
    if best_of not in (None, 1):
        raise _unsupported("best_of", "best_of > 1")
    if _str(body, "suffix"):
        raise _unsupported("suffix", "suffix")
    return CompletionRequest(parse_prompts(body), parse_options(body, ("max_tokens",), parse_completion_logprobs(body)))


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    return body
