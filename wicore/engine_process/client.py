"""The engine the app talks to (wicore.api.serving.ServingEngine) when the engine runs in a child
process (wicore.engine_process.child): the API process keeps the tokenizer, the output channels
and the books of what it queued; the child owns the core.

    spawn(start)     the child started ("spawn": CUDA takes no fork), its `Ready` awaited
    attach()         on the server's event loop: the socket read by one task, never a thread
    add_request      checked here as `Engine.add_request` checks (the same Limits.check, the
                     same queue and id rules), then an `Add` queued for this loop turn's frame
    outputs(id)      the request's Channel, fed from each `Step` as `Engine._emit` feeds it
    stats_json()     the last stats a Step carried, the Adds not yet taken counted as waiting

What differs from an Engine in the same process:
- Output constraints (`grammars` is None) compile when the request reaches the child; one that
  does not compile is raised from `outputs` (a streamed request's error event, same status).
- Images are checked here (where they go in the prompt: the ImagePlacement the child sends) and
  encoded in the child, in its step; their pixels cross the socket with the request.
- A deadline counts from the request's arrival in the child (a frame later).
- When the child dies, every open request ends with EngineDiedError (a 503) and `on_death` is
  told, once, in one line; `wicore serve` then stops with a non-zero exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import select
import signal
import socket
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from pathlib import Path

from wicore.engine.channel import Channel, put_all
from wicore.engine.engine import check_queue
from wicore.engine.stats import EngineStats
from wicore.engine_process.child import serve_core
from wicore.engine_process.frames import Abort, Add, EngineInfo, Failed, Ready, Step, Stop, encode, read, read_async
from wicore.engine_process.info import SteppedCore
from wicore.errors import EngineDiedError, RequestError, WiCoreError
from wicore.executor.vision import NO_VISION
from wicore.graph.manifest import Manifest
from wicore.inputs.tokenizer import Tokenizer
from wicore.model.tokenizer_info import TokenizerInfo
from wicore.types.images import ImageInput, ImagePlacement
from wicore.types.outputs import Priority, RequestOutput
from wicore.types.sampling import SamplingParams

log = logging.getLogger("wicore.engine_process")

STOP_WAIT_S = 30.0  # for the child to close its sessions and KV tiers, before it is killed
READ_LIMIT = 16 << 20  # the socket reader's buffer: a step of many requests is one frame


def model_tokenizer(model_dir: Path) -> Tokenizer | None:
    """The export's tokenizer, as the engine core loads it (None: exported without one)."""
    info = Manifest.read(model_dir).tokenizer
    return None if info is None else Tokenizer(model_dir, TokenizerInfo.from_dict(info))


class EngineClient:
    def __init__(self, process: multiprocessing.process.BaseProcess, sock: socket.socket, info: EngineInfo, tokenizer: Tokenizer | None) -> None:  # fmt: skip
        self._process = process
        self._sock = sock
        self.info = info
        self._tokenizer = tokenizer
        self._stats = info.stats
        self._waiting = info.stats.waiting  # the child's queue as of its last step (every Step says)
        self._channels: dict[str, Channel] = {}
        # Why a request ended before it ran (refused by the child, or the child died), by its channel:
        # raised to the reader after the final output; gone with the channel.
        self._errors: weakref.WeakKeyDictionary[Channel, WiCoreError] = weakref.WeakKeyDictionary()
        self._num_sent = 0  # Adds sent to the child
        self._num_taken = 0  # of those, taken by its core (as of the last Step)
        self._pending: list[Add | Abort] = []  # this loop turn's commands, sent as one frame
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader: asyncio.Task | None = None
        self._on_death: Callable[[str], None] | None = None
        self._stopping = False
        self.died: str | None = None  # why, once the child died

    # -- lifecycle -------------------------------------------------------------------
    @classmethod
    def spawn(cls, start: Callable[[], tuple[SteppedCore, EngineInfo]], tokenizer: Tokenizer | None) -> EngineClient:
        """Start the child, which builds its core with `start` (picklable: a module-level function
        or a partial of one), and wait until it is ready; its startup error is raised here."""
        ours, theirs = socket.socketpair()
        process = multiprocessing.get_context("spawn").Process(
            target=serve_core, args=(start, theirs), name="wicore-engine", daemon=True
        )
        process.start()
        theirs.close()
        try:
            while not select.select([ours], [], [], 1.0)[0]:
                if not process.is_alive():
                    raise EngineDiedError(f"the engine process {_ended(process.exitcode)} while it started; see above")
            message = read(ours)
        except BaseException:
            ours.close()  # the child reads EOF, and stops once its core is built
            _end(process)
            raise
        if isinstance(message, Failed):
            process.join()
            ours.close()
            raise message.error or EngineDiedError(f"the engine process failed to start: {message.text}")
        assert isinstance(message, Ready)
        log.info("engine process %d ready", process.pid)
        return cls(process, ours, message.info, tokenizer)

    async def attach(self, on_death: Callable[[str], None]) -> None:
        """Read the child's steps on the running event loop from now on; `on_death(line)` when it dies."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._on_death = on_death
        reader, self._writer = await asyncio.open_connection(sock=self._sock, limit=READ_LIMIT)
        self._reader = self._loop.create_task(self._read(reader))

    def stop(self) -> None:
        """Tell the child to stop, wait for it (then kill it), and close the socket."""
        self._stopping = True
        if self._process.is_alive():
            with contextlib.suppress(OSError):
                self._sock.setblocking(True)
                self._sock.sendall(encode([Stop()]))
        _end(self._process)
        self._sock.close()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    # -- what the app reads ----------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            raise RequestError("this model was exported without a tokenizer: send token ids")
        return self._tokenizer

    @property
    def vision(self) -> ImagePlacement | None:
        return self.info.images

    @property
    def grammars(self) -> None:
        """None: the child compiles a constraint when the request arrives (module docstring)."""
        return None

    @property
    def max_sequence_tokens(self) -> int:
        return self.info.max_sequence_tokens

    @property
    def max_waiting(self) -> int:
        return self.info.max_waiting

    def expand_images(self, text: str) -> str:
        """As Engine.expand_images: each `<start_of_image>` expanded into its image's tokens."""
        if self.info.images is None:
            raise RequestError(NO_VISION)
        return self.info.images.expand(text, self.tokenizer)

    # -- requests --------------------------------------------------------------------
    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        priority: Priority | str = Priority.NORMAL,
        deadline: float | None = None,
        request_id: str | None = None,
        images: Sequence[ImageInput] = (),
    ) -> str:
        """Engine.add_request's checks, here and now; the child's own refusals (a constraint that
        does not compile) come out of `outputs`."""
        if self.died is not None:
            raise EngineDiedError(self.died)
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(self.expand_images(prompt) if images else prompt)
        else:
            ids = list(prompt)
        request_id = request_id or f"req-{self._num_sent}"
        self.info.check(ids, params, images)
        check_queue(request_id, request_id in self._channels, self.num_queued, self.max_waiting)
        self._channels[request_id] = Channel()
        self._num_sent += 1
        self._post(Add(request_id, ids, params, Priority.parse(priority), deadline, tuple(images)))
        return request_id

    def abort(self, request_id: str) -> None:
        if request_id in self._channels:
            self._post(Abort(request_id))

    def cancel(self, request_id: str) -> None:
        self.abort(request_id)
        channel = self._channels.get(request_id)
        if channel is not None:
            channel.claimed = True
            if channel.is_finished:
                del self._channels[request_id]

    async def outputs(self, request_id: str) -> AsyncIterator[RequestOutput]:
        channel = self._channels.get(request_id)
        if channel is None or channel.claimed:
            raise RequestError(f"unknown request id {request_id!r} (or its outputs were already claimed)")
        channel.claimed = True
        if channel.is_finished:
            del self._channels[request_id]
        async for out in channel:
            error = self._errors.get(channel) if out.finished else None
            if error is not None:
                raise error
            yield out

    # -- stats -----------------------------------------------------------------------
    @property
    def num_queued(self) -> int:
        """Requests waiting for their first step: in the child's queue (as of its last step) or
        sent and not yet taken by its core."""
        return self._waiting + self._num_sent - self._num_taken

    def stats(self) -> EngineStats:
        """The child's stats as of its last step; Adds it has not taken yet wait too."""
        waiting = self.num_queued
        return replace(self._stats, waiting=waiting) if waiting != self._stats.waiting else self._stats

    def stats_json(self) -> dict[str, object]:
        return self.stats().to_dict()

    # -- the socket ------------------------------------------------------------------
    def _post(self, command: Add | Abort) -> None:
        """Queue a command for this loop turn's frame (from any thread)."""
        if self._loop is None:
            raise RuntimeError("EngineClient.attach() was not awaited")
        if threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self._post, command)
            return
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(command)

    def _flush(self) -> None:
        commands, self._pending = self._pending, []
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(encode(commands))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                steps: list[Step] = await read_async(reader)
                for step in steps:
                    self._apply(step)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except Exception:
            log.exception("reading the engine process's steps failed")
        if not self._stopping:
            await self._died()

    def _apply(self, step: Step) -> None:
        """A step's news: stats, refusals (each ends its request), then every output to its channel."""
        if step.stats is not None:
            self._stats = step.stats
        self._waiting, self._num_taken = step.waiting, step.num_taken
        self._deliver([*self._end_with(step.refusals), *step.outputs])

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """To their channels, as Engine._emit: a finished channel takes no more; one claimed goes."""
        delivered = []
        for output in outputs:
            channel = self._channels.get(output.request_id)
            if channel is None or channel.is_finished:
                continue
            delivered.append((channel, output))
            channel.is_finished = channel.is_finished or output.finished
            if output.finished and channel.claimed:
                del self._channels[output.request_id]
        put_all(delivered)

    def _end_with(self, errors: list[tuple[str, WiCoreError]]) -> list[RequestOutput]:
        """The final outputs of requests that end with these errors (raised to their readers)."""
        ended = []
        for request_id, error in errors:
            channel = self._channels.get(request_id)
            if channel is not None and not channel.is_finished:
                self._errors[channel] = error
                ended.append(RequestOutput(request_id, [], True, "error", error=str(error)))
        return ended

    async def _died(self) -> None:
        await asyncio.to_thread(self._process.join, 5.0)
        self.died = f"the engine process (pid {self._process.pid}) {_ended(self._process.exitcode)}"
        error = EngineDiedError(f"{self.died}: the server is stopping")
        self._deliver(self._end_with([(request_id, error) for request_id in self._channels]))
        if self._on_death is not None:
            self._on_death(self.died)


def _ended(exitcode: int | None) -> str:
    if exitcode is None:
        return "closed its socket"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _end(process: multiprocessing.process.BaseProcess) -> None:
    """Wait for the child to exit (it was told to stop), then kill it."""
    process.join(STOP_WAIT_S)
    if process.is_alive():
        log.warning("the engine process %d did not stop within %g s: killing it", process.pid, STOP_WAIT_S)
        process.kill()
        process.join()
