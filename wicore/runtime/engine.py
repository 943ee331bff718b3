"""The serving engine: requests in, token streams out, one step loop on its own thread.

    add_request(...) ──► commands ──► ┌──────────── step loop (engine thread) ───────────┐
    abort(id)        ──►              │ out = scheduler.schedule()                        │
                                      │ corrupt = pager.execute(out.moves)                │
                                      │ tokens = executor.run(rows)                       │
    stream(id) ◄── Channel ◄───────── │ outputs = scheduler.update(out, tokens)           │
                                      └───────────────────────────────────────────────────┘
"""

from __future__ import annotations

import itertools
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator

import numpy as np

from wicore.errors import RequestError
from wicore.graph.manifest import Manifest
from wicore.hmt.kv_cache import FULL, WINDOW
from wicore.hmt.policy import A2CRConfig, Tier
from wicore.runtime.channel import Channel
from wicore.runtime.kv_memory import KVLayout, KVMemory, plan_tiers
from wicore.runtime.placement import plan_placement
from wicore.runtime.request import Priority, Request, RequestOutput
from wicore.runtime.sampler import Sample, SamplingParams
from wicore.runtime.scheduler import ScheduledRow, Scheduler, SchedulerConfig
from wicore.runtime.session import CacheConfig, ModelRunner, build_step

GIB = 1 << 30


@dataclass(frozen=True)
class EngineConfig:
    model_dir: Path
    num_threads: int | None = None
    block_size: int = 16
    kv_pool_gb: float = 1.0  # tier 0
    host_tier_gb: float = 1.0  # tier 1
    nvme_tier_gb: float = 0.0  # tier 2
    nvme_dir: Path | None = None
    # Exact block counts per tier, overriding the sizes above (tests, tuning).
    num_device_blocks: int | None = None
    num_host_blocks: int | None = None
    num_nvme_blocks: int | None = None
    num_window_device_blocks: int | None = None  # the sliding layers' device pool, if set apart
    policy: str = "a2cr"  # or "lru"
    a2cr: A2CRConfig = A2CRConfig()
    enable_prefix_cache: bool = True
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    verify_files: bool = True
    devices: str = "cpu"  # see wicore.runtime.placement

    def __post_init__(self) -> None:
        if self.policy not in ("a2cr", "lru"):
            raise ValueError(f"policy {self.policy!r}: choose a2cr or lru")
        if min(self.kv_pool_gb, self.host_tier_gb, self.nvme_tier_gb) < 0:
            raise ValueError("tier sizes must be >= 0")


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        model_dir = Path(config.model_dir)
        self.manifest = Manifest.read(model_dir)
        if config.verify_files:
            self.manifest.verify(model_dir)
        layout = KVLayout.of(self.manifest, config.block_size)
        tiers = plan_tiers(config, layout)
        device = tiers[Tier.DEVICE]
        device_bytes = device.full * layout.block_bytes(FULL) + device.window * layout.block_bytes(WINDOW)
        plan = plan_placement(model_dir, self.manifest, config.devices, device_bytes)
        cache = CacheConfig(device.full, config.block_size, device.window or None)
        self.runner = ModelRunner(model_dir, self.manifest, cache, config.num_threads, plan.devices)
        self.kv = KVMemory(config, layout, tiers, self.runner)
        self.pool = self.kv.cache
        self.policy = self.pool.full.pool.policy  # the group attention statistics describe
        cfg = self.manifest.config
        eos = self._eos_token_ids()
        sched_cfg = config.scheduler
        sched_cfg = SchedulerConfig(**{**sched_cfg.__dict__, "eos_token_ids": eos, "max_context": min(sched_cfg.max_context, cfg.max_position_embeddings)})
        self.scheduler = Scheduler(sched_cfg, self.pool)
        self._tokenizer = None
        self._ids = itertools.count()
        self._lock = threading.Condition()
        self._commands: list[tuple[str, object]] = []
        self._channels: dict[str, Channel] = {}
        self._thread: threading.Thread | None = None
        self._running = False
        self._step_times: list[tuple[float, int]] = []  # (time, generated tokens) of recent steps
        self.num_steps = 0

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
        self.kv.close()

    def __enter__(self) -> Engine:
        """`with Engine(...) as e:` guarantees stop(); start() stays explicit, so requests
        can be queued before the first step."""
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from wicore.export.tokenizer import TokenizerInfo
            from wicore.runtime.tokenizer import Tokenizer

            if self.manifest.tokenizer is None:
                raise RequestError("this model was exported without a tokenizer: send token ids")
            self._tokenizer = Tokenizer(Path(self.config.model_dir), TokenizerInfo.from_dict(self.manifest.tokenizer))
        return self._tokenizer

    def _eos_token_ids(self) -> tuple[int, ...]:
        from wicore.export.tokenizer import TokenizerInfo

        if self.manifest.tokenizer is not None:
            return TokenizerInfo.from_dict(self.manifest.tokenizer).eos_token_ids
        return (self.manifest.config.eos_token_id,)

    # -- requests --------------------------------------------------------------------
    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        priority: Priority | str = Priority.NORMAL,
        deadline: float | None = None,
        request_id: str | None = None,
    ) -> str:
        """Queue a request; `deadline` is in seconds from now. Returns its id."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise RequestError("the prompt is empty")
        vocab = self.manifest.config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise RequestError(f"token ids must be in [0, {vocab})")
        self.scheduler.check_context(len(ids))  # before the pool's limits: the more basic one
        capacity = (self.runner.cache.num_blocks - 1) * self.config.block_size
        if len(ids) + params.max_tokens > capacity:  # a request that can never fit would preempt forever
            raise RequestError(
                f"the request needs up to {len(ids) + params.max_tokens} tokens of KV cache; the device pool holds "
                f"{capacity} (raise --kv-pool-gb or lower max_tokens)"
            )
        layout, bs = self.kv.layout, self.config.block_size
        if layout.has_window:
            need = min(-(-(len(ids) + params.max_tokens) // bs), layout.window_blocks_per_sequence(self.scheduler.config.prefill_chunk))
            if need > self.runner.cache.window_blocks - 1:
                raise RequestError(
                    f"the request needs up to {need} blocks in the sliding-window layers' pool, which holds "
                    f"{self.runner.cache.window_blocks - 1} (raise --kv-pool-gb or lower max_tokens)"
                )
        now = time.monotonic()
        request_id = request_id or f"req-{next(self._ids)}"
        req = Request(
            request_id=request_id,
            prompt_ids=ids,
            params=params,
            priority=Priority.parse(priority),
            arrival=now,
            deadline=None if deadline is None else now + deadline,
        )
        with self._lock:
            self.scheduler.add(req)  # raises OverloadedError / RequestError synchronously
            self._channels[request_id] = Channel()
            self._lock.notify_all()
        return request_id

    def abort(self, request_id: str) -> None:
        with self._lock:
            self.scheduler.abort(request_id)
            self._lock.notify_all()

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

    @property
    def max_context(self) -> int:
        """Context length the scheduler enforces (the model's, or less if configured)."""
        return self.scheduler.config.max_context

    @property
    def max_sequence_tokens(self) -> int:
        """Most tokens (prompt + generated) one request may reach: the context, or the device pool."""
        return min(self.max_context, (self.runner.cache.num_blocks - 1) * self.config.block_size)

    def generate(self, prompts: list[str | list[int]], params: SamplingParams) -> list[list[int]]:
        """Blocking helper: run prompts concurrently to completion, return their output ids."""
        ids = [self.add_request(p, params) for p in prompts]
        return [[t for out in self.outputs(i) for t in out.new_token_ids] for i in ids]

    # -- loop ------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: not self._running or self.scheduler.has_work)
                if not self._running:
                    return
                out = self.scheduler.schedule()
                if not out.rows and not out.moves and not out.finished:
                    # Nothing can run until a request ends or a deadline passes.
                    self._lock.wait(timeout=0.01)
                    continue
            try:
                self._step(out)
            except Exception:  # a bug in one step must not kill the engine: fail its requests
                detail = traceback.format_exc()
                with self._lock:
                    for row in out.rows:
                        self.scheduler.abort(row.request_id)
                    self._lock.notify_all()
                for row in out.rows:
                    self._emit(RequestOutput(row.request_id, [], True, "error", error=detail))

    def _step(self, out) -> None:
        for ended in out.finished:
            self._emit(ended)
        rows = out.rows
        corrupt = self.kv.execute(out.moves)
        if corrupt:
            with self._lock:
                for group, block_id in corrupt:
                    self.pool.invalidate(group, block_id)
                lost = self.scheduler.holders(corrupt)
                self.scheduler.recompute(lost)
            rows = [r for r in rows if r.request_id not in lost]
        sampled = self._run(rows) if rows else {}
        with self._lock:
            results = self.scheduler.update(rows, sampled)
        for result in results:
            self._emit(result)
        self.num_steps += 1
        self._step_times.append((time.monotonic(), len(sampled)))
        del self._step_times[:-64]

    def _run(self, rows: list[ScheduledRow]) -> dict[str, Sample]:
        """Rows of the same length run together, so nothing is padded: the decode rows (one
        token each) as one batch, prefill chunks of equal length (prompts of one size, or
        chunks cut at --prefill-chunk) as another, and any other chunk alone.

        A row whose sampling fails ends its own request with "error" (it gets no sample);
        the other rows of the batch go on."""
        by_length: dict[int, list[ScheduledRow]] = {}
        for row in rows:
            by_length.setdefault(len(row.token_ids), []).append(row)
        sampled: dict[str, Sample] = {}
        for group in by_length.values():
            result = self.runner.run(build_step(group, self.config.block_size))
            wanted = [r for r in group if r.needs_logits]
            for row, row_logits in zip(wanted, result.logits):
                try:
                    sampled[row.request_id] = row.sampler.sample(row_logits)
                except Exception:  # this request's sampling failed: fail it alone
                    detail = traceback.format_exc()
                    with self._lock:
                        self.scheduler.abort(row.request_id)
                    self._emit(RequestOutput(row.request_id, [], True, "error", error=detail))
            if result.attention_mass is not None:
                self._record_attention(group, result.attention_mass)
        return sampled

    def _record_attention(self, rows: list[ScheduledRow], mass: np.ndarray) -> None:
        """Feed each block's attention mass of this step to the cache policy (A2CR's signal)."""
        now = time.monotonic()
        for row, row_mass in zip(rows, mass):
            for block_id, value in zip(row.block_ids, row_mass.tolist()):
                self.policy.add_attention(block_id, value, now)

    def _emit(self, output: RequestOutput) -> None:
        with self._lock:
            channel = self._channels.get(output.request_id)
            if channel is None or channel.is_finished:
                return
            channel.put(output)
            if output.finished and channel.claimed:
                del self._channels[output.request_id]

    # -- stats -----------------------------------------------------------------------
    def stats(self) -> dict[str, object]:
        with self._lock:
            s = self.scheduler
            recent = self._step_times
            span = recent[-1][0] - recent[0][0] if len(recent) > 1 else 0.0
            return {
                "running": len(s.running),
                "waiting": len(s.waiting),
                "swapped": len(s.swapped),
                "blocks_in_use": {t.name.lower(): self.pool.usage(t) for t in Tier},  # referenced or cached
                "blocks_referenced": {t.name.lower(): self.pool.usage(t) - self.pool.num_evictable(t) for t in Tier},
                "blocks_free": {t.name.lower(): self.pool.num_free(t) for t in Tier},
                "kv_groups": {  # the sums above, per block group (full-attention / sliding layers)
                    name: {
                        "layers": len(layers),
                        "window": group.window,
                        "blocks_in_use": {t.name.lower(): group.pool.usage(t) for t in Tier},
                        "blocks_referenced": {t.name.lower(): group.pool.usage(t) - group.pool.num_evictable(t) for t in Tier},
                        "blocks_free": {t.name.lower(): group.pool.num_free(t) for t in Tier},
                        "block_bytes": self.kv.layout.block_bytes(index),
                    }
                    for index, (name, layers, group) in enumerate(zip(
                        ("full", "window"), (self.kv.layout.full_layers, self.kv.layout.window_layers), self.pool.groups
                    ))
                },
                "prefix_hit_rate": s.stats.prefix_hit_rate,
                "prompt_tokens": s.stats.num_prompt_tokens,
                "cached_prompt_tokens": s.stats.num_cached_tokens,
                "computed_prompt_tokens": s.stats.num_computed_prompt_tokens,
                "generated_tokens": s.stats.num_generated_tokens,
                "preempted_swap": s.stats.num_preempted_swap,
                "preempted_recompute": s.stats.num_preempted_recompute,
                "corrupt_blocks": self.kv.num_corrupt,
                "tokens_per_second": sum(n for _, n in recent[1:]) / span if span else 0.0,
                "steps": self.num_steps,
            }
