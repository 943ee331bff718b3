"""The engine: requests in, token streams out, one step loop on its own thread.

Everything that generates drives it: `wicore serve`, `wicore generate`, `wicore-export
--verify` and the tools. One step:

    add_request(...) ──► admission ──► ┌──────────── step loop (engine thread) ─────────────┐
    abort(id)        ──►               │ out = scheduler.schedule()         rows, moves     │
                                       │ lost = kv.execute(out.moves)       move blocks     │
                                       │ rows = scheduler.drop_lost(...)                    │
                                       │ result = runner.execute(rows)      run, sample     │
    stream(id) ◄── Channel ◄────────── │ outputs = scheduler.update(rows, result)           │
                                       └────────────────────────────────────────────────────┘

Admission is checked here and nowhere else (`_admit`): a request that reaches the scheduler
fits the context, the device KV cache and the waiting queue, and its images fit its prompt.

A model exported with a vision partition takes images with a prompt (`add_request(...,
images=)`): their embeddings replace the prompt's image tokens (wicore.runtime.images,
wicore.runtime.vision), and image requests batch with text-only ones.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import traceback
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path

from wicore.errors import ContextLengthError, OverloadedError, RequestError
from wicore.graph.manifest import Manifest
from wicore.hmt.block_groups import FULL, WINDOW
from wicore.hmt.tiers import HostStore, Tier
from wicore.model.tokenizer_info import TokenizerInfo
from wicore.runtime.channel import Channel
from wicore.runtime.constrained import Grammars
from wicore.runtime.engine_config import EngineConfig
from wicore.runtime.engine_stats import engine_stats
from wicore.runtime.graphs import ModelGraphs
from wicore.runtime.images import ImageInput, ImageSpan
from wicore.runtime.kv_buffers import CacheConfig, KVBuffers
from wicore.runtime.kv_layout import KVLayout, build_kv_cache, choose_block_size, plan_tiers, pool_gb_flag
from wicore.runtime.kv_stream import KVStreamer, num_stages
from wicore.runtime.placement import plan_placement
from wicore.runtime.rate import RateMeter
from wicore.runtime.request import Completion, Priority, Request, RequestOutput
from wicore.runtime.runner import ModelRunner
from wicore.runtime.sampler import SamplingParams
from wicore.runtime.scheduler import Scheduler
from wicore.runtime.speculative_setup import build_speculator
from wicore.runtime.step import RunResult, SchedulerOutput
from wicore.runtime.tokenizer import Tokenizer
from wicore.runtime.vision import NO_VISION, VisionEncoder


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        model_dir = Path(config.model_dir)
        self.manifest = Manifest.read(model_dir)
        if config.verify_files:
            self.manifest.verify(model_dir)
        vision = self.manifest.vision
        if vision is not None:  # a step never cuts an image: the step's limits hold at least one
            config = replace(config, scheduler=config.scheduler.at_least(vision.config.mm_tokens_per_image))
        self.config = config
        bs = choose_block_size(self.manifest, config.block_size)
        layout = KVLayout.of(self.manifest, bs)
        stage_frames = -(-config.kv_stream_tokens // bs) + 1 if config.kv_stream_tokens else 0  # + the sink
        tiers = plan_tiers(config, layout, num_stages(self.manifest) * stage_frames * layout.layer_block_bytes)
        device = tiers[Tier.DEVICE]
        device_bytes = device.full * layout.block_bytes(FULL) + device.window * layout.block_bytes(WINDOW)
        placement = plan_placement(model_dir, self.manifest, config.devices, device_bytes, config.vision_device)
        buffers = KVBuffers(self.manifest, CacheConfig(device.full, bs, device.window or None), placement.devices)
        graphs = ModelGraphs(
            model_dir,
            self.manifest,
            buffers,
            placement.devices,
            config.num_threads,
            config.profile_prefix,
            config.cuda_graphs,
            bs,
        )
        self.config = config = replace(config, cuda_graphs=graphs.cuda_graphs)
        self.layout = layout
        self.kv = build_kv_cache(config, layout, tiers, buffers)
        self.vision = None
        if placement.vision is not None:
            self.vision = VisionEncoder(
                model_dir, placement.vision.record, placement.vision.device, config.num_threads, config.image_cache_size
            )
        streamer = None
        if stage_frames:
            host = self.kv.store(FULL, Tier.HOST)
            assert isinstance(host, HostStore), "the host tier is a HostStore (build_kv_cache)"
            streamer = KVStreamer(self.manifest, buffers, host, stage_frames, config.num_threads)
        self.runner = ModelRunner(graphs, bs, self.vision, streamer)
        sched = replace(config.scheduler, max_staged_blocks=stage_frames - 1 if stage_frames else None)
        model_context = self.manifest.config.max_position_embeddings
        self._max_context = model_context if sched.max_context is None else min(sched.max_context, model_context)
        self.scheduler = Scheduler(replace(sched, eos_token_ids=self.eos_token_ids, max_context=self._max_context), self.kv)
        # Room one sequence can have on the device (one block of each group is the padding sink), or,
        # streamed, on the device and in the host tier, within what a step stages.
        full_blocks = device.full - 1
        if stage_frames:
            full_blocks = min(full_blocks + tiers[Tier.HOST].full, stage_frames - 1)
        self._device_tokens = full_blocks * bs
        self._window_blocks = device.window - 1
        if config.cuda_graphs:  # tables as wide as the longest sequence, and a sliding window plus two blocks
            context = self.max_sequence_tokens
            window = -(-self.manifest.config.sliding_window // bs) + 2 if layout.has_window else 1
            graphs.enable_decode_graphs(bs, sched.max_num_seqs, -(-context // bs), window, context)
        self._tokenizer: Tokenizer | None = None
        self._ids = itertools.count()
        self._lock = threading.Condition()
        self._channels: dict[str, Channel] = {}
        self._thread: threading.Thread | None = None
        self._running = False
        self.generated = RateMeter()  # tokens generated a second over the last 10 s: stats()' tokens_per_second
        self.num_steps = 0
        self.speculator = build_speculator(config, self.manifest) if config.speculative is not None else None
        self.grammars = Grammars(lambda: self.tokenizer, self.manifest.config.vocab_size, self.eos_token_ids)

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> Engine:
        if self._thread is None:
            self._running = True
            self._thread = threading.Thread(target=self._loop, name="wicore-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._running = False
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.speculator is not None:
            self.speculator.close()
        self.kv.close()

    def __enter__(self) -> Engine:
        """`with Engine(...) as e:` guarantees stop(); start() stays explicit, so requests
        can be queued before the first step."""
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the model -------------------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        """The model folder's tokenizer (loaded on first use)."""
        if self._tokenizer is None:
            if self.manifest.tokenizer is None:
                raise RequestError("this model was exported without a tokenizer: send token ids")
            self._tokenizer = Tokenizer(Path(self.config.model_dir), TokenizerInfo.from_dict(self.manifest.tokenizer))
        return self._tokenizer

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every token id that ends a request (unless it sets ignore_eos)."""
        if self.manifest.tokenizer is not None:
            return TokenizerInfo.from_dict(self.manifest.tokenizer).eos_token_ids
        cfg = self.manifest.config
        return cfg.eos_token_ids or (cfg.eos_token_id,)

    @property
    def max_context(self) -> int:
        """Tokens (prompt + generated) one sequence may reach: the model's context, or less if configured."""
        return self._max_context

    @property
    def max_waiting(self) -> int:
        """Requests the queue holds at most: a batch of more can never be admitted whole."""
        return self.scheduler.config.max_waiting

    @property
    def max_sequence_tokens(self) -> int:
        """Most tokens one request may reach: the context, or what the device KV cache holds."""
        return min(self.max_context, self._device_tokens)

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

        Raises RequestError (ContextLengthError for a prompt with no room left) or
        OverloadedError; a request that raises was not queued."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(self.expand_images(prompt) if images else prompt)
        else:
            ids = list(prompt)
        priority = Priority.parse(priority)
        grammar = self.grammars.start(params)  # a constraint that does not compile raises here, before queuing
        with self._lock:
            request_id = request_id or f"req-{next(self._ids)}"
            max_tokens, spans = self._admit(ids, params, request_id, images)
            now = time.monotonic()
            request = Request(
                request_id=request_id,
                prompt_ids=ids,
                params=params,
                max_tokens=max_tokens,
                priority=priority,
                arrival=now,
                deadline=None if deadline is None else now + deadline,
                image_spans=spans,
                grammar=grammar,
            )
            self.scheduler.add(request)
            self._channels[request_id] = Channel()
            self._lock.notify_all()
        return request_id

    def expand_images(self, text: str) -> str:
        """`text` with each `<start_of_image>` expanded into its image's tokens, as HF's Gemma3Processor
        does; encode the result and pass the images with it to `add_request`."""
        if self.vision is None:
            raise RequestError(NO_VISION)
        return self.vision.expand(text, self.tokenizer)

    def _admit(
        self, ids: list[int], params: SamplingParams, request_id: str, images: Sequence[ImageInput]
    ) -> tuple[int, tuple[ImageSpan, ...]]:
        """The admission check, the only one: raises unless the request can run to its end.
        Returns the tokens it may generate (max_tokens capped by the room left) and where its
        images go in the prompt."""
        if not ids:
            raise RequestError("the prompt is empty")
        if images and self.vision is None:
            raise RequestError(NO_VISION)
        spans = () if self.vision is None else self.vision.spans(ids, images)
        vocab = self.manifest.config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise RequestError(f"token ids must be in [0, {vocab})")
        limit = self.max_sequence_tokens
        if len(ids) >= limit:
            raise ContextLengthError(f"the prompt has {len(ids)} tokens; {self._context_limit(len(ids) + 1)}")
        room = limit - len(ids)
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        if self.layout.has_window:
            chunk = self.scheduler.config.prefill_chunk
            need = min(-(-(len(ids) + max_tokens) // self.layout.block_size), self.layout.window_blocks_per_sequence(chunk))
            if need > self._window_blocks:
                raise RequestError(
                    f"the request needs up to {need} blocks in the sliding-window layers' KV cache, which holds "
                    f"{self._window_blocks} (raise --kv-pool-gb or lower --prefill-chunk)"
                )
        if self.scheduler.has_request(request_id):
            raise RequestError(f"request id {request_id!r} is already in use")
        if self.scheduler.num_waiting >= self.scheduler.config.max_waiting:
            raise OverloadedError(f"overloaded: {self.scheduler.num_waiting} requests already waiting; retry later")
        return max_tokens, spans

    def _context_limit(self, tokens: int) -> str:
        """What holds fewer than `tokens` tokens (a prompt and one generated token), and what to change:
        the context (the model's, or --max-context), else the device KV cache (by how much)."""
        model_context = self.manifest.config.max_position_embeddings
        if tokens > self.max_context:
            holds = f"holds {self.max_context} tokens (prompt plus at least one generated token)"
            if self.max_context == model_context:
                return f"the model's context {holds}"
            return f"--max-context {holds}; the model takes up to {model_context}"
        sched = self.scheduler.config
        if sched.max_staged_blocks is not None:
            return (
                f"a step stages {self.max_sequence_tokens} tokens of KV with --kv-stream-tokens "
                f"{self.config.kv_stream_tokens} and the device and host tiers (prompt plus at least one generated "
                "token): raise --kv-stream-tokens or --host-tier-gb"
            )
        need = pool_gb_flag(self.layout.pool_bytes(sched.max_num_seqs, tokens, sched.prefill_chunk))
        return (
            f"the device KV cache holds {self.max_sequence_tokens} tokens (prompt plus at least one generated token); "
            f"--kv-pool-gb {need} holds it with --max-num-seqs {sched.max_num_seqs} (wicore plan --context {tokens} "
            "shows what else fits)"
        )

    def abort(self, request_id: str) -> None:
        """End the request at the next step (reason "abort"); its outputs can still be read."""
        with self._lock:
            self.scheduler.abort(request_id)
            self._lock.notify_all()

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

    # -- loop ------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: not self._running or self.scheduler.has_work)
                if not self._running:
                    return
                decoding = self.scheduler.decoding() if self.speculator is not None else []
            # Only this thread changes the requests' tokens: a draft model proposes without the lock.
            drafts = self.speculator.drafts(decoding) if self.speculator is not None and decoding else {}
            with self._lock:
                out = self.scheduler.schedule(drafts)
                if not out.rows and not out.moves and not out.finished:
                    # Nothing can run until a request ends or a deadline passes.
                    self._lock.wait(timeout=0.01)
                    continue
            try:
                self._step(out)
            except Exception:  # a bug in one step must not kill the engine: fail its requests
                with self._lock:
                    failed = self.scheduler.fail([row.request_id for row in out.rows], traceback.format_exc())
                self._emit(failed)

    def _step(self, out: SchedulerOutput) -> None:
        self._emit(out.finished)
        lost = self.kv.execute(out.moves)
        rows = out.rows
        if lost:
            with self._lock:
                rows = self.scheduler.drop_lost(lost, rows)
        result = self.runner.execute(rows, out.ended_request_ids) if rows else RunResult()
        if self.speculator is not None:
            self.speculator.observe(rows, result)
            self.speculator.forget(out.ended_request_ids)
        self._record_attention(out, result)
        with self._lock:
            outputs = self.scheduler.update(rows, result)
        self._emit(outputs)
        self.num_steps += 1
        self.generated.add(len(result.sampled) + sum(len(v) for v in result.verified.values()))

    def _record_attention(self, out: SchedulerOutput, result: RunResult) -> None:
        for row in out.rows:
            mass = result.attention.get(row.request_id)
            if mass is not None:
                self.kv.record_attention(row.block_ids, mass.tolist())

    def _emit(self, outputs: list[RequestOutput]) -> None:
        with self._lock:
            for output in outputs:
                channel = self._channels.get(output.request_id)
                if channel is None or channel.is_finished:
                    continue
                channel.put(output)
                if output.finished and channel.claimed:
                    del self._channels[output.request_id]

    # -- stats -----------------------------------------------------------------------
    def stats(self) -> dict[str, object]:
        with self._lock:
            return engine_stats(self.scheduler, self.kv, self.layout, self.speculator, self.generated.rate(), self.num_steps)
