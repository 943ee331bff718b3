"""Batch generation over the paged decoder graphs: chunked prefill, then batched decode.

This is the offline path behind `wicore generate` (and the base the serving
engine builds on): a fixed batch of prompts is prefilled in chunks, every row
that still has prompt left taking up to `prefill_chunk` tokens per step, then
all unfinished rows decode one token per step together.

Token regions of a row in the cache (block_size 4, prompt of 6, 2 generated):

    position   0 1 2 3 | 4 5 6 7 | 8
    block      b7      | b2      | b9        block_table = [b7, b2, b9]
    content    prompt......| gen |
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from wicore.errors import ManifestError, OutOfBlocksError, RequestError
from wicore.export.tokenizer import TokenizerInfo
from wicore.graph import io
from wicore.graph.manifest import Manifest
from wicore.runtime.placement import plan_placement
from wicore.runtime.providers import Device
from wicore.runtime.sampler import Sampler, SamplingParams
from wicore.runtime.session import CacheConfig, ModelRunner, StepBatch, build_step
from wicore.runtime.tokenizer import Tokenizer


@dataclass
class Sequence:
    """One row: its tokens so far, how many are in the cache, and the blocks holding them."""

    token_ids: list[int]
    num_prompt_tokens: int
    sampler: Sampler
    block_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    finish_reason: str | None = None

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]


@dataclass(frozen=True)
class _Row:
    """A step row (wicore.runtime.session.StepRow). The offline generator gives the sliding
    layers' pools the same blocks as the full layers' (same size, nothing released)."""

    token_ids: list[int]
    start: int
    block_table: list[int]
    needs_logits: bool

    @property
    def window_table(self) -> list[int]:
        return self.block_table

    @property
    def window_first(self) -> int:
        return 0


def sequence_row(seq: Sequence, n: int) -> _Row:
    """The step row that runs the next `n` uncomputed tokens of `seq`."""
    start = seq.num_computed
    return _Row(seq.token_ids[start : start + n], start, seq.block_ids, start + n == len(seq.token_ids))


@dataclass(frozen=True)
class GenerateOutput:
    token_ids: list[list[int]]  # generated tokens of each prompt
    finish_reasons: list[str]  # "stop" (EOS / stop token) or "length"
    num_prompt_tokens: int
    prefill_seconds: float
    decode_seconds: float
    num_decode_steps: int  # steps after the first token


class BlockAllocator:
    """A free list of block ids; block 0 is the padding sink and never handed out."""

    def __init__(self, num_blocks: int) -> None:
        self.free = list(range(num_blocks - 1, io.SINK_BLOCK, -1))

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free):
            raise OutOfBlocksError(f"the KV pool has {len(self.free)} free blocks, {n} are needed")
        return [self.free.pop() for _ in range(n)]

    def release(self, block_ids: list[int]) -> None:
        self.free.extend(reversed(block_ids))


class Generator:
    def __init__(
        self, model_dir: Path, manifest: Manifest, num_threads: int | None, block_size: int, prefill_chunk: int,
        devices: list[Device],
    ) -> None:
        self.model_dir = Path(model_dir)
        self.devices = devices
        self.manifest = manifest
        self.num_threads = num_threads
        self.block_size = block_size
        self.prefill_chunk = prefill_chunk
        self.max_context = manifest.config.max_position_embeddings
        self._runner: ModelRunner | None = None
        self._tokenizer: Tokenizer | None = None

    @classmethod
    def load(
        cls,
        model_dir: str | Path,
        num_threads: int | None = None,
        block_size: int = 16,
        prefill_chunk: int = 512,
        verify: bool = True,
        devices: str = "cpu",
    ) -> Generator:
        """Open an exported model folder (checking its files against wicore.json unless verify=False);
        `devices` places the partitions (see wicore.runtime.placement)."""
        model_dir = Path(model_dir)
        manifest = Manifest.read(model_dir)
        if verify:
            manifest.verify(model_dir)
        plan = plan_placement(model_dir, manifest, devices)
        return cls(model_dir, manifest, num_threads or os.cpu_count(), block_size, prefill_chunk, plan.devices)

    @property
    def tokenizer(self) -> Tokenizer:
        """The model folder's tokenizer (loaded on first use)."""
        if self._tokenizer is None:
            if self.manifest.tokenizer is None:
                raise ManifestError(f"{self.model_dir} was exported without a tokenizer; pass token ids instead of text")
            self._tokenizer = Tokenizer(self.model_dir, TokenizerInfo.from_dict(self.manifest.tokenizer))
        return self._tokenizer

    def runner(self, num_blocks: int) -> ModelRunner:
        """The sessions, with pools of at least `num_blocks` (grown, never shrunk)."""
        if self._runner is None or self._runner.cache.num_blocks < num_blocks:
            cache = CacheConfig(num_blocks=num_blocks, block_size=self.block_size)
            if self._runner is None:
                self._runner = ModelRunner(self.model_dir, self.manifest, cache, self.num_threads, self.devices)
            else:
                self._runner.resize(cache)
        return self._runner

    # -- public API ------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> GenerateOutput:
        """Generate for a batch of tokenized prompts; each row's output does not depend on the others."""
        if not prompts:
            return GenerateOutput([], [], 0, 0.0, 0.0, 0)
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        seqs = [self._new_sequence(p, sp) for p, sp in zip(prompts, params_list)]
        runner = self.runner(1 + sum(self._blocks_for(len(s.token_ids) + sp.max_tokens) for s, sp in zip(seqs, params_list)))
        allocator = BlockAllocator(runner.cache.num_blocks)
        started = time.perf_counter()
        while any(s.num_computed < s.num_prompt_tokens for s in seqs):
            self._prefill_step(runner, allocator, seqs)
        prefill_seconds = time.perf_counter() - started
        steps = 0
        started = time.perf_counter()
        while active := [s for s in seqs if s.finish_reason is None]:
            self._decode_step(runner, allocator, active)
            steps += 1
        for s in seqs:
            allocator.release(s.block_ids)
        return GenerateOutput(
            token_ids=[s.output_ids for s in seqs],
            finish_reasons=[s.finish_reason or "length" for s in seqs],
            num_prompt_tokens=sum(s.num_prompt_tokens for s in seqs),
            prefill_seconds=prefill_seconds,
            decode_seconds=time.perf_counter() - started,
            num_decode_steps=steps,
        )

    def prompt_logits(self, token_ids: list[int]) -> np.ndarray:
        """Logits at every position of one prompt [len, vocab] (for verification and logprobs)."""
        seq = self._new_sequence(token_ids, SamplingParams(max_tokens=1))
        runner = self.runner(1 + self._blocks_for(len(token_ids)))
        allocator = BlockAllocator(runner.cache.num_blocks)
        chunks = []
        while seq.num_computed < seq.num_prompt_tokens:
            n = min(self.prefill_chunk, seq.num_prompt_tokens - seq.num_computed)
            step = self._build_step(allocator, [(seq, n)], all_logits=True)
            chunks.append(runner.run(step).logits)
            seq.num_computed += n
        allocator.release(seq.block_ids)
        return np.concatenate(chunks)

    # -- steps -----------------------------------------------------------------------
    def _new_sequence(self, prompt: list[int], params: SamplingParams) -> Sequence:
        if not prompt:
            raise RequestError("the prompt is empty")
        if len(prompt) >= self.max_context:
            raise RequestError(
                f"the prompt has {len(prompt)} tokens; the model's context is {self.max_context} "
                "(and at least one token must be left to generate)"
            )
        vocab = self.manifest.config.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise RequestError(f"token ids must be in [0, {vocab})")
        return Sequence(list(prompt), len(prompt), Sampler(params))

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-min(num_tokens, self.max_context) // self.block_size)

    def _prefill_step(self, runner: ModelRunner, allocator: BlockAllocator, seqs: list[Sequence]) -> None:
        rows = [(s, min(self.prefill_chunk, s.num_prompt_tokens - s.num_computed)) for s in seqs if s.num_computed < s.num_prompt_tokens]
        step = self._build_step(allocator, rows, all_logits=False)
        logits = runner.run(step).logits
        finishing = [s for s, n in rows if s.num_computed + n == s.num_prompt_tokens]
        for s, n in rows:
            s.num_computed += n
        for s, row in zip(finishing, logits):
            self._append(s, row)

    def _decode_step(self, runner: ModelRunner, allocator: BlockAllocator, seqs: list[Sequence]) -> None:
        step = self._build_step(allocator, [(s, 1) for s in seqs], all_logits=False)
        logits = runner.run(step).logits
        for s, row in zip(seqs, logits):
            s.num_computed += 1
            self._append(s, row)

    def _append(self, seq: Sequence, logits: np.ndarray) -> None:
        token = seq.sampler(logits)
        seq.token_ids.append(token)
        p = seq.sampler.params
        stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.eos_token_ids))
        if token in stops:
            seq.finish_reason = "stop"
        elif len(seq.output_ids) >= p.max_tokens or len(seq.token_ids) >= self.max_context:
            seq.finish_reason = "length"

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.manifest.tokenizer is not None:
            return TokenizerInfo.from_dict(self.manifest.tokenizer).eos_token_ids
        return (self.manifest.config.eos_token_id,)

    def _build_step(self, allocator: BlockAllocator, rows: list[tuple[Sequence, int]], all_logits: bool) -> StepBatch:
        for s, n in rows:
            need = self._blocks_for(s.num_computed + n) - len(s.block_ids)
            if need > 0:
                s.block_ids.extend(allocator.allocate(need))
        return build_step([sequence_row(s, n) for s, n in rows], self.block_size, all_logits)
