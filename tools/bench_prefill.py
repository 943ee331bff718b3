"""Prompt throughput: how fast an export prefills, against HF transformers on the same shape, and
where a prefill step's GPU time goes.

`--prompts` requests of `--input-len` random tokens, each asking one token, go to the engine's core
at once; the core steps until every one has its token, so every step is a prefill step of up to
`--batched-tokens` prompt tokens (whole prompts where they fit: `prefill_chunk` is the same budget).
Prompt tok/s is prompts x input-len over the wall time of those steps (a first pass warms up the
sessions and is not counted).

    --gpu-kernels  GPU time per kernel over one more pass (CUPTI through torch's profiler; CUDA EP):
                   the busy ms a prefill step beside its wall ms is what the host leaves idle.
    --hf FOLDER    the same prompts through HF transformers (bf16, sdpa, no cache, logits of the last
                   token only), batched to the same tokens a forward; `--hf-compiled` under
                   `torch.compile` too (the shapes are fixed, so it compiles once).

Usage (from the repository root; shape_exports.py makes the checkpoint and the export):
    PYTHONPATH=.:tools python tools/bench_prefill.py --model-dir /tmp/shapes/g27-8-block --devices cuda:0 \\
        --prompts 64 --input-len 512 --batched-tokens 2048,8192 --gpu-kernels --hf /tmp/shapes/gemma3-27b-hf-8
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from benchlib import int_list, write_record

from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.graph.manifest import Manifest
from wicore.kv.layout import choose_block_size
from wicore.types.sampling import SamplingParams

TOP_KERNELS = 14


@dataclass(frozen=True)
class Config:
    model_dirs: tuple[str, ...]
    devices: str
    prompts: int
    input_len: int
    batched_tokens: tuple[int, ...]
    gpu_kernels: bool
    hf: str | None
    hf_compiled: bool
    cuda_graphs: bool | None
    json_path: Path | None


def engine_config(model_dir: str, config: Config, budget: int) -> EngineConfig:
    block_size = choose_block_size(Manifest.read(Path(model_dir)), None)
    blocks_a_prompt = -(-(config.input_len + 1) // block_size)
    return EngineConfig(
        model_dir=Path(model_dir),
        block_size=block_size,
        num_device_blocks=1 + config.prompts * blocks_a_prompt,
        num_host_blocks=0,
        num_nvme_blocks=0,
        enable_prefix_cache=False,  # random prompts share nothing; the cache would only cost its hashing
        scheduler=SchedulerConfig(
            max_num_seqs=config.prompts, max_num_batched_tokens=budget, prefill_with_decodes=budget, prefill_chunk=budget
        ),
        devices=config.devices,
        cuda_graphs=config.cuda_graphs,
        async_scheduling=False,
    )


def prompts(vocab_size: int, config: Config, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(min(1000, vocab_size // 2), vocab_size, config.input_len).tolist() for _ in range(config.prompts)]


def prefill_pass(engine: Engine, config: Config, seed: int) -> tuple[float, list[float]]:
    """(wall s, each step's s) to give every prompt its first token."""
    core = engine.core  # stepped here, without the engine's thread
    params = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0.0)
    for i, ids in enumerate(prompts(engine.manifest.config.vocab_size, config, seed)):
        core.add(core.make_request(ids, params, f"prefill-{seed}-{i}"))
    steps, finished = [], 0
    start = time.perf_counter()
    while finished < config.prompts:
        t = time.perf_counter()
        outputs = core.step()
        steps.append(time.perf_counter() - t)
        if any(o.finish_reason == "error" for o in outputs):
            raise RuntimeError(f"a prefill failed: {next(o.error for o in outputs if o.error)}")
        finished += sum(o.finished for o in outputs)
        if len(steps) > 100 * config.prompts:
            raise RuntimeError("the prompts did not finish")
    return time.perf_counter() - start, steps


def wicore_prefill(model_dir: str, config: Config, budget: int) -> dict[str, object]:
    with Engine(engine_config(model_dir, config, budget)) as engine:
        prefill_pass(engine, config, seed=0)  # warm-up: sessions, arenas, kernels' first launches
        wall, steps = prefill_pass(engine, config, seed=1)
        record: dict[str, object] = {
            "model": model_dir,
            "flavour": engine.manifest.op_flavour,
            "batched_tokens": budget,
            "prompt_tok_s": config.prompts * config.input_len / wall,
            "steps": len(steps),
            "step_ms_median": 1000 * statistics.median(steps),
        }
        if config.gpu_kernels:
            record.update(gpu_kernels(engine, config))
    return record


def gpu_kernels(engine: Engine, config: Config) -> dict[str, object]:
    """GPU ms per kernel name over one more pass, per prefill step, and the pass's wall ms a step."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("error: --gpu-kernels needs torch with CUDA (it reads CUPTI through torch's profiler)")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        wall, steps = prefill_pass(engine, config, seed=2)
    per_kernel: Counter = Counter()
    for event in prof.key_averages():
        if event.self_device_time_total > 0:
            per_kernel[event.key[:90]] += event.self_device_time_total / 1000 / len(steps)
    return {
        "profiled_step_ms": 1000 * wall / len(steps),
        "gpu_busy_ms_a_step": sum(per_kernel.values()),
        "kernels_ms_a_step": dict(per_kernel.most_common(TOP_KERNELS)),
    }


def hf_prefill(folder: str, config: Config, budget: int, compiled: bool) -> dict[str, object]:
    """HF transformers bf16 sdpa: the prompts in forwards of budget // input-len prompts each (at most
    --prompts); the model freed and torch's cached memory handed back before the engine runs."""
    import torch

    rows = min(max(1, budget // config.input_len), config.prompts)
    wall = hf_timed(folder, config, rows, compiled)  # the model dies with that call's frame
    if compiled:
        torch._dynamo.reset()  # the compiled graphs hold the weights too
    gc.collect()
    torch.cuda.empty_cache()
    done = (config.prompts // rows) * rows
    name = "hf-compiled-bf16" if compiled else "hf-sdpa-bf16"
    return {"model": name, "batched_tokens": rows * config.input_len, "prompt_tok_s": done * config.input_len / wall}


def hf_timed(folder: str, config: Config, rows: int, compiled: bool) -> float:
    """Wall s of the prompts' full batches of `rows` (after two warm-up forwards, compiling under
    --hf-compiled: the shapes are fixed, so it compiles once)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.bfloat16, attn_implementation="sdpa", device_map="cuda"
    ).eval()
    torch.backends.cuda.enable_cudnn_sdp(False)  # as hf_peers.py: flash / memory-efficient SDPA
    ids = torch.tensor(prompts(model.config.vocab_size, config, seed=1), device="cuda")

    def forward(batch: torch.Tensor) -> torch.Tensor:
        return model(batch, use_cache=False, logits_to_keep=1).logits.argmax(-1)

    run = torch.compile(forward) if compiled else forward
    with torch.no_grad():
        for _ in range(2):  # warm-up (and compile) on the full batch shape
            run(ids[:rows])
        torch.cuda.synchronize()
        start = time.perf_counter()
        for first in range(0, config.prompts - rows + 1, rows):
            run(ids[first : first + rows])
        torch.cuda.synchronize()
        return time.perf_counter() - start


def main(config: Config) -> None:
    records = []
    if config.hf is not None:  # first: ONNX Runtime's CUDA arenas are not handed back to torch
        for budget in config.batched_tokens:
            for compiled in (False, True) if config.hf_compiled else (False,):
                records.append(hf_prefill(config.hf, config, budget, compiled))
                print_record(records[-1])
    for model_dir in config.model_dirs:
        for budget in config.batched_tokens:
            records.append(wicore_prefill(model_dir, config, budget))
            print_record(records[-1])
    if config.json_path is not None:
        write_record(config.json_path, config, records=records)


def print_record(r: dict[str, object]) -> None:
    name = Path(str(r["model"])).name
    line = f"{name} [{r['batched_tokens']} tokens a step]: {r['prompt_tok_s']:,.0f} prompt tok/s"
    if "steps" in r:
        line += f", {r['steps']} steps, {r['step_ms_median']:.2f} ms a step (median)"
    print(line, flush=True)
    if "kernels_ms_a_step" in r:
        print(f"  profiled: {r['profiled_step_ms']:.2f} ms a step, GPU busy {r['gpu_busy_ms_a_step']:.2f} ms", flush=True)
        for kernel, ms in r["kernels_ms_a_step"].items():  # type: ignore[attr-defined]
            print(f"    {ms:8.3f} ms  {kernel}", flush=True)


def parse_args(argv: list[str] | None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", action="append", type=Path, default=[], help="exported model; repeat to compare")
    p.add_argument("--devices", default="cpu", help="as wicore's --devices (default cpu)")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--batched-tokens", default="2048", help="prompt tokens a step (the scheduler's budget), comma-separated")
    p.add_argument("--gpu-kernels", action="store_true", help="also GPU time per kernel (CUDA; needs torch)")
    p.add_argument("--hf", type=Path, help="HF checkpoint of the same shape: the peer")
    p.add_argument("--hf-compiled", action="store_true", help="with --hf: also under torch.compile")
    p.add_argument("--cuda-graphs", choices=("on", "off"), help="EngineConfig.cuda_graphs (default: the engine's)")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    if not a.model_dir and a.hf is None:
        p.error("give --model-dir and / or --hf")
    if a.prompts < 1 or a.input_len < 1:
        p.error("--prompts and --input-len must be positive")
    graphs = None if a.cuda_graphs is None else a.cuda_graphs == "on"
    return Config(
        tuple(str(d) for d in a.model_dir), a.devices, a.prompts, a.input_len, int_list(a.batched_tokens), a.gpu_kernels, None if a.hf is None else str(a.hf),
        a.hf_compiled, graphs, a.json,
    )  # fmt: skip


if __name__ == "__main__":
    main(parse_args(None))
