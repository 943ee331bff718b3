"""What sampling costs: the host sampler per row on the model's own logits, and decode throughput
of N streams that sample against the same streams decoding greedily, same engine, same run.

Greedy rows take the graph's argmax and bring no logits to the host; rows that sample bring
[vocab] float32 logits (262,144 for Gemma 3) and draw on the host (wicore/executor/sampler.py).

    PYTHONPATH=. python tools/bench_sampler.py --streams 8 --new-tokens 32 --json docs/results/sampler.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchlib import add_model_args, ensure_model, run_tool, write_record

from wicore.engine.engine import Engine, EngineConfig
from wicore.executor.sampler import Sampler
from wicore.types.sampling import SamplingParams

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The weather today is",
           "In 1492, Columbus", "My favourite food is", "Water boils at", "The quick brown fox"]  # fmt: skip
SETTINGS = {  # name -> sampling settings of an OpenAI-style request
    "greedy": {},
    "temperature 1": {"temperature": 1.0},
    "temperature 0.7, top-p 0.9": {"temperature": 0.7, "top_p": 0.9},
    "temperature 0.7, top-k 40": {"temperature": 0.7, "top_k": 40},
}


@dataclass(frozen=True)
class Config:
    model_dir: Path
    op_flavour: str
    streams: int
    new_tokens: int
    threads: int
    json_path: Path | None


def sampler_ms(engine: Engine) -> dict[str, float]:
    """Median ms of one Sampler.sample on real logit rows (every position of the prompts)."""
    rows = [c.prompt_logits for c in engine.generate(PROMPTS, SamplingParams(max_tokens=1, prompt_logits=True))]
    logits = [row for block in rows if block is not None for row in block]
    times = {}
    for name, settings in SETTINGS.items():
        sampler = Sampler(SamplingParams(seed=0, **settings))  # type: ignore[arg-type]
        samples = []
        for row in logits:
            start = time.perf_counter()
            sampler.sample(row)
            samples.append(time.perf_counter() - start)
        times[name] = 1000 * statistics.median(samples)
    return times


def decode_rates(engine: Engine, config: Config) -> dict[str, float]:
    """Generated tokens a second of `config.streams` requests together, per setting."""
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(config.streams)]
    rates = {}
    for name, settings in SETTINGS.items():
        params = SamplingParams(max_tokens=config.new_tokens, ignore_eos=True, seed=0, **settings)  # type: ignore[arg-type]
        start = time.perf_counter()
        outputs = engine.generate(prompts, params)
        rates[name] = sum(len(o.token_ids) for o in outputs) / (time.perf_counter() - start)
    return rates


def run(config: Config, busy_before: float | None) -> int:
    model_dir = ensure_model(config.model_dir, config.op_flavour)
    with Engine(EngineConfig(model_dir=model_dir, num_threads=config.threads)) as engine:
        engine.generate(PROMPTS[:2], SamplingParams(max_tokens=2))  # warm-up
        per_row = sampler_ms(engine)
        rates = decode_rates(engine, config)
    print(f"| setting | sampler ms a row | tok/s, {config.streams} streams | / greedy |\n|---|---:|---:|---:|")
    for name in SETTINGS:
        print(f"| {name} | {per_row[name]:.2f} | {rates[name]:.1f} | {rates[name] / rates['greedy']:.2f} |")
    if config.json_path is not None:
        write_record(config.json_path, config, num_busy_cores_before=busy_before, sampler_ms=per_row, tokens_per_s=rates)
    return 0


def parse_args(argv: Sequence[str] | None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--streams", type=int, default=8, help="requests decoding together")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens each request generates (ignore_eos)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    if a.streams < 1 or a.new_tokens < 1:
        raise ValueError("--streams and --new-tokens must be at least 1")
    return Config(a.model_dir, a.op_flavour, a.streams, a.new_tokens, a.threads, a.json)


if __name__ == "__main__":
    sys.exit(run_tool(None, parse_args, run))
