"""Long prompts on the CPU: time per prefill chunk as the context grows, WiCore against llama.cpp.

One prompt of --prompt-tokens ids (BOS, then bench_generate's paragraph repeated), prefilled once
by each engine in chunks, every chunk timed on its own:

    WiCore     the engine's core stepped by hand (`EngineCore.step()`), one request: each step is
               one prefill chunk of the scheduler's prefill_chunk tokens (--chunk, default 256);
               `core.last_step.seconds` splits it: schedule, KV moves and update are host ms,
               the runner (build_batch, the ONNX Runtime runs, sampling) graphs ms
    llama.cpp  llama-cpp-python's eval() on consecutive slices of --llama-batch tokens
               (n_batch = n_ubatch), one KV cache holding the whole prompt

The engines take turns (lockstep): each prefills --turn-tokens more tokens, then the next one, so
every context is measured in all engines within seconds of each other; the speed of a shared VM
drifts over minutes (threefold here), which would otherwise pass for a difference of engines.

    context  0 ──────── 2K ──────── 8K ──────── 16K ──────────── 32K
    turns    |W W L|W W L|...        W = a WiCore export, L = llama.cpp; each turn --turn-tokens
    chunks   |c|c|c|...              each chunk's queries read its own tokens and what came before
                                     (full layers: all of it; sliding layers: their window)

    ms per 1K at C       seconds of the chunks that start in [C - 1024, C), per 1,000 of their tokens
                         (engines with different chunk sizes on one scale)
    prefill tok/s at L   L / the seconds of the chunks up to L: the first L tokens of the prompt are
                         a prompt of L tokens (only its last row's LM head is missing, ~1 ms)

Attention is the only cost that grows with the context, so the time per chunk should be close to
linear in the context it reads: a + b * C. The tool prints the slope between the marks.

Run from the repository root as a script (`python tools/bench_long_context.py`): the shared helpers
come from benchlib.py and workloads.py beside it. --model-dir may be given more than once (e.g. the
fp32 portable and the ort-quant export); each is measured in the same run, llama.cpp last. The KV
pool (--kv-pool-gb) must hold the prompt; the tool says so when it does not.

Usage:
    python tools/bench_long_context.py --model-dir models/lc-270m-fp32 --model-dir models/lc-270m-q --json long.json
    python tools/bench_long_context.py --prompt-tokens 4096 --marks 1024,2048,4096 --engines wicore
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchlib import (
    CpuWatch,
    EngineUnavailable,
    argmax_logits,
    ensure_model,
    gguf_path,
    import_llama_cpp,
    int_list,
    run_tool,
    write_record,
)
from workloads import build_prompt_ids

ENGINES = ("wicore", "llama.cpp")
WINDOW_TOKENS = 1024  # ms per 1K at C averages the chunks that start in [C - WINDOW_TOKENS, C)
WARMUP_TOKENS = 300


@dataclass(frozen=True)
class Chunk:
    start: int  # tokens already in the cache
    num_tokens: int
    seconds: float
    graphs_seconds: float | None = None  # WiCore: the runner's share (the rest is host bookkeeping)
    token: int | None = None  # the greedy token after the prompt, on its last chunk


@dataclass(frozen=True)
class Run:
    engine: str  # "wicore <dtype> <flavour>" or "llama.cpp"
    version: str
    chunks: list[Chunk]
    first_token: int | None  # greedy token after the whole prompt
    num_other_busy_cores: float | None

    def ms_per_1k(self, context: int) -> float:
        """Milliseconds per 1,000 prompt tokens of the chunks that start in [context - WINDOW_TOKENS, context)."""
        near = [c for c in self.chunks if context - WINDOW_TOKENS <= c.start < context]
        return 1000 * sum(c.seconds for c in near) / sum(c.num_tokens for c in near) * 1000

    def chunk_ms(self, context: int) -> float:
        """Milliseconds of one chunk, averaged over the chunks that start in [context - WINDOW_TOKENS, context)."""
        near = [c for c in self.chunks if context - WINDOW_TOKENS <= c.start < context]
        return 1000 * sum(c.seconds for c in near) / len(near)

    def host_ms(self, context: int) -> float | None:
        near = [c for c in self.chunks if context - WINDOW_TOKENS <= c.start < context]
        if any(c.graphs_seconds is None for c in near):
            return None
        return 1000 * sum(c.seconds - (c.graphs_seconds or 0.0) for c in near) / len(near)

    def tokens_per_s(self, length: int) -> float:
        """Prefill tok/s of the first `length` tokens (chunks end on `length` when it is a multiple of theirs)."""
        upto = [c for c in self.chunks if c.start < length]
        return sum(c.num_tokens for c in upto) / sum(c.seconds for c in upto)


@dataclass(frozen=True)
class Config:
    engines: tuple[str, ...]
    model_dirs: tuple[str, ...]
    op_flavour: str
    threads: int
    num_prompt_tokens: int
    marks: tuple[int, ...]  # contexts at which ms per chunk / per 1K is reported
    lengths: tuple[int, ...]  # prompt lengths whose prefill tok/s is reported
    chunk: int  # WiCore's prefill_chunk
    llama_batch: int
    llama_flash_attn: bool
    kv_pool_gb: float
    json_path: Path | None
    turn_tokens: int = 2048  # each engine prefills this many tokens in turn (see lockstep)

    def __post_init__(self) -> None:
        if set(self.engines) - set(ENGINES):
            raise ValueError(f"unknown engine(s) {sorted(set(self.engines) - set(ENGINES))}; choose from {ENGINES}")
        if max(*self.marks, *self.lengths) > self.num_prompt_tokens:
            raise ValueError("--marks and --lengths must not exceed --prompt-tokens")
        if min(*self.marks, *self.lengths, self.chunk, self.llama_batch, self.threads, self.turn_tokens) < 1:
            raise ValueError("marks, lengths, --chunk, --llama-batch and --threads must be positive")


# --------------------------------------------------------------------------- engines


@dataclass
class Prefill:
    """One engine's prefill in progress: `steps` yields its timed chunks, the last with the token."""

    engine: str
    version: str
    steps: Iterator[Chunk]
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def num_done(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    def advance(self, until: int) -> bool:
        """Run chunks until `until` prompt tokens are done; False once the prompt is."""
        while self.num_done < until:
            chunk = next(self.steps, None)
            if chunk is None:
                return False
            self.chunks.append(chunk)
        return True


def wicore_prefill(model_dir: Path, config: Config, prompt_ids: list[int]) -> Prefill:
    import onnxruntime

    import wicore
    from wicore.graph.manifest import Manifest

    model_dir = ensure_model(model_dir, config.op_flavour)
    manifest = Manifest.read(model_dir)
    label = f"wicore {manifest.dtype} {manifest.op_flavour}"
    version = f"wicore {wicore.__version__}, onnxruntime {onnxruntime.__version__}"
    return Prefill(label, version, wicore_chunks(model_dir, config, prompt_ids))


def wicore_chunks(model_dir: Path, config: Config, prompt_ids: list[int]) -> Iterator[Chunk]:
    """Prefill `prompt_ids` as one request through the engine's parts (its thread is never
    started), one timed step a chunk; the last chunk carries the greedy token after the prompt."""
    from wicore.engine.engine import Engine, EngineConfig
    from wicore.engine.scheduler import SchedulerConfig
    from wicore.types.sampling import SamplingParams

    engine_config = EngineConfig(
        model_dir=model_dir,
        num_threads=config.threads,
        kv_pool_gb=config.kv_pool_gb,
        scheduler=SchedulerConfig(prefill_chunk=config.chunk),
        async_scheduling=False,  # each step timed alone around EngineCore.step()
    )
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    with Engine(engine_config) as engine:
        if len(prompt_ids) + 1 > engine.max_sequence_tokens:
            raise EngineUnavailable(f"{len(prompt_ids)} prompt tokens do not fit the KV pool; raise --kv-pool-gb")
        # Warm up on other tokens (the BOS, then the prompt's last ones): no prefix-cache hit.
        for _ in engine_steps(engine, prompt_ids[:1] + prompt_ids[-WARMUP_TOKENS:], params):
            pass
        yield from engine_steps(engine, prompt_ids, params)


def engine_steps(engine, prompt_ids: list[int], params) -> Iterator[Chunk]:
    """One request's prefill, one timed engine step (one chunk) at a time (the engine's thread
    not started: the tool steps its core)."""
    core = engine.core
    core.add(core.make_request(prompt_ids, params, f"prefill-{len(prompt_ids)}-{time.monotonic_ns()}"))
    token = None
    while token is None:
        outputs = core.step()
        trace = core.last_step
        if trace.num_lost or len(trace.rows) != 1 or any(o.finished and not o.new_token_ids for o in outputs):
            raise RuntimeError("the request ended, lost KV or was not scheduled")
        (row,) = trace.rows
        token = next((t for o in outputs for t in o.new_token_ids), None)
        yield Chunk(row.start, len(row.token_ids), trace.seconds.total_s, trace.seconds.run_s, token)


def llama_cpp_prefill(gguf: Path, config: Config, prompt_ids: list[int]) -> Prefill:
    llama_cpp = import_llama_cpp()
    label = f"llama.cpp (n_batch {config.llama_batch}, flash_attn {'on' if config.llama_flash_attn else 'off'})"
    return Prefill(label, f"llama-cpp-python {llama_cpp.__version__}", llama_cpp_chunks(llama_cpp, gguf, config, prompt_ids))


def llama_cpp_chunks(llama_cpp, gguf: Path, config: Config, prompt_ids: list[int]) -> Iterator[Chunk]:
    """Prefill `prompt_ids` with llama.cpp in slices of n_batch tokens, each eval() timed; the
    last slice carries the greedy token (argmax of its last logits row)."""
    batch = config.llama_batch
    llm = llama_cpp.Llama(
        model_path=str(gguf),
        n_ctx=len(prompt_ids) + 16,
        n_batch=batch,
        n_ubatch=batch,
        n_threads=config.threads,
        n_threads_batch=config.threads,
        flash_attn=config.llama_flash_attn,
        verbose=False,
    )
    try:
        llm.eval(prompt_ids[:WARMUP_TOKENS])
        llm.reset()
        for start in range(0, len(prompt_ids), batch):
            begin = time.perf_counter()
            llm.eval(prompt_ids[start : start + batch])
            seconds = time.perf_counter() - begin
            is_last = start + batch >= len(prompt_ids)
            token = argmax_logits(llama_cpp, llm.ctx, -1, llm.n_vocab()) if is_last else None
            yield Chunk(start, min(batch, len(prompt_ids) - start), seconds, token=token)
    finally:
        llm.close()


def lockstep(prefills: list[Prefill], turn_tokens: int) -> list[Run]:
    """Every engine prefills `turn_tokens` more tokens in turn, until all are done: each context is
    measured in every engine within a few seconds of the others, so a machine whose speed drifts
    over minutes (a shared VM) shifts all engines alike."""
    active = list(prefills)
    until = 0
    with CpuWatch() as watch:
        while active:
            until += turn_tokens
            active = [p for p in active if p.advance(until)]
    return [Run(p.engine, p.version, p.chunks, p.chunks[-1].token, watch.num_other_busy_cores) for p in prefills]


# --------------------------------------------------------------------------- report


def chunk_table(runs: list[Run], marks: Sequence[int]) -> str:
    """ms per chunk (WiCore) and ms per 1K tokens at each mark, and the slope between marks."""
    head = " | ".join(f"{round(m / 1024)}K" for m in marks)
    lines = [
        f"| engine | what | {head} |",
        "|---|---|" + "---:|" * len(marks),
    ]
    for r in runs:
        lines.append(f"| {r.engine} | ms per 1K tokens | " + " | ".join(f"{r.ms_per_1k(m):.0f}" for m in marks) + " |")
        if r.chunks[0].graphs_seconds is not None:
            size = r.chunks[0].num_tokens
            lines.append(
                f"| {r.engine} | ms per {size}-token chunk | " + " | ".join(f"{r.chunk_ms(m):.0f}" for m in marks) + " |"
            )
            lines.append(f"| {r.engine} | of which host ms | " + " | ".join(f"{r.host_ms(m):.1f}" for m in marks) + " |")
        slopes = [(r.ms_per_1k(b) - r.ms_per_1k(a)) / ((b - a) / 1024) for a, b in itertools.pairwise(marks)]
        lines.append(
            f"| {r.engine} | slope: ms per 1K more per 1K of context | – | " + " | ".join(f"{s:.1f}" for s in slopes) + " |"
        )
    return "\n".join(lines)


def rate_table(runs: list[Run], lengths: Sequence[int]) -> str:
    reference = next((r for r in runs if r.engine.startswith("llama.cpp")), None)
    head = " | ".join(f"{round(n / 1024)}K" for n in lengths)
    lines = [f"| engine | prefill tok/s: {head} | first token |", "|---|" + "---:|" * len(lengths) + "---:|"]
    for r in runs:
        cells = []
        for n in lengths:
            ratio = f" ({r.tokens_per_s(n) / reference.tokens_per_s(n):.2f}x)" if reference and r is not reference else ""
            cells.append(f"{r.tokens_per_s(n):.0f}{ratio}")
        lines.append(f"| {r.engine} | " + " | ".join(cells) + f" | {r.first_token} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- cli


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated, from: " + ", ".join(ENGINES))
    parser.add_argument("--model-dir", action="append", type=Path, help="exported model; repeat to measure several")
    parser.add_argument("--op-flavour", default="portable", help="op flavour when a missing --model-dir is exported")
    parser.add_argument("--threads", type=int, default=2, help="compute threads for every engine (default 2)")
    parser.add_argument(
        "--prompt-tokens", type=int, default=32767, help="prompt length, BOS included (default 32767: the 270M's 32768 less one)"
    )
    parser.add_argument("--marks", default="2048,8192,16384,32767", help="contexts at which the chunk times are reported")
    parser.add_argument("--lengths", default="2048,8192,32767", help="prompt lengths whose prefill tok/s is reported")
    parser.add_argument("--chunk", type=int, default=256, help="WiCore's prefill chunk (the scheduler's default: 256)")
    parser.add_argument("--llama-batch", type=int, default=512, help="llama.cpp's n_batch and n_ubatch (default 512)")
    parser.add_argument("--llama-flash-attn", action=argparse.BooleanOptionalAction, default=True, help="llama.cpp flash_attn")
    parser.add_argument("--kv-pool-gb", type=float, default=2.0, help="WiCore's device KV pool; must hold the prompt")
    parser.add_argument("--turn-tokens", type=int, default=2048, help="tokens each engine prefills in turn (default 2048)")
    parser.add_argument("--json", type=Path, help="also write a JSON record here")
    args = parser.parse_args(argv)
    return Config(
        engines=tuple(e.strip() for e in args.engines.split(",") if e.strip()),
        model_dirs=tuple(str(m) for m in args.model_dir or [Path("models/gemma3-270m")]),
        turn_tokens=args.turn_tokens,
        op_flavour=args.op_flavour,
        threads=args.threads,
        num_prompt_tokens=args.prompt_tokens,
        marks=int_list(args.marks),
        lengths=int_list(args.lengths),
        chunk=args.chunk,
        llama_batch=args.llama_batch,
        llama_flash_attn=args.llama_flash_attn,
        kv_pool_gb=args.kv_pool_gb,
        json_path=args.json,
    )


def run(config: Config, num_busy_before: float | None) -> int:
    gguf = gguf_path()
    prompt_ids, _ = build_prompt_ids(gguf, config.num_prompt_tokens)
    prefills = [wicore_prefill(Path(m), config, prompt_ids) for m in config.model_dirs if "wicore" in config.engines]
    if "llama.cpp" in config.engines:
        prefills.append(llama_cpp_prefill(gguf, config, prompt_ids))
    print(f"prefilling {len(prompt_ids)} tokens in {', '.join(p.engine for p in prefills)} ...", file=sys.stderr, flush=True)
    try:
        runs = lockstep(prefills, config.turn_tokens)
    except EngineUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"Gemma 3 270M, one prompt of {len(prompt_ids)} tokens, {config.threads} threads, {config.turn_tokens} tokens a turn\n")
    print(chunk_table(runs, config.marks))
    print()
    print(rate_table(runs, config.lengths))
    others = runs[0].num_other_busy_cores
    print(f"\nother processes kept {'n/a' if others is None else f'{others:.2f}'} cores busy")
    for r in runs:
        print(f"{r.engine}: {sum(c.seconds for c in r.chunks):.1f} s in all")
    if config.json_path is not None:
        write_record(
            config.json_path,
            config,
            num_busy_cores_before=num_busy_before,
            runs=[asdict(r) for r in runs],
            summary={
                r.engine: {
                    "ms_per_1k": {m: r.ms_per_1k(m) for m in config.marks},
                    "chunk_ms": {m: r.chunk_ms(m) for m in config.marks},
                    "tokens_per_s": {n: r.tokens_per_s(n) for n in config.lengths},
                }
                for r in runs
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(None, parse_args, run))
