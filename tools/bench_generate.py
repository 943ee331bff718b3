"""Single-stream generation throughput: WiCore against llama.cpp and HF transformers.

One run, one machine, one prompt: every engine gets the same prompt token ids
(tokenized once with the HF tokenizer of the GGUF), the same thread count, and
greedy decoding. Every engine is loaded, warmed up once, then measured `--repeats` times in
rounds (one run of each engine a round, so a busy machine slows them alike); the table reports
the median of each rate and its ratio to llama.cpp's.

    prompt ids (exactly --prompt-tokens, BOS first)      generated tokens (--new-tokens)
    [BOS p1 p2 ... p(N-1)]                               [t1 | t2 t3 ... tM]
    \\_________ prefill: one timed pass ___________/      ^    \\___ decode ___/
                                                         |    M-1 timed steps, one token each
                               t1 comes from the prefill logits

    prompt tok/s = N / prefill seconds        decode tok/s = (M-1) / decode seconds

Tokenization is never timed; engines receive token ids. The shared helpers come from the sibling
modules benchlib.py and workloads.py (run as a script, this folder is on sys.path). When the wicore
engine is asked for and --model-dir holds no exported model, the GGUF the other engines read
(--gguf, default the packaged Gemma 3 270M) is exported there first (--op-flavour); an export of
another GGUF is refused.

Usage:
    python tools/bench_generate.py --engines llama.cpp,hf --show-tokens --json bench.json
    python tools/bench_generate.py --model-dir models/gemma3-270m --threads 2
    python tools/bench_generate.py --gguf smollm2-135m-instruct --model-dir models/smollm2-ort-quant
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from benchlib import (
    EngineUnavailable,
    add_model_args,
    argmax_logits,
    ensure_model,
    gguf_path,
    import_llama_cpp,
    num_agreeing,
    run_tool,
    write_record,
)
from workloads import build_prompt_ids

ENGINES = ("wicore", "llama.cpp", "hf")
REFERENCE_ENGINE = "llama.cpp"
NUM_KEPT_TOKENS = 32
NUM_SHOWN_TOKENS = 16
WARMUP_NEW_TOKENS = 2
MAX_SPREAD = 1.25


@dataclass(frozen=True)
class Timing:
    """One measured generation: prefill over the whole prompt, then decode steps after the first token."""

    prefill_seconds: float
    num_prompt_tokens: int
    decode_seconds: float
    num_decode_steps: int
    token_ids: tuple[int, ...]

    @property
    def prompt_tokens_per_s(self) -> float:
        return self.num_prompt_tokens / self.prefill_seconds

    @property
    def decode_tokens_per_s(self) -> float:
        return self.num_decode_steps / self.decode_seconds


@dataclass(frozen=True)
class Result:
    """Median rates of one engine over the repeats, with the raw seconds kept for the record."""

    engine: str
    version: str
    threads: int
    num_prompt_tokens: int
    num_decode_steps: int
    prompt_tokens_per_s: float
    decode_tokens_per_s: float
    prefill_seconds: tuple[float, ...]
    decode_seconds: tuple[float, ...]
    token_ids: tuple[int, ...]  # the first NUM_KEPT_TOKENS generated ids, greedy


@dataclass(frozen=True)
class BenchConfig:
    engines: tuple[str, ...]
    threads: int
    num_prompt_tokens: int
    num_new_tokens: int
    num_repeats: int
    wicore_model: Path
    op_flavour: str
    json_path: Path | None
    is_show_tokens: bool
    gguf: str | None = None  # a .gguf or a pulled name (wicore pull); None: the packaged Gemma 3 270M

    def __post_init__(self) -> None:
        unknown = set(self.engines) - set(ENGINES)
        if unknown:
            raise ValueError(f"unknown engine(s) {sorted(unknown)}; choose from {', '.join(ENGINES)}")
        if self.threads < 1 or self.num_repeats < 1:
            raise ValueError("--threads and --repeats must be at least 1")
        if self.num_prompt_tokens < 2:
            raise ValueError("--prompt-tokens must be at least 2 (BOS plus one text token)")
        if self.num_new_tokens < 2:
            raise ValueError("--new-tokens must be at least 2 (the first token comes from prefill)")


# --------------------------------------------------------------------------- shared


@dataclass(frozen=True)
class Runner:
    """One engine, loaded: `run_once(prompt ids, new tokens)` generates greedily and times it."""

    engine: str
    version: str
    run_once: Callable[[list[int], int], Timing]


def measure(runners: list[Runner], threads: int, prompt_ids: list[int], num_new_tokens: int, num_repeats: int) -> list[Result]:
    """Warm every engine up once on the full prompt with a couple of new tokens, then run the repeats
    in rounds, one run of each engine a round, and take each engine's medians. Interleaved, the
    engines share whatever else the machine is doing, so their ratio holds better than their rates."""
    for runner in runners:
        runner.run_once(prompt_ids, WARMUP_NEW_TOKENS)
    timings: dict[str, list[Timing]] = {r.engine: [] for r in runners}
    for _ in range(num_repeats):
        for runner in runners:
            timings[runner.engine].append(runner.run_once(prompt_ids, num_new_tokens))
    return [summarize(r, threads, timings[r.engine]) for r in runners]


def summarize(runner: Runner, threads: int, timings: list[Timing]) -> Result:
    warn_if_noisy(runner.engine, "prefill", [t.prefill_seconds for t in timings])
    warn_if_noisy(runner.engine, "decode", [t.decode_seconds for t in timings])
    return Result(
        engine=runner.engine,
        version=runner.version,
        threads=threads,
        num_prompt_tokens=timings[0].num_prompt_tokens,
        num_decode_steps=timings[0].num_decode_steps,
        prompt_tokens_per_s=statistics.median(t.prompt_tokens_per_s for t in timings),
        decode_tokens_per_s=statistics.median(t.decode_tokens_per_s for t in timings),
        prefill_seconds=tuple(t.prefill_seconds for t in timings),
        decode_seconds=tuple(t.decode_seconds for t in timings),
        token_ids=timings[-1].token_ids[:NUM_KEPT_TOKENS],
    )


def warn_if_noisy(engine: str, phase: str, seconds: list[float]) -> None:
    """Repeats that differ by more than MAX_SPREAD mean something else ran; the median may still hold."""
    if max(seconds) > MAX_SPREAD * min(seconds):
        shown = ", ".join(f"{s:.2f}" for s in seconds)
        print(f"warning: [{engine}] {phase} repeats spread widely ({shown} s); is the machine busy?", file=sys.stderr)


# --------------------------------------------------------------------------- engines


@contextlib.contextmanager
def open_llama_cpp(gguf: Path, num_tokens: int, threads: int) -> Iterator[Runner]:
    """llama.cpp through llama-cpp-python's low-level `eval`; greedy is argmax of the last logits row.

    Argmax in numpy rather than `llm.sample(temp=0)`, which builds a sampler chain per call: every
    engine then pays the same greedy step over the full vocabulary.
    """
    llama_cpp = import_llama_cpp()
    llm = llama_cpp.Llama(
        model_path=str(gguf),
        n_ctx=num_tokens + 16,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=False,
        verbose=False,
    )

    num_vocab = llm.n_vocab()

    def next_token() -> int:
        # eval() keeps no logits unless logits_all; read the last row straight from the context.
        return argmax_logits(llama_cpp, llm.ctx, -1, num_vocab)

    def run_once(ids: list[int], num_new: int) -> Timing:
        llm.reset()  # n_tokens = 0; the next eval drops every cached KV cell past it
        start = time.perf_counter()
        llm.eval(ids)
        prefill_seconds = time.perf_counter() - start
        token_ids = [next_token()]
        start = time.perf_counter()
        for _ in range(num_new - 1):
            llm.eval([token_ids[-1]])
            token_ids.append(next_token())
        decode_seconds = time.perf_counter() - start
        return Timing(prefill_seconds, len(ids), decode_seconds, num_new - 1, tuple(token_ids))

    try:
        yield Runner("llama.cpp", f"llama-cpp-python {llama_cpp.__version__}", run_once)
    finally:
        llm.close()


@contextlib.contextmanager
def open_hf(gguf: Path, threads: int) -> Iterator[Runner]:
    """HF transformers on CPU: fp32 weights dequantized from the GGUF, eager attention, its own KV cache."""
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise EngineUnavailable("torch and transformers are needed: pip install 'wicore[dev]'") from exc

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()

    @torch.inference_mode()
    def run_once(ids: list[int], num_new: int) -> Timing:
        input_ids = torch.tensor([ids], dtype=torch.long)
        start = time.perf_counter()
        out = model(input_ids=input_ids, use_cache=True, logits_to_keep=1)
        prefill_seconds = time.perf_counter() - start
        token_ids = [int(out.logits[0, -1].argmax())]
        past = out.past_key_values
        start = time.perf_counter()
        for _ in range(num_new - 1):
            step_ids = torch.tensor([[token_ids[-1]]], dtype=torch.long)
            out = model(input_ids=step_ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            token_ids.append(int(out.logits[0, -1].argmax()))
        decode_seconds = time.perf_counter() - start
        return Timing(prefill_seconds, len(ids), decode_seconds, num_new - 1, tuple(token_ids))

    yield Runner("hf", f"transformers {transformers.__version__}, torch {torch.__version__}", run_once)


@contextlib.contextmanager
def open_wicore(
    model_dir: Path, op_flavour: str, gguf: Path, num_prompt_tokens: int, num_tokens: int, threads: int
) -> Iterator[Runner]:
    """WiCore's Engine on an exported model folder (exported first if missing), one request at a
    time, timed as its client sees the tokens arrive:

        add_request ──► first token ──► ... ──► last token
        \\___ prefill seconds ___/\\__ decode seconds: M-1 steps __/

    The whole prompt is one prefill chunk (the prefill pass the other engines run), the sliding
    layers release their blocks behind the window as in serving, and the prefix cache is off:
    a repeat of the same prompt would otherwise find it cached and skip the prefill. A missing
    `model_dir` gets an export of `gguf`; one that holds another GGUF's export is refused."""
    try:
        import onnxruntime

        import wicore
        from wicore.engine.engine import Engine, EngineConfig
        from wicore.engine.scheduler import SchedulerConfig
        from wicore.errors import WiCoreError
        from wicore.types.sampling import SamplingParams
    except ImportError as exc:
        raise EngineUnavailable(f"WiCore runtime cannot be imported ({exc}); pip install -e '.[cpu]'") from exc
    model_dir = ensure_model(model_dir, op_flavour, str(gguf))
    check_same_model(model_dir, gguf)
    config = EngineConfig(
        model_dir=model_dir,
        num_threads=threads,
        host_tier_gb=0.0,
        enable_prefix_cache=False,
        scheduler=SchedulerConfig(
            max_num_seqs=1, prefill_chunk=num_prompt_tokens, max_num_batched_tokens=max(num_prompt_tokens, 2048)
        ),
    )
    try:
        engine = Engine(config)
    except WiCoreError as exc:
        raise EngineUnavailable(f"WiCore cannot load {model_dir}: {exc}") from exc
    if num_tokens > engine.max_sequence_tokens:
        engine.stop()
        raise EngineUnavailable(f"{num_tokens} tokens do not fit one WiCore sequence ({engine.max_sequence_tokens})")

    def run_once(ids: list[int], num_new: int) -> Timing:
        start = time.perf_counter()
        request_id = engine.add_request(ids, SamplingParams(max_tokens=num_new, ignore_eos=True))
        times: list[float] = []
        token_ids: list[int] = []
        for out in engine.outputs(request_id):
            if out.finish_reason not in (None, "length"):
                raise RuntimeError(f"WiCore ended the request with {out.finish_reason!r}: {out.error}")
            times += [time.perf_counter()] * len(out.new_token_ids)
            token_ids += out.new_token_ids
        return Timing(times[0] - start, len(ids), times[-1] - times[0], len(token_ids) - 1, tuple(token_ids))

    with engine.start():
        yield Runner("wicore", f"wicore {wicore.__version__}, onnxruntime {onnxruntime.__version__}", run_once)


def check_same_model(model_dir: Path, gguf: Path) -> None:
    """Every engine must read the same weights: a WiCore export of another GGUF is refused."""
    from wicore.graph.manifest import Manifest

    source = Manifest.read(model_dir).source
    exported = source.get("path") if source.get("kind") == "gguf" else None
    if exported is not None and Path(exported).name != gguf.name:
        raise EngineUnavailable(
            f"{model_dir} is an export of {Path(exported).name}, the other engines read {gguf.name}: "
            "pass the --model-dir of its export, or a new one to export it there"
        )


def open_engine(engine: str, config: BenchConfig, gguf: Path) -> contextlib.AbstractContextManager[Runner]:
    num_tokens = config.num_prompt_tokens + config.num_new_tokens
    openers: dict[str, Callable[[], contextlib.AbstractContextManager[Runner]]] = {
        "wicore": lambda: open_wicore(
            config.wicore_model, config.op_flavour, gguf, config.num_prompt_tokens, num_tokens, config.threads
        ),
        "llama.cpp": lambda: open_llama_cpp(gguf, num_tokens, config.threads),
        "hf": lambda: open_hf(gguf, config.threads),
    }
    return openers[engine]()


# --------------------------------------------------------------------------- report


def markdown_table(results: list[Result]) -> str:
    reference = next((r for r in results if r.engine == REFERENCE_ENGINE), None)
    lines = [
        f"| engine | threads | prompt tok/s | decode tok/s | prompt vs {REFERENCE_ENGINE} | decode vs {REFERENCE_ENGINE} |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        prompt = f"{r.prompt_tokens_per_s / reference.prompt_tokens_per_s:.2f}x" if reference else "n/a"
        decode = f"{r.decode_tokens_per_s / reference.decode_tokens_per_s:.2f}x" if reference else "n/a"
        lines.append(
            f"| {r.engine} | {r.threads} | {r.prompt_tokens_per_s:.1f} | {r.decode_tokens_per_s:.1f} | {prompt} | {decode} |"
        )
    return "\n".join(lines)


def token_report(results: list[Result], detokenize: Callable[[Sequence[int]], str]) -> str:
    lines = []
    for r in results:
        shown = r.token_ids[:NUM_SHOWN_TOKENS]
        lines.append(f"{r.engine}: {list(shown)} {detokenize(shown)!r}")
    reference = next((r for r in results if r.engine == REFERENCE_ENGINE), results[0])
    for r in (r for r in results if r is not reference):
        n = min(len(r.token_ids), len(reference.token_ids))
        lines.append(
            f"{r.engine} vs {reference.engine}: first {num_agreeing(r.token_ids, reference.token_ids)} of {n} greedy tokens agree"
        )
    return "\n".join(lines)


def write_json(
    path: Path, config: BenchConfig, results: list[Result], skipped: dict[str, str], num_busy_before: float | None
) -> None:
    write_record(
        path,
        config,
        num_busy_cores_before=num_busy_before,
        versions={r.engine: r.version for r in results},
        results=[asdict(r) for r in results],
        skipped=skipped,
    )


# --------------------------------------------------------------------------- cli


def parse_args(argv: Sequence[str] | None) -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated, from: " + ", ".join(ENGINES))
    parser.add_argument("--threads", type=int, default=2, help="compute threads for every engine (default 2)")
    parser.add_argument("--prompt-tokens", type=int, default=512, help="prompt length in tokens, BOS included")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated after the prompt")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per engine; the median is reported")
    add_model_args(parser)
    parser.add_argument("--json", type=Path, help="also write a JSON record here")
    parser.add_argument("--show-tokens", action="store_true", help="print each engine's first greedy tokens")
    parser.add_argument(
        "--gguf",
        help="the GGUF every engine reads: a path, or a name wicore pull knows (default: the packaged Gemma 3 270M); "
        "a missing --model-dir gets its WiCore export",
    )
    args = parser.parse_args(argv)
    return BenchConfig(
        engines=tuple(e.strip() for e in args.engines.split(",") if e.strip()),
        threads=args.threads,
        num_prompt_tokens=args.prompt_tokens,
        num_new_tokens=args.new_tokens,
        num_repeats=args.repeats,
        wicore_model=args.model_dir,
        op_flavour=args.op_flavour,
        json_path=args.json,
        is_show_tokens=args.show_tokens,
        gguf=args.gguf,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_tool(argv, parse_args, run)


def run(config: BenchConfig, num_busy_before: float | None) -> int:
    """Every engine asked for, in order, then the table (and the record)."""
    if config.gguf is None:
        gguf, title = gguf_path(), "Gemma 3 270M"
    else:
        from wicore.export.pull import PULLABLE, pull

        gguf = pull(config.gguf) if config.gguf in PULLABLE else Path(config.gguf)
        title = config.gguf
    prompt_ids, detokenize = build_prompt_ids(gguf, config.num_prompt_tokens)
    skipped: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        runners = []
        for engine in config.engines:
            print(f"[{engine}] loading ...", file=sys.stderr, flush=True)
            try:
                runners.append(stack.enter_context(open_engine(engine, config, gguf)))
            except EngineUnavailable as exc:
                skipped[engine] = str(exc)
                print(f"[{engine}] skipped: {exc}", file=sys.stderr, flush=True)
        print(f"measuring {', '.join(r.engine for r in runners)}, interleaved ...", file=sys.stderr, flush=True)
        results = measure(runners, config.threads, prompt_ids, config.num_new_tokens, config.num_repeats)

    print(
        f"{title}, batch 1, {config.num_prompt_tokens} prompt tokens, {config.num_new_tokens} new tokens, "
        f"greedy, median of {config.num_repeats}\n"
    )
    print(markdown_table(results))
    for engine, reason in skipped.items():
        print(f"\n{engine} skipped: {reason}")
    if config.is_show_tokens and results:
        print()
        print(token_report(results, detokenize))
    if config.json_path is not None:
        write_json(config.json_path, config, results, skipped, num_busy_before)
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
