"""Errors a user can hit. Each says what went wrong and what to do about it.

The CLI maps every `WiCoreError` to a message on stderr and a non-zero exit
code; the HTTP API (wicore.api.errors) maps them to OpenAI-shaped errors.
"""

from __future__ import annotations


class WiCoreError(Exception):
    """Base class of the errors a user can cause and fix."""

    exit_code = 2


class ModelSourceError(WiCoreError):
    """A model source (GGUF file, HF folder, packaged name) is missing or unreadable."""


class UnsupportedModelError(WiCoreError):
    """The source holds an architecture or tensor layout WiCore cannot compile."""


class ManifestError(WiCoreError):
    """An exported model folder is incomplete, tampered with or from another version."""


class RuntimeMissingError(WiCoreError):
    """No ONNX Runtime build is installed."""


class UsageError(WiCoreError):
    """A command-line flag or argument that cannot be used as given (the CLI's own errors)."""


class RequestError(WiCoreError):
    """A generation request cannot be served as asked (e.g. prompt longer than the context)."""


class ContextLengthError(RequestError):
    """A prompt leaves no room for a generated token in the context or the device KV cache."""


class ImageTokenError(RequestError):
    """A request has images, but the model's tokenizer lacks its vision config's image tokens."""


class OverloadedError(WiCoreError):
    """The engine's waiting queue is full; retry later."""


class EngineDiedError(WiCoreError):
    """The engine's process (`wicore serve --engine-process on`) died: the server stops."""


class StructuredOutputError(RequestError):
    """A request's structured-output constraint (a JSON schema, regex, choice or grammar) cannot be
    compiled, or is over a limit; `field` is the request field it came from."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self) -> tuple[type[StructuredOutputError], tuple[str, str]]:  # pickled whole (Ray replicas)
        return (type(self), (str(self), self.field))
