"""Ad-hoc record (run as tests/export/test_zz_cpuk_adhoc.py, 2026-11-28 22:23 UTC): tiny Llama / Qwen2 GGUFs (llama.cpp's converter) on --kernels wicore: greedy vs HF
and llama.cpp on five prompts, and decode CPU time against llama.cpp (tools/bench_decode_cpu.py's measure)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest
from llama_cpp_peer import convert, llama_cpp_greedy, num_agreeing, quantize
from test_gguf_llama_cpp import FAMILIES, NUM_TOKENS, checkpoint, prompts, reference, source  # noqa: F401

from wicore.engine.engine import Engine, EngineConfig
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.types.sampling import SamplingParams

sys.path.insert(0, str(Path(__file__).parents[2] / "tools"))
OUT = Path("/work/wt-cpuk/docs/results/cpu-decode-prefetch-2026-11-28")


@pytest.mark.parametrize("quant", ["Q4_K_M", "Q8_0"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_tiny(source, checkpoint, reference, prompts, cache_dir, family, quant):  # noqa: F811
    import bench_decode_cpu as bd

    folder, _ = checkpoint(family)
    f32 = cache_dir / f"tiny-{family}-f32.gguf"
    if not f32.is_file():
        convert(source, folder, f32)
    gguf = quantize(f32, cache_dir / f"tiny-{family}-{quant}.gguf", quant)
    out = cache_dir / f"tiny-{family}-{quant}-wicore"
    export_model(open_source(str(gguf)), out, ExportConfig(op_flavour="ort-quant", kernels="wicore", overwrite=True), progress=lambda _: None)
    with Engine(EngineConfig(model_dir=out, num_threads=2, host_tier_gb=0)) as engine:
        ours = [c.token_ids for c in engine.generate(prompts, SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True))]
    theirs = llama_cpp_greedy(gguf, prompts, NUM_TOKENS)
    ours_agree = [num_agreeing(o, r) for o, r in zip(ours, reference(family), strict=True)]
    theirs_agree = [num_agreeing(t, r) for t, r in zip(theirs, reference(family), strict=True)]
    rounds = []
    for _ in range(3):
        times = bd.measure(bd.DecodeConfig(out, str(gguf), 128, 40, None), gguf)
        med = {k: 1000 * statistics.median(t.cpu_seconds) for k, t in times.items()}
        rounds.append({"wicore_ms": med["wicore"], "llama_cpp_ms": med["llama.cpp"], "ratio": med["llama.cpp"] / med["wicore"]})
    record = {"family": family, "quant": quant, "wicore_agree": ours_agree, "llama_cpp_agree": theirs_agree, "rounds": rounds}
    (OUT / f"tiny-{family}-{quant}.json").write_text(json.dumps(record, indent=1))
    print(record)
