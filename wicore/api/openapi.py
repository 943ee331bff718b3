"""/openapi.json: the endpoints and the request fields this server checks, OpenAPI 3.0."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import wicore
from wicore.types import limits


def _object(required: list[str], properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties, **extra}


_STR: dict[str, Any] = {"type": "string"}
_NULLABLE_STR = {**_STR, "nullable": True}
_NUM = {"type": "number"}
_SCHEMA = {"type": "object", "description": "a JSON schema"}
_INT = {"type": "integer"}
_MAX_TOKENS = {**_INT, "minimum": 1, "nullable": True}
_TOKEN_ID = {**_INT, "minimum": 0}
_TEMPERATURE = {**_NUM, **limits.TEMPERATURE.json_schema(), "nullable": True}
_STOP = {"oneOf": [_STR, {"type": "array", "items": _STR, "maxItems": 16}], "nullable": True}
_SCHEMA = {"type": "object", "description": "a JSON schema"}
_CHOICES = {"type": "array", "minItems": 1, "items": _STR}
# Output constraints (wicore.api.structured): one per request, compiled by the server (a 400 names the
# field of one that does not compile).
_STRUCTURED: dict[str, Any] = {
    "response_format": _object(
        ["type"],
        {
            "type": {**_STR, "enum": ["text", "json_object", "json_schema"]},
            "json_schema": _object([], {"name": _STR, "schema": _SCHEMA, "strict": {"type": "boolean", "nullable": True}}),
        },
        nullable=True,
    ),
    "structured_outputs": {
        "type": "object",
        "nullable": True,
        "description": "vLLM's: one of json, regex, choice, grammar (Lark or GBNF), json_object",
        "properties": {
            "json": {"oneOf": [_SCHEMA, _STR]},
            "regex": _STR,
            "choice": _CHOICES,
            "grammar": _STR,
            "json_object": {"type": "boolean"},
        },
    },
    "guided_json": {"oneOf": [_SCHEMA, _STR], "nullable": True},
    "guided_regex": _NULLABLE_STR,
    "guided_choice": {**_CHOICES, "nullable": True},
    "guided_grammar": _NULLABLE_STR,
}
_COMMON: dict[str, Any] = {
    "model": _NULLABLE_STR,
    "temperature": _TEMPERATURE,
    "top_p": {**_NUM, **limits.TOP_P.json_schema(), "nullable": True},
    "top_k": {**_INT, "minimum": -1, "nullable": True},
    "seed": {**_INT, "minimum": -(2**63), "maximum": 2**64 - 1, "nullable": True},  # signed or unsigned 64-bit
    "stop": _STOP,
    "n": {**_INT, "minimum": 1, "maximum": 16, "nullable": True},
    "stream": {"type": "boolean", "nullable": True},
    "stream_options": {"type": "object", "nullable": True, "properties": {"include_usage": {"type": "boolean"}}},
    "presence_penalty": {**_NUM, **limits.PRESENCE_PENALTY.json_schema(), "nullable": True},
    "frequency_penalty": {**_NUM, **limits.FREQUENCY_PENALTY.json_schema(), "nullable": True},
    "user": _NULLABLE_STR,
    "priority": {**_STR, "enum": ["low", "normal", "high", "urgent"], "nullable": True},
    "speculative": {"type": "boolean", "nullable": True},
    "ignore_eos": {"type": "boolean", "nullable": True},
    "logit_bias": {
        "type": "object",
        "nullable": True,
        "maxProperties": 300,
        "additionalProperties": {**_NUM, **limits.LOGIT_BIAS.json_schema()},
        "description": "token id (a string of digits) -> bias added to its logit; -100 bans it, +100 forces it",
    },
    "min_p": {**_NUM, **limits.MIN_P.json_schema(), "nullable": True},
    "repetition_penalty": {**_NUM, **limits.REPETITION_PENALTY.json_schema(), "nullable": True},
    **_STRUCTURED,
}
_TEXT_PART = _object(["type", "text"], {"type": {**_STR, "enum": ["text"]}, "text": _STR})
_IMAGE_PART = _object(
    ["type", "image_url"],
    {"type": {**_STR, "enum": ["image_url"]}, "image_url": _object(["url"], {"url": _STR, "detail": _STR})},
    description="an image: a data: URL (base64 PNG, JPEG, WebP or GIF); http(s) URLs only "
    "where the server fetches them (--allow-image-urls)",
)
_FUNCTION_NAME = {**_STR, "pattern": "^[A-Za-z0-9_-]{1,64}$"}
# An assistant's past call (its arguments JSON text, as the API answered them; an object is taken too)
_TOOL_CALL = _object(
    ["function"],
    {
        "id": _STR,
        "type": {**_STR, "enum": ["function"]},
        "function": _object(["name"], {"name": _STR, "arguments": {"oneOf": [_STR, {"type": "object"}]}}),
    },
)
_MESSAGE = _object(
    ["role", "content"],
    {
        "role": {**_STR, "enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"oneOf": [_STR, {"type": "array", "items": {"oneOf": [_TEXT_PART, _IMAGE_PART]}}], "nullable": True},
        "tool_calls": {"type": "array", "items": _TOOL_CALL, "nullable": True, "description": "an assistant's calls"},
        "tool_call_id": {**_NULLABLE_STR, "description": "the call a tool message answers (required there)"},
    },
)
# OpenAI's tools (wicore.api.tools): names unique in a request; a named tool_choice names one of them
_TOOLS: dict[str, Any] = {
    "tools": {
        "type": "array",
        "nullable": True,
        "maxItems": 128,
        "items": _object(
            ["type", "function"],
            {
                "type": {**_STR, "enum": ["function"]},
                "function": _object(
                    ["name"], {"name": _FUNCTION_NAME, "description": _NULLABLE_STR, "parameters": {**_SCHEMA, "nullable": True}}
                ),
            },
        ),
    },
    "tool_choice": {
        "oneOf": [
            {**_STR, "enum": ["none", "auto", "required"]},
            _object(
                ["type", "function"], {"type": {**_STR, "enum": ["function"]}, "function": _object(["name"], {"name": _STR})}
            ),
        ],
        "nullable": True,
    },
    "parallel_tool_calls": {"type": "boolean", "nullable": True},
}
_ERROR = _object(
    ["error"],
    {"error": _object(["message", "type"], {"message": _STR, "type": _STR, "param": _NULLABLE_STR, "code": _NULLABLE_STR})},
)
_USAGE = _object(
    ["prompt_tokens", "completion_tokens", "total_tokens"],
    {"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT},
)
_TOKEN_LOGPROB = _object(
    ["token", "logprob", "bytes"], {"token": _STR, "logprob": _NUM, "bytes": {"type": "array", "items": _INT, "nullable": True}}
)
# A choice's logprobs: chat's {content: [...]} or completions' parallel lists; null when not asked for.
_LOGPROBS = {
    "type": "object",
    "nullable": True,
    "properties": {
        "content": {
            "type": "array",
            "nullable": True,
            "items": {
                **_TOKEN_LOGPROB,
                "properties": {**_TOKEN_LOGPROB["properties"], "top_logprobs": {"type": "array", "items": _TOKEN_LOGPROB}},
            },
        },
        "tokens": {"type": "array", "items": _STR},
        "token_logprobs": {"type": "array", "items": _NUM},
        "top_logprobs": {"type": "array", "items": {"type": "object", "additionalProperties": _NUM}},
        "text_offset": {"type": "array", "items": _INT},
    },
}
_COMPLETION = _object(
    ["id", "object", "created", "model", "choices"],
    {
        "id": _STR,
        "object": _STR,
        "created": _INT,
        "model": _STR,
        "choices": {"type": "array", "items": {"type": "object", "properties": {"logprobs": _LOGPROBS}}},
        "usage": _USAGE,
    },
)


def _errors(*codes: int) -> dict[str, Any]:
    return {
        str(c): {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        for c in codes
    }


# A completion (JSON), or server-sent events when stream is true: each event's data is a JSON chunk
# (or an error object), then "[DONE]". 408: the body came too slowly; 415: a keyless server takes
# only application/json bodies; 431: headers past 16 KiB; 503: a full queue, or a shutdown.
_COMPLETION_ERRORS = (400, 401, 404, 408, 413, 415, 429, 431, 500, 503)
_COMPLETION_OK = {
    "description": "a completion (JSON), or server-sent events when stream is true",
    "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/Completion"}},
        "text/event-stream": {"schema": _object(["data"], {"data": _STR, "event": _STR})},
    },
}


def _post(summary: str, body: dict[str, Any], ok: dict[str, Any], codes: tuple[int, ...]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "security": [{"bearer": []}, {}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {"200": ok, **_errors(*codes)},
        }
    }


def _get(summary: str, content: dict[str, Any], auth: bool = True) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": {"description": "ok", "content": content}}
    if auth:
        responses.update(_errors(401, 429))
    return {"get": {"summary": summary, "responses": responses, **({"security": [{"bearer": []}, {}]} if auth else {})}}


def openapi_schema() -> dict[str, Any]:
    chat = _object(
        ["messages"],
        {
            **_COMMON,
            "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
            **_TOOLS,
            "max_tokens": _MAX_TOKENS,
            "max_completion_tokens": _MAX_TOKENS,
            "logprobs": {"type": "boolean", "nullable": True},
            "top_logprobs": {
                **_INT,
                "minimum": 0,
                "maximum": limits.MAX_LOGPROBS,
                "nullable": True,
                "description": "alternatives per token; more than 0 needs logprobs: true",
            },
        },
    )
    completion = _object(
        ["prompt"],
        {
            **_COMMON,
            "prompt": {
                "oneOf": [
                    _STR,
                    {"type": "array", "minItems": 1, "items": _STR},
                    {"type": "array", "minItems": 1, "items": _TOKEN_ID, "description": "token ids"},
                    {"type": "array", "minItems": 1, "items": {"type": "array", "minItems": 1, "items": _TOKEN_ID}},
                ]
            },
            "max_tokens": _MAX_TOKENS,
            "logprobs": {**_INT, "minimum": 0, "maximum": 5, "nullable": True},
        },
    )
    inference = _object(
        ["prompt"],
        {
            "prompt": {**_STR, "minLength": 1},
            "images": {"type": "array", "items": {**_STR, "description": "a base64 image (or a data: URL)"}, "nullable": True},
            "max_tokens": _MAX_TOKENS,
            "temperature": _TEMPERATURE,
            **_STRUCTURED,
        },
    )
    inference_out = _object(
        ["id", "content", "token_count", "latency_ms"], {"id": _STR, "content": _STR, "token_count": _INT, "latency_ms": _NUM}
    )
    obj = {"application/json": {"schema": {"type": "object"}}}
    tokenize = _object(
        [],
        {
            "model": _NULLABLE_STR,
            "prompt": _NULLABLE_STR,
            "messages": {"type": "array", "items": _MESSAGE, "nullable": True},
            "add_special_tokens": {"type": "boolean", "nullable": True},
            "add_generation_prompt": {"type": "boolean", "nullable": True},
            "return_token_strs": {"type": "boolean", "nullable": True},
        },
    )
    detokenize = _object(["tokens"], {"model": _NULLABLE_STR, "tokens": {"type": "array", "items": {**_INT, "minimum": 0}}})
    item = {"type": "object", "description": "a message (role, content), function_call or function_call_output item"}
    responses = _object(
        ["input"],
        {
            "model": _NULLABLE_STR,
            "input": {"oneOf": [_STR, {"type": "array", "minItems": 1, "items": item}]},
            "instructions": _NULLABLE_STR,
            "max_output_tokens": _MAX_TOKENS,
            "temperature": _TEMPERATURE,
            "tools": {"type": "array", "items": {"type": "object", "description": "a function tool: type, name, parameters"}},
            "tool_choice": {"oneOf": [{"type": "string", "enum": ["auto", "none", "required"]}, {"type": "object"}]},
            "text": {"type": "object", "description": "format: text, json_object, or json_schema (name, schema)"},
            "stream": {"type": "boolean", "nullable": True},
        },
    )
    response_ok = {
        "description": "a response object (JSON), or typed server-sent events when stream is true",
        "content": {"application/json": obj, "text/event-stream": {"schema": _object(["data"], {"data": _STR, "event": _STR})}},
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "WiCore API", "version": wicore.__version__, "description": "OpenAI-compatible inference API"},
        "paths": {
            "/v1/chat/completions": _post("Chat completion", chat, _COMPLETION_OK, _COMPLETION_ERRORS),
            "/v1/completions": _post("Text completion", completion, _COMPLETION_OK, _COMPLETION_ERRORS),
            "/v1/inference": _post(
                "Original WiCore API (images go where the prompt writes <start_of_image>, else in front)",
                inference,
                {"description": "ok", "content": {"application/json": {"schema": inference_out}}},
                (400, 401, 408, 413, 415, 429, 431, 500, 503),
            ),
            "/v1/responses": _post(
                "OpenAI's Responses API (function tools, text.format; nothing stored)", responses, response_ok, _COMPLETION_ERRORS
            ),
            "/v1/models": _get("Served models", obj),
            "/v1/models/{model_id}": {
                "get": {
                    **_get("The served model's card (404 for another id)", obj)["get"],
                    "responses": {**_get("", obj)["get"]["responses"], **_errors(404)},
                    "parameters": [{"name": "model_id", "in": "path", "required": True, "schema": _STR}],
                }
            },
            "/tokenize": _post(
                "Text (prompt) or a conversation (messages) to the token ids the endpoints would run (vLLM's)",
                tokenize,
                {"description": "ok", "content": obj},
                (400, 401, 404, 413, 429),
            ),
            "/detokenize": _post(
                "Token ids to text (vLLM's)", detokenize, {"description": "ok", "content": obj}, (400, 401, 404, 413, 429)
            ),
            "/v1/stats": _get("Engine state", obj),
            "/metrics": _get("Prometheus metrics", {"text/plain": {"schema": _STR}}),
            "/health": _get("Liveness", obj, auth=False),
        },
        "components": {
            "schemas": {"Error": _ERROR, "Completion": _COMPLETION},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


async def openapi_route(request: Request) -> Response:
    return JSONResponse(openapi_schema())
