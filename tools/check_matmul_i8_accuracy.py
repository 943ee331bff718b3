"""How much wicore.MatMulI8's rounding costs on a real model: the packaged Gemma 3 270M (its GGUF's weights)
exported in 8 bits for float16 graphs, on MatMulNBits (the GGUF's blocks, float16 x) and on MatMulI8 (int8 weights
a channel), prompt logits against Hugging Face's in float32, on the CPU kernels (the CUDA ones compute the same).

    PYTHONPATH=.:tools python3 tools/check_matmul_i8_accuracy.py --hf-state /path/to/hf-gemma3-270m-transformers-*

MatMulI8 runs twice: prompt chunks of 256 rows (int8 x above 16 rows: what a prefill and a batch of 17+ streams
take) and of 16 (every step weight-only: the weights' rounding alone). --hf-state: a folder with HF's config and
state_dict.pt (tests/cached_builds.py hf_reference writes one), or none to load the GGUF through transformers
(minutes). Prints one verify line (argmax agreement, perplexity, max |logit diff|) a run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wicore.cli.verify import VERIFY_TEXT, compare_logits, hf_logits, load_hf_model
from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler_config import SchedulerConfig
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.types.sampling import SamplingParams

SOURCE = "gemma3-270m"


def hf_model(state: Path | None) -> object:
    if state is None:
        return load_hf_model(SOURCE)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(state), dtype=torch.float32, attn_implementation="eager")
    model.load_state_dict(torch.load(state / "state_dict.pt", weights_only=True), strict=True)
    return model.eval()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hf-state", type=Path)
    p.add_argument("--work", type=Path, default=Path("/tmp/matmul-i8-accuracy"))
    p.add_argument("--tokens", type=int, default=200, help="prompt tokens (VERIFY_TEXT repeated)")
    args = p.parse_args(argv)
    model = hf_model(args.hf_state)
    ref = None
    for name, matmul_i8, chunk in [("MatMulNBits", False, 256), ("MatMulI8", True, 256), ("MatMulI8", True, 16)]:
        out = args.work / ("i8" if matmul_i8 else "nbits")
        if not (out / "wicore.json").is_file():
            config = ExportConfig(
                op_flavour="ort-quant", weight_bits=8, dtype="fp16", kernels="wicore", matmul_i8=matmul_i8, overwrite=True
            )
            export_model(open_source(SOURCE), out, config, progress=lambda _: None)
        scheduler = SchedulerConfig(prefill_chunk=chunk, max_num_batched_tokens=256)
        engine_config = EngineConfig(model_dir=out, num_threads=2, host_tier_gb=0, enable_prefix_cache=False, scheduler=scheduler)
        with Engine(engine_config) as engine:
            ids = engine.tokenizer.encode(" ".join([VERIFY_TEXT] * 8))[: args.tokens]
            (done,) = engine.generate([ids], SamplingParams(max_tokens=1, prompt_logits=True))
        ref = hf_logits(model, ids) if ref is None else ref
        print(f"{name}, prompt chunks of {chunk}: {compare_logits(done.prompt_logits, ref, ids).summary()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
