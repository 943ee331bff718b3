"""Serving throughput under concurrency: WiCore's engine against llama.cpp on the same requests, in one run.

At each concurrency level C, C requests arrive at once: each has exactly --prompt-tokens
prompt ids (BOS, a distinct header, then the same sentences in a different order, so no
two prompts share a first KV block and the prefix cache has nothing to reuse) and asks
for --new-tokens greedy tokens with ignore_eos. Every engine gets the same prompt ids and
the same total thread count; the client stamps each token with the time it receives it.

    request r:  arrival a_r     first token f_r = t_r,1      t_r,2     ...      t_r,M
                |---- TTFT ---->|--------- ITL ---------|-- ITL --| ... |
    level:             min_r f_r |<------------------- window ------------------>| max_r t_r,M

    aggregate decode tok/s = sum over r of (M - 1)  /  (max_r t_r,M - min_r f_r)
    TTFT_r = f_r - a_r (queueing included)       ITL = t_r,k+1 - t_r,k, pooled over all r and k
    p50 / p99: linear interpolation between order statistics (numpy's default)

Each request's first token comes from its prefill and is left out of the numerator; prefills
of later requests that fall inside the window count against it, as they would for a server.
"vs 1-stream" divides by WiCore's aggregate at C = 1, which is its own single-stream decode rate.
One stream is the shortest and noisiest measurement, and the denominator of every ratio: it is
measured --single-repeats times (default 5) for every engine, and the median is reported.

Who serves the requests:

    wicore                  the Engine (continuous batching, paged KV, prefix cache on unless
                            --no-prefix-cache), a fresh engine per level, warmed up first
    llama.cpp sequential    (a) one Llama context, one request after another (FCFS)
    llama.cpp contexts xN   (b) N Llama contexts in N Python threads, threads split among them,
                            each taking the next waiting request (FCFS)
    llama.cpp batched       one context holding C sequences, batched as llama-server does: each
                            step decodes one token of every generating sequence and fills the
                            rest of n_batch (512, WiCore's token budget) with prompt tokens

The issue's target: at 16 streams WiCore's aggregate is >= 4x its single-stream rate and
>= 2x llama.cpp's best aggregate over modes (a) and (b). llama.cpp batched is outside that
definition and is reported beside it.

Levels run in order, and within a level every engine and mode back to back, so the rows of one
level see the same machine. Before each measurement the tool waits (--max-wait) for other
processes to leave the cores; during it, it watches /proc/stat, and when they kept more than
MAX_OTHER_CORES cores busy it measures again (--retries) and keeps the calmest attempt; the table
says how busy the others were. What /proc/stat cannot show (other tenants of a shared host taking
memory bandwidth) still moves the rates: compare rows of one level, and repeat a run.

Run from the repository root as a script (`python tools/bench_serving.py`): the shared helpers
come from the sibling tools/bench_generate.py, which is then on sys.path.

Usage:
    python tools/bench_serving.py --wicore-model models/gemma3-270m --json serving.json
    python tools/bench_serving.py --levels 1,4 --new-tokens 16 --llama-modes sequential
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import functools
import gc
import json
import math
import os
import random
import shlex
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Protocol, TypeVar

from bench_generate import (
    EngineUnavailable,
    gguf_path,
    machine_info,
    num_agreeing,
    num_busy_cores,
    warn_if_busy,
)

LLAMA_MODES = ("sequential", "contexts", "batched")
ISSUE_LLAMA_MODES = ("sequential", "contexts")  # the issue's (a) and (b)
TARGET_STREAMS = 16
TARGET_VS_SINGLE = 4.0
TARGET_VS_LLAMA = 2.0
MAX_OTHER_CORES = 0.3
LLAMA_BATCH = 512
WARMUP_TEXT = "Warm-up: the quick brown fox jumps over the lazy dog."

SENTENCES = (
    "The river ran slowly past the old mill, carrying leaves from the hills down toward the sea.",
    "A compiler turns source text into a tree, the tree into instructions, and the instructions into a program.",
    "In spring the orchard fills with bees, and the farmer counts the blossoms to guess the harvest.",
    "The committee met on Tuesday to discuss the budget, but the vote was postponed until next month.",
    "Photosynthesis converts light, water and carbon dioxide into sugar and oxygen inside the leaf.",
    "She packed a map, two candles, a tin of biscuits and a notebook before setting out at dawn.",
    "The striker curled the ball past the keeper in the ninetieth minute, and the stadium erupted.",
    "Interest rates rose for the third quarter in a row, and mortgage applications fell sharply.",
    "Granite forms when magma cools slowly deep underground, giving its crystals time to grow large.",
    "The museum's new wing displays pottery, coins and tools recovered from a Roman harbour.",
    "To reset the router, hold the button on the back for ten seconds until the light blinks amber.",
    "Octopuses can change the colour and texture of their skin in a fraction of a second.",
    "The recipe calls for flour, butter, a pinch of salt and enough cold water to bind the dough.",
    "A train left the station at noon, travelling east at eighty kilometres an hour through the valley.",
    "Her grandfather kept bees, repaired clocks and wrote long letters that nobody ever answered.",
    "The telescope's mirror must be polished to within a few millionths of a millimetre.",
    "After the storm the villagers gathered on the beach to drag the fishing boats above the tide line.",
    "Good documentation explains why a design was chosen, not only how the code should be called.",
    "The violinist tuned her strings twice, nodded to the pianist, and began the slow movement.",
    "Glaciers carve U-shaped valleys as they grind their way down from the mountains over centuries.",
    "The bakery on the corner opens at six, and by seven the queue stretches past the bus stop.",
    "Vaccines train the immune system to recognise a pathogen before it can cause serious disease.",
    "The lighthouse keeper logged every passing ship, the wind direction and the height of the waves.",
    "Chess players spend years studying openings, yet most games are decided by a single blunder.",
)


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


@dataclass(frozen=True)
class LevelResult:
    engine: str
    mode: str
    num_streams: int
    threads: int
    aggregate_decode_tokens_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p99_s: float
    wall_seconds: float  # level start to the last token
    num_generated_tokens: int
    num_other_busy_cores: float | None
    num_attempts: int
    prefix_hit_rate: float | None
    num_agreeing_tokens: int  # of request 0's greedy tokens, a common prefix with WiCore's at 1 stream
    traces: tuple[Trace, ...]
    repeat_rates: tuple[float, ...] = ()  # the aggregate of every repeat (one stream: the median is reported)


@dataclass(frozen=True)
class BenchConfig:
    levels: tuple[int, ...]
    threads: int
    num_prompt_tokens: int
    num_new_tokens: int
    wicore_model: Path
    llama_modes: tuple[str, ...]
    llama_contexts: tuple[int, ...]
    is_prefix_cache: bool
    num_retries: int
    max_wait_s: float
    num_single_repeats: int
    seed: int
    json_path: Path | None

    def __post_init__(self) -> None:
        if not self.levels or min(self.levels) < 1:
            raise ValueError("--levels must be positive integers, e.g. 1,4,16,64")
        if self.threads < 1:
            raise ValueError("--threads must be at least 1")
        if self.num_prompt_tokens < 16:
            raise ValueError("--prompt-tokens must be at least 16 (BOS and a distinct header come first)")
        if self.num_new_tokens < 2:
            raise ValueError("--new-tokens must be at least 2 (the first token comes from prefill)")
        unknown = set(self.llama_modes) - set(LLAMA_MODES)
        if unknown:
            raise ValueError(f"unknown llama.cpp mode(s) {sorted(unknown)}; choose from {', '.join(LLAMA_MODES)}")
        if any(not 2 <= n <= self.threads for n in self.llama_contexts):
            raise ValueError(f"--llama-contexts: each count must be in 2..--threads ({self.threads})")
        if self.num_retries < 0:
            raise ValueError("--retries must be >= 0")
        if self.num_single_repeats < 1:
            raise ValueError("--single-repeats must be at least 1")


# --------------------------------------------------------------------------- workload and statistics


def build_prompts(encode: Callable[[str], list[int]], num_prompts: int, num_tokens: int, seed: int) -> list[list[int]]:
    """Exactly `num_tokens` ids each: BOS, "Request i.", then SENTENCES shuffled by (seed, i), repeated as needed."""
    prompts = []
    for i in range(num_prompts):
        rng = random.Random(f"{seed}:{i}")
        ids = encode(f"Request {i}. " + " ".join(rng.sample(SENTENCES, len(SENTENCES))))
        while len(ids) < num_tokens:
            ids += encode(" " + " ".join(rng.sample(SENTENCES, len(SENTENCES))))[1:]  # drop the BOS
        prompts.append(ids[:num_tokens])
    return prompts


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), interpolating linearly between order statistics; NaN if empty."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    k = (len(ordered) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(
    engine: str, mode: str, threads: int, served: Served, num_attempts: int, reference: Sequence[int]
) -> LevelResult:
    """The level's numbers from its traces (definitions in the module docstring)."""
    traces = served.traces
    first = min(t.token_times[0] for t in traces)
    last = max(t.token_times[-1] for t in traces)
    num_decoded = sum(len(t.token_times) - 1 for t in traces)
    ttfts = [t.token_times[0] - t.arrival for t in traces]
    itls = [b - a for t in traces for a, b in zip(t.token_times, t.token_times[1:])]
    return LevelResult(
        engine=engine,
        mode=mode,
        num_streams=len(traces),
        threads=threads,
        aggregate_decode_tokens_per_s=num_decoded / (last - first) if last > first else math.nan,
        ttft_p50_s=percentile(ttfts, 50),
        ttft_p99_s=percentile(ttfts, 99),
        itl_p50_s=percentile(itls, 50),
        itl_p99_s=percentile(itls, 99),
        wall_seconds=last,
        num_generated_tokens=sum(len(t.token_times) for t in traces),
        num_other_busy_cores=served.num_other_busy_cores,
        num_attempts=num_attempts,
        prefix_hit_rate=served.prefix_hit_rate,
        num_agreeing_tokens=num_agreeing(traces[0].token_ids, reference),
        traces=traces,
    )


def git_revision() -> str | None:
    """`git describe --always --dirty` of the checkout this tool lies in (the engine measured); None outside git."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


# --------------------------------------------------------------------------- CPU watch


def cpu_ticks() -> tuple[int, int, int] | None:
    """(busy ticks of all cores, all ticks of all cores, this process's ticks) from /proc; None off Linux."""
    stat, own = Path("/proc/stat"), Path("/proc/self/stat")
    if not stat.exists() or not own.exists():
        return None
    fields = [int(x) for x in stat.read_text().splitlines()[0].split()[1:]]
    total = sum(fields[:8])
    busy = total - fields[3] - fields[4]  # less idle and iowait
    own_fields = own.read_text().rpartition(")")[2].split()  # fields from the 3rd (state) on
    return busy, total, int(own_fields[11]) + int(own_fields[12])  # utime + stime


class CpuWatch:
    """`with CpuWatch() as watch:` ... then `watch.num_other_busy_cores`: the cores that other
    processes kept busy on average while the block ran (every core's busy time less this process's)."""

    def __enter__(self) -> CpuWatch:
        self._before = cpu_ticks()
        self.num_other_busy_cores: float | None = None
        return self

    def __exit__(self, *exc: object) -> None:
        after = cpu_ticks()
        if self._before is None or after is None or after[1] == self._before[1]:
            return
        busy, total, own = (b - a for a, b in zip(self._before, after))
        self.num_other_busy_cores = max(0.0, (os.cpu_count() or 1) * (busy - own) / total)


class Watched(Protocol):
    @property
    def num_other_busy_cores(self) -> float | None: ...


MeasuredT = TypeVar("MeasuredT", bound=Watched)


def wait_for_quiet(label: str, max_wait_s: float) -> None:
    """Before a measurement: poll the cores (1 s windows) until other processes keep at most
    MAX_OTHER_CORES busy, for up to `max_wait_s` seconds."""
    deadline = time.monotonic() + max_wait_s
    busy = num_busy_cores()
    if busy is None or busy <= MAX_OTHER_CORES or max_wait_s <= 0:
        return
    print(f"[{label}] other processes keep {busy:.1f} cores busy; waiting up to {max_wait_s:.0f} s", file=sys.stderr)
    while busy is not None and busy > MAX_OTHER_CORES and time.monotonic() < deadline:
        busy = num_busy_cores()


def measure(label: str, run: Callable[[], MeasuredT], num_retries: int, max_wait_s: float) -> tuple[MeasuredT, int]:
    """Run once; again (up to `num_retries` times) while other processes competed, each attempt
    after waiting for a quiet moment. Returns the calmest attempt and the number of attempts."""
    attempts: list[MeasuredT] = []
    for attempt in range(num_retries + 1):
        wait_for_quiet(label, max_wait_s)
        attempts.append(run())
        others = attempts[-1].num_other_busy_cores
        if others is None or others <= MAX_OTHER_CORES:
            break
        then = "measuring again" if attempt < num_retries else "keeping the calmest attempt"
        print(f"warning: [{label}] other processes kept {others:.2f} cores busy; {then}", file=sys.stderr)
        gc.collect()
    calmest = min(attempts, key=lambda a: a.num_other_busy_cores or 0.0)
    return calmest, len(attempts)


# --------------------------------------------------------------------------- wicore


class WiCoreServer:
    """A fresh Engine per level (an empty prefix cache, a KV pool that fits every request)."""

    def __init__(self, model_dir: Path, threads: int, is_prefix_cache: bool) -> None:
        if not model_dir.is_dir():
            raise EngineUnavailable(
                f"no exported WiCore model at {model_dir}; make one with "
                f"`wicore-export --model gemma3-270m --out {model_dir}` or pass --wicore-model DIR"
            )
        from wicore.export.tokenizer import TokenizerInfo
        from wicore.graph.manifest import Manifest
        from wicore.runtime.tokenizer import Tokenizer

        manifest = Manifest.read(model_dir)
        manifest.verify(model_dir)  # once here; the engines below skip it
        if manifest.tokenizer is None:
            raise EngineUnavailable(f"{model_dir} was exported without a tokenizer; export it again")
        self.tokenizer = Tokenizer(model_dir, TokenizerInfo.from_dict(manifest.tokenizer))
        self.model_dir = model_dir
        self.threads = threads
        self.is_prefix_cache = is_prefix_cache

    def close(self) -> None:
        """Nothing to release: each level's engine is stopped when it is done."""

    def serve(self, prompts: list[list[int]], num_new_tokens: int) -> Served:
        from wicore.runtime.engine import Engine, EngineConfig
        from wicore.runtime.sampler import SamplingParams
        from wicore.runtime.scheduler import SchedulerConfig

        block_size = 16
        num_blocks = len(prompts) * -(-(len(prompts[0]) + num_new_tokens) // block_size) + 2  # + the sink + 1
        config = EngineConfig(
            model_dir=self.model_dir,
            num_threads=self.threads,
            block_size=block_size,
            num_device_blocks=num_blocks,
            num_host_blocks=0,
            enable_prefix_cache=self.is_prefix_cache,
            scheduler=SchedulerConfig(max_num_seqs=max(len(prompts), 1)),
            verify_files=False,
        )
        params = SamplingParams(max_tokens=num_new_tokens, ignore_eos=True)
        with Engine(config).start() as engine:
            engine.generate([self.tokenizer.encode(WARMUP_TEXT)], SamplingParams(max_tokens=2, ignore_eos=True))
            warm = engine.stats()
            with CpuWatch() as watch:
                traces = asyncio.run(self._serve(engine, prompts, params))
            stats = engine.stats()
        hits = stats["cached_prompt_tokens"] - warm["cached_prompt_tokens"]
        return Served(traces, watch.num_other_busy_cores, hits / sum(len(p) for p in prompts))

    @staticmethod
    async def _serve(engine, prompts: list[list[int]], params) -> tuple[Trace, ...]:
        start = time.perf_counter()

        async def consume(request_id: str, arrival: float) -> Trace:
            times: list[float] = []
            ids: list[int] = []
            async for out in engine.outputs(request_id):
                if out.finish_reason not in (None, "length"):
                    raise RuntimeError(f"{request_id} ended with {out.finish_reason!r}: {out.error}")
                now = time.perf_counter() - start
                times += [now] * len(out.new_token_ids)
                ids += out.new_token_ids
            return Trace(arrival, tuple(times), tuple(ids))

        consumers = []
        for prompt in prompts:
            arrival = time.perf_counter() - start
            consumers.append(consume(engine.add_request(prompt, params), arrival))
        return tuple(await asyncio.gather(*consumers))


# --------------------------------------------------------------------------- llama.cpp


def import_llama_cpp():
    try:
        import logging

        import llama_cpp
        import numpy  # noqa: F401  (argmax over the logits)
    except ImportError as exc:
        raise EngineUnavailable("llama-cpp-python is not installed: pip install llama-cpp-python") from exc
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # its log callback prints below this
    return llama_cpp


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2: llama.cpp prints some load-time warnings past its log callback."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def argmax_logits(llama_cpp, ctx, index: int, num_vocab: int) -> int:
    """Greedy: argmax of row `index` of the context's last logits, read in place."""
    import numpy as np

    return int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, index), shape=(num_vocab,))))


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
        return {
            seq: argmax_logits(self.llama_cpp, ctx, k, self.num_vocab)
            for k, (seq, _, _, wants) in enumerate(items)
            if wants
        }

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


# --------------------------------------------------------------------------- run


def run_levels(config: BenchConfig) -> tuple[list[LevelResult], dict[str, str], dict[str, str]]:
    """Level by level, every engine and mode back to back, so that the rows of one level see the same
    machine (on a shared host its speed drifts by tens of percent over minutes, with no process to show
    for it). Returns results, skipped engines, versions."""
    import wicore

    levels = sorted(set(config.levels) | {1})  # 1 stream is the reference rate
    wicore_server = WiCoreServer(config.wicore_model, config.threads, config.is_prefix_cache)
    prompts = build_prompts(wicore_server.tokenizer.encode, max(levels), config.num_prompt_tokens, config.seed)
    versions = {"wicore": f"wicore {wicore.__version__}"}
    skipped: dict[str, str] = {}
    servers: list[tuple[str, str, WiCoreServer | LlamaContexts | LlamaBatched]] = [
        ("wicore", "continuous batching", wicore_server)
    ]
    for name, make_server in llama_servers(config):
        try:
            server = make_server()
        except EngineUnavailable as exc:
            skipped[f"llama.cpp {name}"] = str(exc)
            print(f"[llama.cpp {name}] skipped: {exc}", file=sys.stderr, flush=True)
            continue
        versions["llama.cpp"] = f"llama-cpp-python {server.llama_cpp.__version__}"
        servers.append(("llama.cpp", name, server))

    results: list[LevelResult] = []
    reference: tuple[int, ...] = ()  # WiCore's greedy tokens for request 0 at one stream
    try:
        for level in levels:
            for engine, mode, server in servers:
                serve = functools.partial(server.serve, prompts[:level], config.num_new_tokens)
                results.append(measure_level(engine, mode, level, serve, config, reference))
                reference = reference or results[-1].traces[0].token_ids
                gc.collect()
    finally:
        for _, _, server in servers:
            server.close()
    return results, skipped, versions


def measure_level(
    engine: str, mode: str, level: int, serve: Callable[[], Served], config: BenchConfig, reference: Sequence[int]
) -> LevelResult:
    """One level, measured once; at one stream (the reference rate, and the shortest, noisiest
    measurement) `config.num_single_repeats` times, keeping the median by aggregate rate."""
    label = f"{engine} {mode}, {level} streams"
    print(f"[{label}] ...", file=sys.stderr, flush=True)
    repeats = []
    for _ in range(config.num_single_repeats if level == 1 else 1):
        served, attempts = measure(label, serve, config.num_retries, config.max_wait_s)
        repeats.append(summarize(engine, mode, config.threads, served, attempts, reference or served.traces[0].token_ids))
    rates = tuple(r.aggregate_decode_tokens_per_s for r in repeats)
    median = sorted(repeats, key=lambda r: r.aggregate_decode_tokens_per_s)[len(repeats) // 2]
    return replace(median, repeat_rates=rates)


def llama_servers(config: BenchConfig) -> list[tuple[str, Callable[[], LlamaContexts | LlamaBatched]]]:
    """(mode name, server factory) for each llama.cpp mode asked for, in order."""
    if not config.llama_modes:
        return []
    gguf = gguf_path()
    num_ctx = config.num_prompt_tokens + config.num_new_tokens + 16
    servers: list[tuple[str, Callable[[], LlamaContexts | LlamaBatched]]] = []
    for mode in config.llama_modes:
        if mode == "sequential":
            servers.append(("sequential", lambda: LlamaContexts(gguf, 1, config.threads, num_ctx)))
        elif mode == "contexts":
            for n in config.llama_contexts:
                servers.append((f"contexts x{n}", lambda n=n: LlamaContexts(gguf, n, config.threads, num_ctx)))
        else:
            servers.append(("batched", lambda: LlamaBatched(gguf, config.threads)))
    return servers


# --------------------------------------------------------------------------- report


def single_stream_rate(results: list[LevelResult]) -> float:
    return next(r.aggregate_decode_tokens_per_s for r in results if r.engine == "wicore" and r.num_streams == 1)


def markdown_table(results: list[LevelResult]) -> str:
    single = single_stream_rate(results)
    lines = [
        (
            "| streams | engine | mode | aggregate decode tok/s | vs WiCore 1-stream | TTFT p50 ms | TTFT p99 ms "
            "| ITL p50 ms | ITL p99 ms | wall s | others' cores |"
        ),
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(results, key=lambda r: r.num_streams):
        others = "n/a" if r.num_other_busy_cores is None else f"{r.num_other_busy_cores:.2f}"
        if r.num_attempts > 1:
            others += f" ({r.num_attempts} tries)"
        lines.append(
            f"| {r.num_streams} | {r.engine} | {r.mode} | {r.aggregate_decode_tokens_per_s:.1f} "
            f"| {r.aggregate_decode_tokens_per_s / single:.2f}x | {1000 * r.ttft_p50_s:.0f} | {1000 * r.ttft_p99_s:.0f} "
            f"| {1000 * r.itl_p50_s:.1f} | {1000 * r.itl_p99_s:.1f} | {r.wall_seconds:.1f} | {others} |"
        )
    return "\n".join(lines)


def target_report(results: list[LevelResult]) -> tuple[str, bool | None]:
    """The issue's target at TARGET_STREAMS streams, in words, and whether it holds (None: not measured)."""
    single = single_stream_rate(results)
    at = [r for r in results if r.num_streams == TARGET_STREAMS]
    wicore = next((r for r in at if r.engine == "wicore"), None)
    peers = [r for r in at if r.engine == "llama.cpp" and r.mode != "batched"]
    if wicore is None or not peers:
        return f"target: not evaluated (needs WiCore and llama.cpp sequential/contexts at {TARGET_STREAMS} streams)", None
    best = max(peers, key=lambda r: r.aggregate_decode_tokens_per_s)
    vs_single = wicore.aggregate_decode_tokens_per_s / single
    vs_llama = wicore.aggregate_decode_tokens_per_s / best.aggregate_decode_tokens_per_s
    holds = vs_single >= TARGET_VS_SINGLE and vs_llama >= TARGET_VS_LLAMA
    lines = [
        (
            f"target at {TARGET_STREAMS} streams: WiCore {wicore.aggregate_decode_tokens_per_s:.1f} tok/s = "
            f"{vs_single:.2f}x its single stream ({single:.1f} tok/s; needs >= {TARGET_VS_SINGLE:g}x: "
            f"{'yes' if vs_single >= TARGET_VS_SINGLE else 'no'}) and {vs_llama:.2f}x llama.cpp's best of "
            f"sequential / N contexts ({best.mode}, {best.aggregate_decode_tokens_per_s:.1f} tok/s; needs >= "
            f"{TARGET_VS_LLAMA:g}x: {'yes' if vs_llama >= TARGET_VS_LLAMA else 'no'}): "
            f"{'HOLDS' if holds else 'DOES NOT HOLD'}"
        )
    ]
    batched = next((r for r in at if r.engine == "llama.cpp" and r.mode == "batched"), None)
    if batched is not None:
        lines.append(
            f"outside the target: llama.cpp batched ({TARGET_STREAMS} sequences in one context) reaches "
            f"{batched.aggregate_decode_tokens_per_s:.1f} tok/s; WiCore is "
            f"{wicore.aggregate_decode_tokens_per_s / batched.aggregate_decode_tokens_per_s:.2f}x of it"
        )
    return "\n".join(lines), holds


def write_json(
    path: Path,
    config: BenchConfig,
    results: list[LevelResult],
    skipped: dict[str, str],
    versions: dict[str, str],
    target: tuple[str, bool | None],
    num_busy_before: float | None,
) -> None:
    def rounded(r: LevelResult) -> dict[str, object]:
        record = asdict(r)
        record["traces"] = [
            {"arrival": round(t.arrival, 6), "token_times": [round(x, 6) for x in t.token_times], "token_ids": list(t.token_ids)}
            for t in r.traces
        ]
        return record

    record = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "machine": machine_info(),
        "git_revision": git_revision(),
        "num_busy_cores_before": num_busy_before,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        "versions": versions,
        "target": {"text": target[0], "holds": target[1]},
        "results": [rounded(r) for r in results],
        "skipped": skipped,
    }
    path.write_text(json.dumps(record, indent=2) + "\n")


# --------------------------------------------------------------------------- cli


def int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse_args(argv: Sequence[str] | None) -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,4,16,64", help="concurrency levels (1 is always measured)")
    parser.add_argument("--threads", type=int, default=2, help="compute threads, in total, for every engine (default 2)")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="prompt length of every request, BOS included")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per request (ignore_eos)")
    parser.add_argument("--wicore-model", type=Path, default=Path("models/gemma3-270m"), help="exported model folder")
    parser.add_argument("--llama-modes", default=",".join(LLAMA_MODES), help="from: " + ", ".join(LLAMA_MODES))
    parser.add_argument("--llama-contexts", help="context counts for the contexts mode (default: --threads, if >= 2)")
    parser.add_argument("--no-prefix-cache", action="store_true", help="run WiCore with its prefix cache off")
    parser.add_argument("--retries", type=int, default=2, help="re-measurements when other processes compete")
    parser.add_argument("--max-wait", type=float, default=300, help="seconds to wait for idle cores before a measurement")
    parser.add_argument("--single-repeats", type=int, default=5, help="measurements at one stream; the median is kept")
    parser.add_argument("--seed", type=int, default=0, help="shuffles the prompts' sentences")
    parser.add_argument("--json", type=Path, help="also write a JSON record (with every token's time) here")
    args = parser.parse_args(argv)
    contexts = int_list(args.llama_contexts) if args.llama_contexts else ((args.threads,) if args.threads >= 2 else ())
    modes = tuple(m.strip() for m in args.llama_modes.split(",") if m.strip())
    return BenchConfig(
        levels=int_list(args.levels),
        threads=args.threads,
        num_prompt_tokens=args.prompt_tokens,
        num_new_tokens=args.new_tokens,
        wicore_model=args.wicore_model,
        llama_modes=tuple(m for m in modes if m != "contexts" or contexts),
        llama_contexts=contexts,
        is_prefix_cache=not args.no_prefix_cache,
        num_retries=args.retries,
        max_wait_s=args.max_wait,
        num_single_repeats=args.single_repeats,
        seed=args.seed,
        json_path=args.json,
    )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_args(argv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    num_busy_before = warn_if_busy(config.threads)
    try:
        results, skipped, versions = run_levels(config)
    except EngineUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    target = target_report(results)
    print(
        f"Gemma 3 270M serving, {config.threads} threads, {config.num_prompt_tokens} prompt tokens, "
        f"{config.num_new_tokens} new tokens per request, greedy, ignore_eos, "
        f"WiCore prefix cache {'on' if config.is_prefix_cache else 'off'}; 1-stream rows: median of "
        f"{config.num_single_repeats}\n"
    )
    print(markdown_table(results))
    print()
    print(target[0])
    for name, reason in skipped.items():
        print(f"\n{name} skipped: {reason}")
    if config.json_path is not None:
        write_json(config.json_path, config, results, skipped, versions, target, num_busy_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
