"""HF transformers decode peers of tools/bench_shapes.py on one GPU: bf16 sdpa with its dynamic
cache, and a static cache under torch.compile (CUDA graphs), median ms a step per batch size."""

from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path
from typing import Protocol


class StepConfig(Protocol):
    """What the peers read of bench_shapes' Config (a protocol, so this module imports no tool back)."""

    batches: tuple[int, ...]
    context: int
    steps: int


def hf_steps(folder: Path, config: StepConfig) -> dict[int, float]:
    """Median decode step ms of HF transformers (bf16, sdpa) per batch size, argmax on the GPU."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.bfloat16, attn_implementation="sdpa", device_map="cuda"
    ).eval()
    # torch 2.11 picks cuDNN's SDPA on an H100, which builds a new cuDNN plan on the host for every
    # new KV length: 5.7 ms a call, once per layer per decode step (profiled, 2026-11-24). Flash and
    # memory-efficient SDPA keep HF on the GPU's clock.
    torch.backends.cuda.enable_cudnn_sdp(False)
    times = {}
    with torch.no_grad():
        for batch in config.batches:
            ids = torch.randint(1000, model.config.vocab_size, (batch, config.context), device="cuda")
            out = model(ids, use_cache=True, logits_to_keep=1)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
            samples = []
            for i in range(3 + config.steps):
                torch.cuda.synchronize()
                start = time.perf_counter()
                token = model(token, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
                torch.cuda.synchronize()
                if i >= 3:
                    samples.append(time.perf_counter() - start)
            times[batch] = 1000 * statistics.median(samples)
            print(f"  HF {folder.name} batch {batch}: {times[batch]:.2f} ms", flush=True)
            del out, cache
            torch.cuda.empty_cache()
    del model
    torch.cuda.empty_cache()
    return times


def hf_compiled_steps(folder: Path, config: StepConfig) -> dict[int, float]:
    """Median decode step ms of HF transformers bf16 with a static cache under
    `torch.compile(mode="reduce-overhead")` (CUDA graphs), the strongest torch peer.

    transformers' StaticCache gives the sliding layers a cache that keeps a Python position counter,
    so the compiled step recompiles at every position and never records a graph. Here every layer
    gets a plain static cache instead: exact while prompt and decoded tokens stay inside the window.
    Compiled once per batch size (about a minute each at 8 layers)."""
    import torch
    from transformers import AutoModelForCausalLM, StaticCache

    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.bfloat16, attn_implementation="sdpa", device_map="cuda"
    ).eval()
    torch.backends.cuda.enable_cudnn_sdp(False)  # see hf_steps
    length = config.context + 3 + config.steps + 1
    window = getattr(model.config, "sliding_window", None)
    if window and length > window:
        raise SystemExit(f"the compiled HF peer needs context + steps <= the sliding window ({window})")
    plain = copy.deepcopy(model.config)
    plain.layer_types = ["full_attention"] * plain.num_hidden_layers
    eager = model.forward
    step = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True, dynamic=False)
    times = {}
    with torch.no_grad():
        for batch in config.batches:
            cache = StaticCache(config=plain, max_cache_len=length)
            ids = torch.randint(1000, model.config.vocab_size, (batch, config.context), device="cuda")
            positions = torch.arange(config.context, device="cuda")
            out = eager(input_ids=ids, past_key_values=cache, cache_position=positions, use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1:].argmax(-1)
            samples = []
            start_compile = time.perf_counter()
            for i in range(3 + config.steps):
                position = torch.tensor([config.context + i], device="cuda")
                torch.cuda.synchronize()
                start = time.perf_counter()
                logits = step(input_ids=token, past_key_values=cache, cache_position=position, use_cache=True).logits
                token = logits[:, -1:].argmax(-1)
                torch.cuda.synchronize()
                if i == 2:
                    print(
                        f"  HF compiled {folder.name} batch {batch}: compiled in {time.perf_counter() - start_compile:.0f} s",
                        flush=True,
                    )
                if i >= 3:
                    samples.append(time.perf_counter() - start)
            times[batch] = 1000 * statistics.median(samples)
            print(f"  HF compiled {folder.name} batch {batch}: {times[batch]:.2f} ms", flush=True)
            del out, cache, logits
            torch.cuda.empty_cache()
    del model, step
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return times
