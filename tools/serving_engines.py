"""Who serves bench_serving's requests: one class per way, each with `serve(prompts, num_new_tokens) -> Served`.

    WiCoreServer            the Engine (continuous batching, paged KV, prefix cache on unless
                            --no-prefix-cache), a fresh engine per level, warmed up first
    LlamaContexts(1)        llama.cpp sequential: one Llama context, one request after another (FCFS)
    LlamaContexts(N)        llama.cpp contexts xN: N Llama contexts in N Python threads, threads split
                            among them, each taking the next waiting request (FCFS)
    LlamaBatched            one context holding C sequences, batched as llama-server does: each step
                            decodes one token of every generating sequence and fills the rest of
                            n_batch (512, WiCore's token budget) with prompt tokens

Every server stamps each token with the time the client receives it, in seconds from the level's start.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchlib import (
    CpuWatch,
    EngineUnavailable,
    argmax_logits,
    import_llama_cpp,
    quiet_stderr,
    stream_tokens,
    warm_engine,
)

LLAMA_MODES = ("sequential", "contexts", "batched")
LLAMA_BATCH = 512
WARMUP_TEXT = "Warm-up: the quick brown fox jumps over the lazy dog."


@dataclass(frozen=True)
class Trace:
    """One request as the client saw it: seconds from the level's start, and the tokens received."""

    arrival: float
    token_times: tuple[float, ...]
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Served:
    """What one engine did with one level's requests."""

    traces: tuple[Trace, ...]
    num_other_busy_cores: float | None  # other processes' average load during the timed part
    prefix_hit_rate: float | None = None  # WiCore only


class WiCoreServer:
    """A fresh Engine per level (an empty prefix cache, a KV pool that fits every request)."""

    def __init__(
        self, model_dir: Path, tokenizer, threads: int, is_prefix_cache: bool, budget: dict[str, int] | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.model_dir = model_dir
        self.threads = threads
        self.is_prefix_cache = is_prefix_cache
        self.budget = budget or {}  # SchedulerConfig fields (token budgets) other than their defaults

    def close(self) -> None:
        """Nothing to release: each level's engine is stopped when it is done."""

    def serve(self, prompts: list[list[int]], num_new_tokens: int) -> Served:
        from wicore.engine.engine import EngineConfig
        from wicore.engine.scheduler import SchedulerConfig
        from wicore.types.sampling import SamplingParams

        block_size = 16
        num_blocks = len(prompts) * -(-(len(prompts[0]) + num_new_tokens) // block_size) + 2  # + the sink + 1
        config = EngineConfig(
            model_dir=self.model_dir,
            num_threads=self.threads,
            block_size=block_size,
            num_device_blocks=num_blocks,
            num_host_blocks=0,
            enable_prefix_cache=self.is_prefix_cache,
            scheduler=SchedulerConfig(
                max_num_seqs=max(len(prompts), 1),
                **self.budget,
            ),
            verify_files=False,  # verified once, when the tokenizer was loaded
        )
        params = SamplingParams(max_tokens=num_new_tokens, ignore_eos=True)
        with warm_engine(config, self.tokenizer.encode(WARMUP_TEXT)) as engine:
            warm = engine.stats()
            with CpuWatch() as watch:
                traces = asyncio.run(self._serve(engine, prompts, params))
            stats = engine.stats()
        hits = stats.cached_prompt_tokens - warm.cached_prompt_tokens
        return Served(traces, watch.num_other_busy_cores, hits / sum(len(p) for p in prompts))

    @staticmethod
    async def _serve(engine, prompts: list[list[int]], params) -> tuple[Trace, ...]:
        start = time.perf_counter()

        async def consume(request_id: str, arrival: float) -> Trace:
            times, ids, _ = await stream_tokens(engine, request_id, start, request_id)
            return Trace(arrival, tuple(times), tuple(ids))

        consumers = []
        for prompt in prompts:
            arrival = time.perf_counter() - start
            consumers.append(consume(engine.add_request(prompt, params), arrival))
        return tuple(await asyncio.gather(*consumers))


class LlamaContexts:
    """N `Llama` objects on the GGUF, the threads split among them; serve() runs requests FCFS, one per context at a time."""

    def __init__(self, gguf: Path, num_contexts: int, threads: int, num_ctx: int) -> None:
        self.llama_cpp = import_llama_cpp()
        shares = [threads // num_contexts + (i < threads % num_contexts) for i in range(num_contexts)]
        with quiet_stderr():
            self.contexts = [
                self.llama_cpp.Llama(
                    model_path=str(gguf), n_ctx=num_ctx, n_threads=n, n_threads_batch=n, logits_all=False, verbose=False
                )
                for n in shares
            ]
        self.num_vocab = self.contexts[0].n_vocab()
        for llm in self.contexts:  # warm up
            llm.reset()
            llm.eval([llm.token_bos(), llm.token_bos()])

    def close(self) -> None:
        for llm in self.contexts:
            llm.close()

    def serve(self, prompts: list[list[int]], num_new_tokens: int) -> Served:
        queue = iter(range(len(prompts)))
        lock = threading.Lock()
        traces: list[Trace | None] = [None] * len(prompts)
        errors: list[Exception] = []
        start = time.perf_counter()

        def worker(llm) -> None:
            try:
                while True:
                    with lock:
                        i = next(queue, None)
                    if i is None:
                        return
                    llm.reset()  # n_tokens = 0; the next eval overwrites the old KV cells
                    ids, times = [], []
                    llm.eval(prompts[i])
                    while True:
                        ids.append(argmax_logits(self.llama_cpp, llm.ctx, -1, self.num_vocab))
                        times.append(time.perf_counter() - start)
                        if len(ids) == num_new_tokens:
                            break
                        llm.eval([ids[-1]])
                    traces[i] = Trace(0.0, tuple(times), tuple(ids))
            except Exception as exc:  # surfaced in the caller's thread
                errors.append(exc)

        with CpuWatch() as watch:
            workers = [threading.Thread(target=worker, args=(llm,)) for llm in self.contexts]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        if errors:
            raise errors[0]
        return Served(tuple(t for t in traces if t is not None), watch.num_other_busy_cores)


class LlamaBatched:
    """One llama.cpp context per level with one sequence per request, batched like llama-server:
    each step = one token of every generating sequence + prompt tokens up to n_batch."""

    def __init__(self, gguf: Path, threads: int) -> None:
        self.llama_cpp = import_llama_cpp()
        self.threads = threads
        with quiet_stderr():
            self.model = self.llama_cpp.llama_model_load_from_file(
                str(gguf).encode(), self.llama_cpp.llama_model_default_params()
            )
        if not self.model:
            raise EngineUnavailable(f"llama.cpp cannot load {gguf}")
        self.num_vocab = self.llama_cpp.llama_vocab_n_tokens(self.llama_cpp.llama_model_get_vocab(self.model))

    def close(self) -> None:
        self.llama_cpp.llama_model_free(self.model)

    def serve(self, prompts: list[list[int]], num_new_tokens: int) -> Served:
        lc = self.llama_cpp
        params = lc.llama_context_default_params()
        params.n_seq_max = len(prompts)
        params.n_ctx = 256 * -(-len(prompts) * (len(prompts[0]) + num_new_tokens + 1) // 256)
        params.n_batch = params.n_ubatch = LLAMA_BATCH
        params.n_threads = params.n_threads_batch = self.threads
        params.kv_unified = False  # a KV stream per sequence: attention never scans the other sequences' cells
        with quiet_stderr():
            ctx = lc.llama_init_from_model(self.model, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not make a context for {len(prompts)} sequences")
        batch = lc.llama_batch_init(LLAMA_BATCH, 0, 1)
        try:
            memory = lc.llama_get_memory(ctx)
            self._decode(ctx, batch, [(0, 0, prompts[0][0], True)])  # warm up
            lc.llama_memory_clear(memory, True)
            with CpuWatch() as watch:
                traces = self._serve(ctx, batch, memory, prompts, num_new_tokens)
        finally:
            lc.llama_batch_free(batch)
            lc.llama_free(ctx)
        return Served(traces, watch.num_other_busy_cores)

    def _decode(self, ctx, batch, items: list[tuple[int, int, int, bool]]) -> dict[int, int]:
        """Run (sequence, position, token, wants logits) items as one batch; greedy token per sequence that wants one."""
        batch.n_tokens = len(items)
        for k, (seq, pos, token, wants) in enumerate(items):
            batch.token[k], batch.pos[k], batch.n_seq_id[k], batch.logits[k] = token, pos, 1, wants
            batch.seq_id[k][0] = seq
        status = self.llama_cpp.llama_decode(ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")
        return {seq: argmax_logits(self.llama_cpp, ctx, k, self.num_vocab) for k, (seq, _, _, wants) in enumerate(items) if wants}

    def _serve(self, ctx, batch, memory, prompts: list[list[int]], num_new_tokens: int) -> tuple[Trace, ...]:
        start = time.perf_counter()
        pending = deque(range(len(prompts)))  # prompts not fully fed, FCFS
        num_fed = [0] * len(prompts)
        ids: list[list[int]] = [[] for _ in prompts]
        times: list[list[float]] = [[] for _ in prompts]
        generating: set[int] = set()
        while pending or generating:
            items = [(s, len(prompts[s]) + len(ids[s]) - 1, ids[s][-1], True) for s in sorted(generating)]
            while pending and len(items) < LLAMA_BATCH:
                s = pending[0]
                n = min(LLAMA_BATCH - len(items), len(prompts[s]) - num_fed[s])
                end = num_fed[s] + n
                items += [(s, p, prompts[s][p], p == len(prompts[s]) - 1) for p in range(num_fed[s], end)]
                num_fed[s] = end
                if end == len(prompts[s]):
                    pending.popleft()
                    generating.add(s)
            sampled = self._decode(ctx, batch, items)
            now = time.perf_counter() - start
            for s, token in sampled.items():
                ids[s].append(token)
                times[s].append(now)
                if len(ids[s]) == num_new_tokens:
                    generating.discard(s)
                    self.llama_cpp.llama_memory_seq_rm(memory, s, -1, -1)
        return tuple(Trace(0.0, tuple(t), tuple(i)) for t, i in zip(times, ids))


def llama_servers(
    modes: tuple[str, ...], context_counts: tuple[int, ...], threads: int, num_ctx: int, gguf: Path
) -> list[tuple[str, Callable[[], LlamaContexts | LlamaBatched]]]:
    """(mode name, server factory) for each llama.cpp mode asked for, in order; `num_ctx` fits one request."""
    servers: list[tuple[str, Callable[[], LlamaContexts | LlamaBatched]]] = []
    for mode in modes:
        if mode == "sequential":
            servers.append(("sequential", lambda: LlamaContexts(gguf, 1, threads, num_ctx)))
        elif mode == "contexts":
            for n in context_counts:
                servers.append((f"contexts x{n}", lambda n=n: LlamaContexts(gguf, n, threads, num_ctx)))
        else:
            servers.append(("batched", lambda: LlamaBatched(gguf, threads)))
    return servers
