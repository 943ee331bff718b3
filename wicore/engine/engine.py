"""The engine: requests in, token streams out; an `EngineCore` stepped by one thread behind a queue.

Everything that generates drives it: `wicore serve`, `wicore generate`, `wicore-export
--verify` and the tools (which may also step an `EngineCore` themselves).

    caller threads / the event loop          │ the engine thread (owns the core; no lock on it)
                                             │
    add_request: tokenize, core.check(...) ──┼─► inbox ──► core.add / core.abort
    abort(id), cancel(id) ───────────────────┼─►            │
                                             │           outputs = core.step()
    outputs(id) / stream(id) ◄── Channel ◄───┼──────────── emit; publish stats()
    stats() ◄── the last published snapshot  │

What a request can be told at once is told on the caller's thread: a prompt that can never fit
(`EngineCore.check`, which reads only what construction fixed), a full queue and a duplicate id
(the front's own books, under a small lock the core never takes).

A model exported with a vision partition takes images with a prompt (`add_request(...,
images=)`): their embeddings replace the prompt's image tokens (wicore.types.images,
wicore.executor.vision), and image requests batch with text-only ones.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace

from wicore.devices.providers import Device
from wicore.engine.channel import Channel, put_all
from wicore.engine.config import EngineConfig
from wicore.engine.core import EngineCore
from wicore.engine.request import Request
from wicore.engine.stats import EngineStats
from wicore.errors import OverloadedError, RequestError
from wicore.executor.constrained import Grammars
from wicore.executor.vision import NO_VISION, VisionEncoder
from wicore.graph.manifest import Manifest
from wicore.inputs.tokenizer import Tokenizer
from wicore.kv.layout import KVLayout
from wicore.types.images import ImageInput
from wicore.types.outputs import Completion, Priority, RequestOutput
from wicore.types.sampling import SamplingParams

IDLE_WAIT = 0.01  # seconds the thread waits for news when nothing could run (a deadline may pass)


@dataclass(frozen=True)
class _Add:
    request: Request


@dataclass(frozen=True)
class _Abort:
    request_id: str


class _Stop:
    pass


def check_queue(request_id: str, is_known: bool, num_waiting: int, max_waiting: int) -> None:
    """The front's own refusals, before a request is queued: a duplicate id, a full queue (the
    `Engine`'s, and the engine process's client's: wicore.engine_process.client)."""
    if is_known:
        raise RequestError(f"request id {request_id!r} is already in use")
    if num_waiting >= max_waiting:
        raise OverloadedError(f"overloaded: {num_waiting} requests already waiting; retry later")


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.core = EngineCore(config)
        self._ids = itertools.count()
        self._inbox: queue.SimpleQueue[_Add | _Abort | _Stop] = queue.SimpleQueue()
        self._lock = threading.Lock()  # the front's books: channels, requests not yet in the core
        self._channels: dict[str, Channel] = {}
        self._num_in_inbox = 0  # requests added but not yet handed to the core
        self._stats = self.core.stats()  # the last snapshot the engine thread published
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> Engine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="wicore-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop stepping (requests in flight are left as they are) and free the KV tiers."""
        if self._thread is not None:
            self._inbox.put(_Stop())
            self._thread.join()
            self._thread = None
        self.core.close()

    def __enter__(self) -> Engine:
        """`with Engine(...) as e:` guarantees stop(); start() stays explicit, so requests
        can be queued before the first step."""
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the model -------------------------------------------------------------------
    @property
    def manifest(self) -> Manifest:
        return self.core.manifest

    @property
    def config(self) -> EngineConfig:
        return self.core.config

    @property
    def layout(self) -> KVLayout:
        return self.core.layout

    @property
    def vision(self) -> VisionEncoder | None:
        return self.core.vision

    @property
    def devices(self) -> tuple[Device, ...]:
        """Where the model's partitions run, in order."""
        return self.core.devices

    @property
    def tokenizer(self) -> Tokenizer:
        """The model folder's tokenizer (RequestError for a model exported without one)."""
        return self.core.need_tokenizer()

    @property
    def grammars(self) -> Grammars:
        """The output constraints' compiler (thread-safe: the API compiles ahead of queuing)."""
        return self.core.grammars

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every token id that ends a request (unless it sets ignore_eos)."""
        return self.core.eos_token_ids

    @property
    def max_context(self) -> int:
        """Tokens (prompt + generated) one sequence may reach: the model's context, or less if configured."""
        return self.core.max_context

    @property
    def max_waiting(self) -> int:
        """Requests the queue holds at most: a batch of more can never be admitted whole."""
        return self.core.scheduler.config.max_waiting

    @property
    def max_sequence_tokens(self) -> int:
        """Most tokens one request may reach: the context, or what the device KV cache holds."""
        return self.core.max_sequence_tokens

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
        """Queue a request; `deadline` is in seconds from now. Returns its id. `images` go, in
        order, where the prompt has an image: a `<start_of_image>` in text, a run of the image
        token in ids (`expand_images` writes it).

        Runs on the caller's thread (tokenizing a long prompt takes a while: call it off an
        event loop). Raises RequestError (ContextLengthError for a prompt with no room left)
        or OverloadedError; a request that raises was not queued."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(self.expand_images(prompt) if images else prompt)
        else:
            ids = list(prompt)
        priority = Priority.parse(priority)
        with self._lock:
            request_id = request_id or f"req-{next(self._ids)}"
        request = self.core.make_request(ids, params, request_id, priority, deadline, images)
        with self._lock:
            check_queue(request_id, request_id in self._channels, self.num_queued, self.max_waiting)
            self._channels[request_id] = Channel()
            self._num_in_inbox += 1
            self._inbox.put(_Add(request))
        return request_id

    def has_request(self, request_id: str) -> bool:
        """A request with this id was queued and has not ended, or has ended with its outputs unread."""
        with self._lock:
            return request_id in self._channels

    @property
    def num_queued(self) -> int:
        """Requests waiting for their first step: in the core's queue (as of its last news) or
        not yet handed to it."""
        return self.stats().waiting

    def expand_images(self, text: str) -> str:
        """`text` with each `<start_of_image>` expanded into its image's tokens, as HF's Gemma3Processor
        does; encode the result and pass the images with it to `add_request`."""
        if self.vision is None:
            raise RequestError(NO_VISION)
        return self.vision.expand(text, self.tokenizer)

    def abort(self, request_id: str) -> None:
        """End the request at the next step (reason "abort"); its outputs can still be read."""
        self._inbox.put(_Abort(request_id))

    def cancel(self, request_id: str) -> None:
        """Abort a request whose outputs nobody will read: its channel is claimed, and so goes when it ends."""
        self.abort(request_id)
        with contextlib.suppress(RequestError):  # an unknown request, or one whose channel was claimed
            self.outputs(request_id)

    def outputs(self, request_id: str) -> Channel:
        """The request's output channel: iterate it (blocking) or `async for` over it.

        The caller takes it over: the engine forgets a claimed channel once it has put the
        final output, and a channel whose request already ended when it is claimed.
        """
        with self._lock:
            channel = self._channels.get(request_id)
            if channel is None:
                raise RequestError(f"unknown request id {request_id!r} (or its outputs were already claimed)")
            channel.claimed = True
            if channel.is_finished:
                del self._channels[request_id]
            return channel

    async def stream(self, request_id: str) -> AsyncIterator[RequestOutput]:
        """`async for` over the request's outputs (claims its channel, as `outputs` does)."""
        async for output in self.outputs(request_id):
            yield output

    def generate(
        self,
        prompts: list[str | list[int]],
        params: SamplingParams | list[SamplingParams],
        images: Sequence[Sequence[ImageInput]] = (),
    ) -> list[Completion]:
        """Run prompts concurrently to their ends (starting the engine if needed); blocking.
        `images[i]`: the images of prompt i (none where the list is shorter)."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        request_ids: list[str] = []
        try:
            for i, (prompt, sp) in enumerate(zip(prompts, params_list)):
                request_ids.append(self.add_request(prompt, sp, images=images[i] if i < len(images) else ()))
        except Exception:  # all or nothing: the prompts queued so far are taken back
            for request_id in request_ids:
                self.cancel(request_id)
            raise
        self.start()
        completions = []
        for request_id in request_ids:
            tokens, end, prompt_logits = [], None, None
            for out in self.outputs(request_id):
                tokens += out.new_token_ids
                prompt_logits = out.prompt_logits if out.prompt_logits is not None else prompt_logits
                end = out
            assert end is not None
            completions.append(Completion(tokens, end.finish_reason, end.num_prompt_tokens, end.error, prompt_logits))
        return completions

    # -- the engine thread -----------------------------------------------------------
    def _loop(self) -> None:
        core = self.core
        while True:
            # Block for news when there is nothing to step; else take what came and step.
            if not self._take(block=not core.has_work):
                return
            if not core.has_work:
                continue
            steps = core.num_steps
            outputs = core.step()
            self._stats = core.stats()
            self._emit(outputs)
            idle = core.num_steps == steps and not outputs  # nothing could run: wait for news or a deadline
            if idle and not self._take(block=True, timeout=IDLE_WAIT):
                return

    def _take(self, block: bool, timeout: float | None = None) -> bool:
        """Hand the inbox's commands to the core (waiting for the first if `block`); False on stop."""
        try:
            command = self._inbox.get(block=block, timeout=timeout)
        except queue.Empty:
            return True
        while True:
            if isinstance(command, _Stop):
                return False
            if isinstance(command, _Add):
                self.core.add(command.request)
                with self._lock:
                    self._num_in_inbox -= 1
            else:
                self.core.abort(command.request_id)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                self._stats = self.core.stats()
                return True

    def _emit(self, outputs: list[RequestOutput]) -> None:
        """Hand a step's outputs to their channels, waking each consumer's event loop once (channel.put_all)."""
        delivered = []
        with self._lock:
            for output in outputs:
                channel = self._channels.get(output.request_id)
                if channel is None or channel.is_finished:
                    continue
                delivered.append((channel, output))
                channel.is_finished = channel.is_finished or output.finished  # a second final output is dropped
                if output.finished and channel.claimed:
                    del self._channels[output.request_id]
        put_all(delivered)

    # -- stats -----------------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        return self.core.num_steps

    def stats(self) -> EngineStats:
        """Queues, KV blocks and counters as of the engine thread's last step (or its last
        news): never waits for a step. Before start and after stop, read from the core."""
        stats = self._stats if self._thread is not None else self.core.stats()
        # Requests added and not yet handed to the core wait too (before start(), all of them do).
        return replace(stats, waiting=stats.waiting + self._num_in_inbox) if self._num_in_inbox else stats

    def stats_json(self) -> dict[str, object]:
        """`stats()` in /v1/stats' JSON shape (the API's seam: wicore.api.serving)."""
        return self.stats().to_dict()
