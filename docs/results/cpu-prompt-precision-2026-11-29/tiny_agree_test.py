"""Ad-hoc (not committed): tiny Llama / Qwen2 GGUFs, --kernels wicore exports, greedy vs HF and llama.cpp."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from llama_cpp_peer import convert, llama_cpp_greedy, num_agreeing, quantize
from test_gguf_llama_cpp import FAMILIES, NUM_TOKENS, checkpoint, prompts, reference, source  # noqa: F401

from wicore.engine.engine import Engine, EngineConfig
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.types.sampling import SamplingParams

OUT = Path(os.environ["TINY37_OUT"])


@pytest.mark.parametrize("quant", ["Q4_K_M", "Q8_0"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_tiny(source, checkpoint, reference, prompts, cache_dir, family, quant):  # noqa: F811
    folder, _ = checkpoint(family)
    f32 = cache_dir / f"tiny-{family}-f32.gguf"
    if not f32.is_file():
        convert(source, folder, f32)
    gguf = OUT / f"tiny-{family}-{quant}.gguf"
    if not gguf.is_file():
        quantize(f32, gguf, quant)
    out = OUT / f"tiny-{family}-{quant}-wicore"
    if os.environ.get("TINY37_EXPORT", "1") == "1":
        export_model(open_source(str(gguf)), out, ExportConfig(op_flavour="ort-quant", kernels="wicore", overwrite=True), progress=lambda _: None)
    with Engine(EngineConfig(model_dir=out, num_threads=2, host_tier_gb=0)) as engine:
        ours = [c.token_ids for c in engine.generate(prompts, SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True))]
    theirs = llama_cpp_greedy(gguf, prompts, NUM_TOKENS)
    ours_agree = [num_agreeing(o, r) for o, r in zip(ours, reference(family), strict=True)]
    theirs_agree = [num_agreeing(t, r) for t, r in zip(theirs, reference(family), strict=True)]
    record = {"family": family, "quant": quant, "wicore_agree": ours_agree, "llama_cpp_agree": theirs_agree, "wicore_tokens": ours}
    tag = os.environ.get("TINY37_TAG", "base")
    (OUT / f"agree-{tag}-{family}-{quant}.json").write_text(json.dumps(record))
    print(family, quant, ours_agree, theirs_agree)
