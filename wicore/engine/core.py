"""The engine core: the model's graphs, the KV cache and the scheduler, stepped by one thread.

No lock: whoever owns the core (the `Engine`'s thread, a tool, a test) is the only caller.

    core.add(core.make_request(ids, params, request_id))    check() raises for a request that cannot fit
    core.abort(request_id)
    outputs = core.step()       one step:
        drafts  = speculator.drafts(decoding requests)          (if speculating)
        out     = scheduler.schedule(drafts)                    rows to run, KV moves, ended requests
        lost    = kv.execute(out.moves)                         move blocks between tiers
        rows    = scheduler.drop_lost(lost, out.rows)           sequences whose KV was lost recompute
        result  = runner.execute(rows)                          run the graphs, sample
        outputs = scheduler.update(rows, result)                new tokens, stops
    core.stats()

Steps that overlap the device (async scheduling, pipeline groups) are the mixin in
wicore.engine.core_steps.

`check()` reads only what never changes after construction (the context, the KV layout, the
vision encoder), so the `Engine` calls it on the caller's thread and answers a request that can
never fit at once; the queue's own limits (a full queue, a duplicate id) are the `Engine`'s.
"""

from __future__ import annotations

import functools
import time
import traceback
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from wicore.blocks.block_groups import FULL, WINDOW
from wicore.blocks.tier import Tier
from wicore.devices.placement import plan_placement
from wicore.engine.admission import Admission, Limits
from wicore.engine.config import EngineConfig, async_by_default
from wicore.engine.core_steps import OverlappedSteps
from wicore.engine.groups import StepGroups
from wicore.engine.kv_setup import build_kv_cache, plan_tiers
from wicore.engine.lookahead import InFlight, StepWorker
from wicore.engine.rate import RateMeter
from wicore.engine.request import Request
from wicore.engine.scheduler import Scheduler
from wicore.engine.speculative_setup import build_speculator
from wicore.engine.stats import EngineStats, engine_stats
from wicore.engine.steady import SteadyStep, steady_after
from wicore.engine.trace import PhaseSeconds, StepTrace
from wicore.errors import RequestError
from wicore.executor.constrained import Grammars
from wicore.executor.graphs import ModelGraphs
from wicore.executor.prepared import PreparedStep
from wicore.executor.runner import ModelRunner
from wicore.executor.vision import VisionEncoder
from wicore.graph.manifest import Manifest
from wicore.inputs.tokenizer import Tokenizer
from wicore.kv.buffers import CacheConfig, KVBuffers
from wicore.kv.layout import KVLayout, choose_block_size
from wicore.kv.offload import KVOffloader, num_stages
from wicore.kv.tiers import HostStore
from wicore.model.tokenizer_info import TokenizerInfo
from wicore.types.images import ImageInput
from wicore.types.outputs import Priority, RequestOutput
from wicore.types.sampling import SamplingParams
from wicore.types.step import RunResult, SchedulerOutput


class EngineCore(OverlappedSteps):
    def __init__(self, config: EngineConfig) -> None:
        model_dir = Path(config.model_dir)
        self.manifest = Manifest.read(model_dir)
        if config.verify_files:
            self.manifest.verify(model_dir)
        vision = self.manifest.vision
        if vision is not None:  # a step never cuts an image: the step's limits hold at least one
            config = replace(config, scheduler=config.scheduler.at_least(vision.config.mm_tokens_per_image))
        switch = self.manifest.config.long_rope_switch
        if switch:  # transformers recomputes a sequence's keys with the long factors past the switch
            config = replace(config, scheduler=config.scheduler.with_long_rope(switch))
        bs = choose_block_size(self.manifest, config.block_size)
        layout = KVLayout.of(self.manifest, bs)
        stage_frames = -(-config.kv_offload_tokens // bs) + 1 if config.kv_offload_tokens else 0  # + the sink
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
            config.micro_batch_tokens,
            config.pipeline_groups if config.pipeline_groups is not None or config.async_scheduling or placement.vision else 1,
        )
        first = graphs.devices[0]
        one_card = graphs.cuda_graphs and first.capability.name == "cuda" and all(d == first for d in graphs.devices)
        self.config = config = replace(
            config,
            cuda_graphs=graphs.cuda_graphs,
            pipeline_groups=graphs.pipeline_groups,
            async_scheduling=async_by_default(config, one_card),
        )
        self.layout = layout
        self.devices = tuple(graphs.devices)
        self.kv = build_kv_cache(config, layout, tiers, buffers)
        self.vision: VisionEncoder | None = None
        if placement.vision is not None:
            self.vision = VisionEncoder(
                model_dir, placement.vision.record, placement.vision.device, config.num_threads, config.image_cache_size
            )
        offloader = None
        if stage_frames:
            host = self.kv.store(FULL, Tier.HOST)
            assert isinstance(host, HostStore), "the host tier is a HostStore (build_kv_cache)"
            offloader = KVOffloader(self.manifest, buffers, host, stage_frames, config.num_threads)
        self.runner = ModelRunner(graphs, bs, self.vision, offloader)
        sched = replace(config.scheduler, max_staged_blocks=stage_frames - 1 if stage_frames else None)
        model_context = self.manifest.config.max_position_embeddings
        self.max_context = model_context if sched.max_context is None else min(sched.max_context, model_context)
        self.scheduler = Scheduler(replace(sched, eos_token_ids=self.eos_token_ids, max_context=self.max_context), self.kv)
        # Room one sequence can have on the device (one block of each group is the padding sink), or,
        # offloaded, on the device and in the host tier, within what a step stages.
        full_blocks = device.full - 1
        if stage_frames:
            full_blocks = min(full_blocks + tiers[Tier.HOST].full, stage_frames - 1)
        self.max_sequence_tokens = min(self.max_context, full_blocks * bs)
        self.limits = Limits(
            vocab_size=self.manifest.config.vocab_size,
            model_context=model_context,
            max_context=self.max_context,
            max_sequence_tokens=self.max_sequence_tokens,
            layout=layout,
            window_blocks=device.window - 1,
            scheduler=self.scheduler.config,
            kv_offload_tokens=config.kv_offload_tokens,
            vision=None if self.vision is None else self.vision.placement,
        )
        if config.cuda_graphs:  # tables as wide as the longest sequence, and a sliding window plus two blocks
            context = self.max_sequence_tokens
            window = -(-self.manifest.config.sliding_window // bs) + 2 if layout.has_window else 1
            graphs.enable_decode_graphs(bs, sched.max_num_seqs, -(-context // bs), window, context)
        self.generated = RateMeter()  # tokens generated a second over the last 10 s: stats()' tokens_per_second
        self.num_steps = 0  # steps that ran rows
        self.speculator = build_speculator(config, self.manifest) if config.speculative is not None else None
        info = self.manifest.tokenizer
        # Loaded now, not on the first request: a missing or broken tokenizer fails the start.
        self.tokenizer = None if info is None else Tokenizer(model_dir, TokenizerInfo.from_dict(info))
        # The tokenizer itself, not self.need_tokenizer: a bound method would make core -> grammars
        # -> core a cycle, and the sessions and KV buffers (GiBs) would wait for the cyclic GC.
        self.grammars = Grammars(
            functools.partial(_required_tokenizer, self.tokenizer), self.manifest.config.vocab_size, self.eos_token_ids
        )
        self.last_step = StepTrace()
        self.seconds = PhaseSeconds()  # summed over every step
        self._worker = StepWorker(self.runner, self.kv) if config.async_scheduling else None
        self._inflight: InFlight | None = None  # the step the worker runs (async scheduling)
        self._groups = StepGroups(self.runner, graphs.pipeline_groups) if graphs.pipeline_groups > 1 else None
        self._repeats = config.steady_decode and self.speculator is None  # speculation drafts every step
        self._steady: SteadyStep | None = None  # the last step, where the next may repeat it (wicore.engine.steady)

    def need_tokenizer(self) -> Tokenizer:
        """The tokenizer, or the RequestError a model exported without one answers."""
        return _required_tokenizer(self.tokenizer)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every token id that ends a request (unless it sets ignore_eos)."""
        if self.manifest.tokenizer is not None:
            return TokenizerInfo.from_dict(self.manifest.tokenizer).eos_token_ids
        cfg = self.manifest.config
        return cfg.eos_token_ids or (cfg.eos_token_id,)

    # -- admission -------------------------------------------------------------------
    def check(self, ids: list[int], params: SamplingParams, images: Sequence[ImageInput] = ()) -> Admission:
        """Raises RequestError (ContextLengthError for a prompt with no room left) unless the
        request can run to its end. Reads only what construction fixed: safe on any thread."""
        return self.limits.check(ids, params, images)

    def make_request(
        self,
        ids: list[int],
        params: SamplingParams,
        request_id: str,
        priority: Priority = Priority.NORMAL,
        deadline: float | None = None,
        images: Sequence[ImageInput] = (),
    ) -> Request:
        """`check`, then the request to `add` (`deadline` in seconds from now), its output constraint
        compiled (StructuredOutputError when it does not). Safe on any thread."""
        admission = self.check(ids, params, images)
        grammar = self.grammars.start(params)
        now = time.monotonic()
        return Request(
            request_id=request_id,
            prompt_ids=ids,
            params=params,
            max_tokens=admission.max_tokens,
            priority=priority,
            arrival=now,
            deadline=None if deadline is None else now + deadline,
            image_spans=admission.image_spans,
            grammar=grammar,
        )

    # -- requests --------------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Queue a request that `check` admitted."""
        self.scheduler.add(request)

    def abort(self, request_id: str) -> None:
        """End the request at the next step (reason "abort"); unknown ids are ignored."""
        self.scheduler.abort(request_id)

    def has_request(self, request_id: str) -> bool:
        return self.scheduler.has_request(request_id)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or self._inflight is not None or bool(self._groups and self._groups.inflight)

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    # -- the step --------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, move KV blocks, run the graphs and sample, account: the outputs of every
        request that produced tokens or ended. A step that raises fails its rows' requests (a
        bug in one step must not end the others); `num_steps` counts the steps that ran rows.
        Under async scheduling a call launches a step and returns the outputs of the one before."""
        if self._worker is not None:
            return self._step_async(self._worker)
        if self._groups is not None:
            return self._step_groups(self._groups)
        start = time.perf_counter()
        steady, self._steady = self._steady, None
        repeated = self.scheduler.repeat_decodes(steady.rows, steady.running) if steady is not None else None
        if repeated is not None:  # the last step's rows, one token further (wicore.engine.steady)
            assert steady is not None
            try:
                return self._run(repeated, start, steady.step)
            except Exception:
                return self.scheduler.fail([row.request_id for row in repeated.rows], traceback.format_exc())
        decoding = self.scheduler.decoding() if self.speculator is not None else []
        drafts = self.speculator.drafts(decoding) if self.speculator is not None and decoding else {}
        out = self.scheduler.schedule(drafts)
        if not out.rows and not out.moves:
            self._trace(StepTrace(seconds=PhaseSeconds(schedule_s=time.perf_counter() - start)))
            return out.finished
        try:
            return out.finished + self._run(out, start)
        except Exception:
            return out.finished + self.scheduler.fail([row.request_id for row in out.rows], traceback.format_exc())

    def _run(self, out: SchedulerOutput, start: float, last: PreparedStep | None = None) -> list[RequestOutput]:
        """Run the scheduled step; `last`: the step before, whose rows `out.rows` repeat one token on."""
        scheduled = time.perf_counter()
        lost = self.kv.execute(out.moves) if out.moves else set()
        rows = self.scheduler.drop_lost(lost, out.rows) if lost else out.rows
        moved = time.perf_counter()
        step = None
        repeats = last is not None and not lost  # a lost block's rows changed: their batch built in full
        if repeats:
            assert last is not None
            step = self.runner.repeat(last, rows)
        elif rows:
            step = self.runner.prepare(rows, out.ended_request_ids)
        result = self.runner.execute_prepared(step) if step is not None else RunResult()
        ran = time.perf_counter()
        if self.speculator is not None:
            self.speculator.observe(rows, result)
            self.speculator.forget(out.ended_request_ids)
        outputs = self._account(rows, result)
        if step is not None and self._repeats and (repeats or self.runner.can_repeat(step)):
            self._steady = steady_after(self.scheduler, step, result, repeats)
        seconds = PhaseSeconds(
            scheduled - start, moved - scheduled, ran - moved, time.perf_counter() - ran, result.graphs_seconds
        )
        self._trace(StepTrace(tuple(rows), len(out.moves), len(lost), seconds, repeats))
        if rows:
            self.num_steps += 1
        return outputs

    def run_to_end(self) -> list[RequestOutput]:
        """Step until no request is left: every output, in order (tools and tests)."""
        outputs: list[RequestOutput] = []
        while self.has_work:
            outputs += self.step()
        return outputs

    # -- stats and shutdown ----------------------------------------------------------
    def stats(self) -> EngineStats:
        return engine_stats(self.scheduler, self.kv, self.layout, self.speculator, self.generated.rate(), self.num_steps)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
        if self._groups is not None:
            self._groups.close()
        if self.speculator is not None:
            self.speculator.close()
        self.runner.graphs.close()
        self.kv.close()


def _required_tokenizer(tokenizer: Tokenizer | None) -> Tokenizer:
    if tokenizer is None:
        raise RequestError("this model was exported without a tokenizer: send token ids")
    return tokenizer
