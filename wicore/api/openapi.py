"""/openapi.json: the endpoints and the request fields this server checks, OpenAPI 3.0."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

_NUM = {"type": "number"}
_INT = {"type": "integer"}
_STOP = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 16}], "nullable": True}
_COMMON: dict[str, Any] = {
    "model": {"type": "string", "nullable": True},
    "temperature": {**_NUM, "minimum": 0, "maximum": 2, "nullable": True},
    "top_p": {**_NUM, "exclusiveMinimum": True, "minimum": 0, "maximum": 1, "nullable": True},
    "top_k": {**_INT, "minimum": -1, "nullable": True},
    "seed": {**_INT, "minimum": -(2**63), "maximum": 2**64 - 1, "nullable": True},  # signed or unsigned 64-bit
    "stop": _STOP,
    "n": {**_INT, "minimum": 1, "maximum": 16, "nullable": True},
    "stream": {"type": "boolean", "nullable": True},
    "stream_options": {"type": "object", "nullable": True, "properties": {"include_usage": {"type": "boolean"}}},
    "presence_penalty": {**_NUM, "minimum": -2, "maximum": 2, "nullable": True},
    "frequency_penalty": {**_NUM, "minimum": -2, "maximum": 2, "nullable": True},
    "user": {"type": "string", "nullable": True},
    "priority": {"type": "string", "enum": ["low", "normal", "high", "urgent"], "nullable": True},
}
_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant"]},
        "content": {
            "oneOf": [
                {"type": "string"},
                {
                    "type": "array",
                    "items": {
                        "oneOf": [
                            {
                                "type": "object",
                                "required": ["type", "text"],
                                "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
                            },
                            {
                                "type": "object",
                                "description": "an image: a data: URL (base64 PNG, JPEG, WebP or GIF); http(s) URLs only "
                                "where the server fetches them (--allow-image-urls)",
                                "required": ["type", "image_url"],
                                "properties": {
                                    "type": {"type": "string", "enum": ["image_url"]},
                                    "image_url": {
                                        "type": "object",
                                        "required": ["url"],
                                        "properties": {"url": {"type": "string"}, "detail": {"type": "string"}},
                                    },
                                },
                            },
                        ]
                    },
                },
            ]
        },
    },
}
_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": "string", "nullable": True},
                "code": {"type": "string", "nullable": True},
            },
        }
    },
}
_USAGE = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT},
}
_TOKEN_LOGPROB = {
    "type": "object",
    "required": ["token", "logprob", "bytes"],
    "properties": {"token": {"type": "string"}, "logprob": _NUM, "bytes": {"type": "array", "items": _INT, "nullable": True}},
}
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
        "tokens": {"type": "array", "items": {"type": "string"}},
        "token_logprobs": {"type": "array", "items": _NUM},
        "top_logprobs": {"type": "array", "items": {"type": "object", "additionalProperties": _NUM}},
        "text_offset": {"type": "array", "items": _INT},
    },
}
_COMPLETION = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string"},
        "created": _INT,
        "model": {"type": "string"},
        "choices": {"type": "array", "items": {"type": "object", "properties": {"logprobs": _LOGPROBS}}},
        "usage": _USAGE,
    },
}


def _errors(*codes: int) -> dict[str, Any]:
    return {
        str(c): {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        for c in codes
    }


def _post(summary: str, body: dict[str, Any]) -> dict[str, Any]:
    ok = {
        "description": "a completion (JSON), or server-sent events when stream is true",
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Completion"}},
            # One server-sent event: data is a JSON chunk (or an error object), then "[DONE]".
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "required": ["data"],
                    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
                }
            },
        },
    }
    return {
        "post": {
            "summary": summary,
            "security": [{"bearer": []}, {}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {"200": ok, **_errors(400, 401, 404, 413, 429, 500, 503)},
        }
    }


def _get(summary: str, content: dict[str, Any], auth: bool = True) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": {"description": "ok", "content": content}}
    if auth:
        responses.update(_errors(401, 429))
    return {"get": {"summary": summary, "responses": responses, **({"security": [{"bearer": []}, {}]} if auth else {})}}


def openapi_schema() -> dict[str, Any]:
    chat = {
        "type": "object",
        "required": ["messages"],
        "properties": {
            **_COMMON,
            "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
            "max_tokens": {**_INT, "minimum": 1, "nullable": True},
            "max_completion_tokens": {**_INT, "minimum": 1, "nullable": True},
            "logprobs": {"type": "boolean", "nullable": True},
            "top_logprobs": {
                **_INT,
                "minimum": 0,
                "maximum": 20,
                "nullable": True,
                "description": "alternatives per token; more than 0 needs logprobs: true",
            },
        },
    }
    completion = {
        "type": "object",
        "required": ["prompt"],
        "properties": {
            **_COMMON,
            "prompt": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "string"}}]},
            "max_tokens": {**_INT, "minimum": 1, "nullable": True},
            "logprobs": {**_INT, "minimum": 0, "maximum": 5, "nullable": True},
        },
    }
    inference = {
        "type": "object",
        "required": ["prompt"],
        "properties": {
            "prompt": {"type": "string", "minLength": 1},
            "images": {
                "type": "array",
                "items": {"type": "string", "description": "a base64 image (or a data: URL)"},
                "nullable": True,
            },
            "max_tokens": {**_INT, "minimum": 1, "nullable": True},
            "temperature": {**_NUM, "minimum": 0, "maximum": 2, "nullable": True},
        },
    }
    inference_out = {
        "type": "object",
        "required": ["id", "content", "token_count", "latency_ms"],
        "properties": {"id": {"type": "string"}, "content": {"type": "string"}, "token_count": _INT, "latency_ms": _NUM},
    }
    obj = {"application/json": {"schema": {"type": "object"}}}
    return {
        "openapi": "3.0.3",
        "info": {"title": "WiCore", "version": "1", "description": "OpenAI-compatible inference API"},
        "paths": {
            "/v1/chat/completions": _post("Chat completion", chat),
            "/v1/completions": _post("Text completion", completion),
            "/v1/inference": {
                "post": {
                    "summary": "Original WiCore API (images go where the prompt writes <start_of_image>, else in front)",
                    "security": [{"bearer": []}, {}],
                    "requestBody": {"required": True, "content": {"application/json": {"schema": inference}}},
                    "responses": {
                        "200": {"description": "ok", "content": {"application/json": {"schema": inference_out}}},
                        **_errors(400, 401, 413, 429, 500, 503),
                    },
                }
            },
            "/v1/models": _get("Served models", obj),
            "/v1/stats": _get("Engine state", obj),
            "/metrics": _get("Prometheus metrics", {"text/plain": {"schema": {"type": "string"}}}),
            "/health": _get("Liveness", obj, auth=False),
        },
        "components": {
            "schemas": {"Error": _ERROR, "Completion": _COMPLETION},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


async def openapi_route(request: Request) -> Response:
    return JSONResponse(openapi_schema())
