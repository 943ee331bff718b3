"""Decode steps' CPU time, WiCore against llama.cpp, one thread each, interleaved: a ratio a busy machine keeps.

On a shared 2-core VM, bench_generate's wall-clock rates at 2 threads measure the other tenants as much
as the engines: a parallel region waits for a preempted worker, and llama.cpp's spinning threads
collapse first (31 tokens in 36-147 s). With one thread both engines compute on the calling thread
(ONNX Runtime runs its kernels inline, ggml too), so that thread's CPU time (`time.thread_time`) is
the step's work, whatever else the cores run:

    prompt (--prompt-tokens random ids, the same for both)     decode steps, alternating
    WiCore: EngineCore.step() until its row decodes            [wicore step | llama.cpp eval + argmax] x --steps
    llama.cpp: eval(prompt)

WiCore's step is its engine core's (scheduler, graphs, sampling: the host's share included);
llama.cpp's is `eval([token])` and the argmax of its last logits row, as bench_generate times it.

Usage:
    PYTHONPATH=. python tools/bench_decode_cpu.py --model-dir DIR --gguf smollm2-135m-instruct
    PYTHONPATH=. python tools/bench_decode_cpu.py --model-dir DIR   # the packaged Gemma 3 270M
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from benchlib import argmax_logits, gguf_path, import_llama_cpp, run_tool, write_record
from step_timing import Config, engine_config

from wicore.engine.engine import Engine
from wicore.types.sampling import SamplingParams


@dataclass(frozen=True)
class DecodeConfig:
    model_dir: Path
    gguf: str | None
    num_prompt_tokens: int
    num_steps: int
    json_path: Path | None
    threads: int = 1  # run_tool's busy-core check; both engines run one thread

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 1 or self.num_steps < 1:
            raise ValueError("--prompt-tokens and --steps must be positive")


@dataclass
class Times:
    cpu_seconds: list[float]
    wall_seconds: list[float]

    def timed(self, step: Callable[[], object]) -> None:
        cpu, wall = time.thread_time(), time.perf_counter()
        step()
        self.cpu_seconds.append(time.thread_time() - cpu)
        self.wall_seconds.append(time.perf_counter() - wall)


def measure(config: DecodeConfig, gguf: Path) -> dict[str, Times]:
    llama_cpp = import_llama_cpp()
    prompt = np.random.default_rng(0).integers(1000, 20000, config.num_prompt_tokens).tolist()
    steps = Config((str(config.model_dir),), (1,), config.num_prompt_tokens, 1, config.num_steps, "cpu", False, None)
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=config.num_prompt_tokens + config.num_steps + 16, n_threads=1,
                          n_threads_batch=1, verbose=False)  # fmt: skip
    num_vocab = llm.n_vocab()
    times = {"wicore": Times([], []), "llama.cpp": Times([], [])}
    try:
        with Engine(engine_config(config.model_dir, 1, steps)) as engine:
            core = engine.core  # stepped here, without the engine's thread
            params = SamplingParams(max_tokens=config.num_steps + 8, ignore_eos=True)
            core.add(core.make_request(prompt, params, "decode-cpu"))
            while True:  # the prefill, then one decode step
                core.step()
                rows = core.last_step.rows
                if rows and all(len(r.token_ids) == 1 for r in rows):
                    break
            llm.eval(prompt)
            token = argmax_logits(llama_cpp, llm.ctx, -1, num_vocab)

            def llama_step() -> None:
                nonlocal token
                llm.eval([token])
                token = argmax_logits(llama_cpp, llm.ctx, -1, num_vocab)

            for _ in range(config.num_steps):
                times["wicore"].timed(core.step)
                times["llama.cpp"].timed(llama_step)
    finally:
        llm.close()
    return times


def parse_args(argv: Sequence[str] | None) -> DecodeConfig:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="an exported WiCore model of the same GGUF")
    parser.add_argument("--gguf", help="the GGUF llama.cpp reads: a path or a pulled name (default the packaged Gemma 3 270M)")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="prompt length before the timed steps")
    parser.add_argument("--steps", type=int, default=100, help="timed decode steps of each engine")
    parser.add_argument("--json", type=Path, help="also write a JSON record here")
    args = parser.parse_args(argv)
    return DecodeConfig(args.model_dir, args.gguf, args.prompt_tokens, args.steps, args.json)


def run(config: DecodeConfig, num_busy_before: float | None) -> int:
    if config.gguf is None:
        gguf = gguf_path()
    else:
        from wicore.export.pull import PULLABLE, pull

        gguf = pull(config.gguf) if config.gguf in PULLABLE else Path(config.gguf)
    times = measure(config, gguf)
    ms = {k: (1000 * statistics.median(t.cpu_seconds), 1000 * min(t.cpu_seconds), 1000 * statistics.median(t.wall_seconds))
          for k, t in times.items()}  # fmt: skip
    print(f"{gguf.name}, 1 thread, {config.num_prompt_tokens} prompt tokens, {config.num_steps} decode steps each, interleaved\n")
    print("| engine | CPU ms a token (median) | CPU ms (min) | wall ms (median) | decode vs llama.cpp (CPU median) |")
    print("|---|---:|---:|---:|---:|")
    for engine, (median, low, wall) in ms.items():
        print(f"| {engine} | {median:.2f} | {low:.2f} | {wall:.2f} | {ms['llama.cpp'][0] / median:.2f}x |")
    if config.json_path is not None:
        write_record(config.json_path, config, num_busy_cores_before=num_busy_before,
                     results={k: {"cpu_seconds": t.cpu_seconds, "wall_seconds": t.wall_seconds} for k, t in times.items()})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(run_tool(None, parse_args, run))
