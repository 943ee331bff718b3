"""The float16 8-bit exports with `matmul_i8` (wicore/graph/matmul_i8.py): where MatMulI8 goes, what the
export refuses, and a tiny Gemma 3's greedy tokens on the op's CPU kernel (the CUDA kernels compute the same
arithmetic: tools/check_matmul_i8_gpu.py) against Hugging Face's in float32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_matmul_q16 import op_counts

from wicore.engine.engine import Engine, EngineConfig
from wicore.errors import WiCoreError
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.graph.manifest import Manifest
from wicore.kernels.library import DOMAIN
from wicore.types.sampling import SamplingParams


def test_the_cuda_flavour_int8_export_places_matmul_i8_when_asked(tiny_model, tmp_path):
    """Every linear layer (q|k|v, o, gate|up, down) and the head on MatMulI8, no MatMulNBits left; int8 codes and
    float32 scales a channel."""
    folder, _ = tiny_model()
    out = tmp_path / "cuda8-i8"
    config = ExportConfig(
        op_flavour="ort-quant", weight_bits=8, dtype="fp16", attention="paged", kernels="wicore", matmul_i8=True
    )
    export_model(open_source(str(folder)), out, config, progress=lambda _: None)
    counts = op_counts(out)
    layers = Manifest.read(out).config.num_layers
    assert counts[f"{DOMAIN}:MatMulI8"] == 4 * layers + 1
    assert "com.microsoft:MatMulNBits" not in counts


@pytest.mark.parametrize(
    "settings",
    [
        dict(op_flavour="ort-quant", weight_bits=8, dtype="fp16"),  # no --kernels wicore
        dict(op_flavour="ort-quant", weight_bits=8, kernels="wicore"),  # fp32: the CPU's MatMulQ graphs
        dict(dtype="fp16", attention="paged", kernels="wicore"),  # float weights
        dict(op_flavour="ort-quant", weight_bits=4, dtype="fp16", kernels="wicore"),  # 4 bits
    ],
)
def test_matmul_i8_needs_wicore_kernels_fp16_and_8_bits(settings):
    with pytest.raises(WiCoreError, match=r"^--matmul-i8 needs --kernels wicore, --dtype fp16 and --weight-bits 8$"):
        ExportConfig(matmul_i8=True, **settings)


def test_matmul_i8_and_matmul_q16_exclude_each_other():
    with pytest.raises(WiCoreError, match="choose one"):
        ExportConfig(op_flavour="ort-quant", weight_bits=8, dtype="fp16", kernels="wicore", matmul_i8=True, matmul_q16=True)


@pytest.mark.slow  # a float16 export and engine of the tiny model, and HF's greedy decoding
def test_matmul_i8_greedy_tokens_follow_hf(tiny_model, tmp_path, cpu_library, monkeypatch, reference_greedy):
    """20 prompts of 24 tokens in one batch: the prompts' rows and the 20-row decode steps take the int8 path (above
    16 rows), so every MatMulI8 of this run rounds x to int8. The random tiny model has near ties that any
    rounding flips, so the bar is its peers' (measured on the CPU kernels, 2026-11-29): the first token (the
    prompt's logits) is HF float32's on 19 of 20 prompts, as on MatMulNBits' 8-bit export (W8A16, 19; MatMulQ16
    20), and the greedy runs agree with HF for 110 of 160 tokens before they part (MatMulNBits 123, MatMulQ16
    131; one prompt at a time, decode on the weight-only GEMV: 118)."""
    monkeypatch.setenv("WICORE_CACHE", str(Path(cpu_library).parents[2]))  # where the fixture built the library
    folder, model = tiny_model()
    out = tmp_path / "i8"
    config = ExportConfig(op_flavour="ort-quant", weight_bits=8, dtype="fp16", kernels="wicore", matmul_i8=True)
    export_model(open_source(str(folder)), out, config, progress=lambda _: None)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 512, 24).tolist() for _ in range(20)]
    with Engine(EngineConfig(model_dir=out, num_threads=1, host_tier_gb=0)) as engine:
        completions = engine.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    ours = [c.token_ids for c in completions]
    theirs = [reference_greedy(model, p, 8) for p in prompts]
    first = sum(o[0] == t[0] for o, t in zip(ours, theirs))
    prefix = sum(next((i for i, (a, b) in enumerate(zip(o, t)) if a != b), 8) for o, t in zip(ours, theirs))
    assert (first, prefix) == (19, 110), (ours, theirs)
