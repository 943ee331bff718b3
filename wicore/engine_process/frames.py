"""What crosses the socket between the API process and the engine process, and how it is framed.

A frame is a 4-byte big-endian length and a pickle. The API process sends a list of commands
(`Add`, `Abort`, `Stop`) a frame, those its event loop gathered in one turn; the engine process
answers `Ready` or `Failed` once, then lists of `Step`, one a step, or several where the API
process fell behind reading (the sender sends what queued up as one frame).
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from wicore.engine.stats import EngineStats
from wicore.errors import WiCoreError
from wicore.types.images import ImageInput, ImagePlacement
from wicore.types.outputs import Priority, RequestOutput
from wicore.types.sampling import SamplingParams

_HEADER = struct.Struct("!I")


@dataclass(frozen=True)
class Add:
    """Queue a request the API process checked (ids, length, queue room)."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    priority: Priority
    deadline: float | None  # seconds from its arrival in the engine process
    images: tuple[ImageInput, ...] = ()  # encoded in the engine process, in the step


@dataclass(frozen=True)
class Abort:
    request_id: str


@dataclass(frozen=True)
class Stop:
    """Stop stepping and exit (requests in flight are left as they are)."""


@dataclass(frozen=True)
class EngineInfo:
    """What the API process must know of the engine, fixed at its start."""

    check: Callable[[list[int], SamplingParams, Sequence[ImageInput]], object]  # raises where Engine.add_request would
    images: ImagePlacement | None  # where images go in a prompt; None: the model takes none
    max_sequence_tokens: int
    max_waiting: int
    summary: str  # the startup line's engine half (wicore.engine_process.info.describe)
    stats: EngineStats


@dataclass(frozen=True)
class Ready:
    info: EngineInfo


@dataclass(frozen=True)
class Failed:
    """The engine could not start: the error as the CLI reports it, or a bug's one-line text."""

    error: WiCoreError | None
    text: str


@dataclass(frozen=True)
class Step:
    """One step's news: every request's outputs, the refusals of requests taken since the last,
    the requests waiting after it, how many `Add`s the engine process has taken so far (the API
    process counts the rest as waiting too), and the stats after it where they are due (None: the
    last ones still stand; the child's STATS_EVERY)."""

    outputs: list[RequestOutput]
    stats: EngineStats | None
    waiting: int
    num_taken: int
    refusals: list[tuple[str, WiCoreError]] = field(default_factory=list)


def encode(message: Any) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


def read(sock: socket.socket) -> Any:
    """The next frame's message from a blocking socket; EOFError when the other end closed."""
    (size,) = _HEADER.unpack(_read_exactly(sock, _HEADER.size))
    return pickle.loads(_read_exactly(sock, size))


async def read_async(reader: asyncio.StreamReader) -> Any:
    """The next frame's message; asyncio.IncompleteReadError when the other end closed."""
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    return pickle.loads(await reader.readexactly(size))


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the other process closed its end")
        data += chunk
    return bytes(data)
