"""GGUFs made by llama.cpp's own converter and quantizer from tiny random Llama and Qwen2 checkpoints:
WiCore's ort-quant export of each agrees with HF float32 (the checkpoint itself) for at least as many
greedy tokens as llama.cpp does on the same GGUF, on five prompts (issue 37)."""

from __future__ import annotations

from pathlib import Path

import pytest
from llama_cpp_peer import convert, converter_or_skip, llama_cpp_greedy, num_agreeing, quantize, random_checkpoint

from wicore.engine.engine import Engine, EngineConfig
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.types.sampling import SamplingParams

pytestmark = pytest.mark.slow

TEXTS = (
    "The history of the printing press",
    "Once upon a time, in a small village",
    "def fibonacci(n):",
    "The capital of France is",
    "Water boils at a temperature of",
)
NUM_TOKENS = 32
# Rows of 256: llama.cpp's K-quants (Q4_K, Q6_K) need them, else it falls back to other types.
SHAPE = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
)
# Measured 2026-11-27: HF's first token on "The history of the printing press" leads the next by 0.17
# (logits' std 1.67); WiCore's Q5_K_M export flips it, llama.cpp keeps it: [0, 1, 1, 0, 1] against
# [1, 0, 1, 0, 1] tokens equal to HF's, the same before issue 37's node cuts.
SHORT_OF_LLAMA_CPP = {("qwen2", "Q5_K_M"): "a near-tie on the first prompt's first token (0 against llama.cpp's 1)"}
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": False}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),
}


@pytest.fixture(scope="module")
def source(cache_dir: Path) -> Path:
    return converter_or_skip(cache_dir.parent)


def _init(name: str) -> tuple[float, float]:
    """Norms and biases away from their initial values, so a wrong convention shows."""
    return (1.0, 0.2) if "norm" in name else (0.0, 0.5 if name.endswith(".bias") else 0.1)


@pytest.fixture(scope="module")
def checkpoint(cache_dir: Path, hf_tokenizer_smollm2):
    """family -> (HF folder, HF model): random weights with SmolLM2's tokenizer, so the prompts are
    real text."""
    made = {}

    def make(family: str):
        if family not in made:
            folder = cache_dir / f"tiny-{family}-hf"
            made[family] = (folder, random_checkpoint(FAMILIES[family], SHAPE, hf_tokenizer_smollm2, folder, _init))
        return made[family]

    return make


def hf_greedy(model, prompts: list[list[int]]) -> list[list[int]]:
    import torch

    torch.set_num_threads(1)
    with torch.no_grad():
        return [
            model.generate(torch.tensor([p]), max_new_tokens=NUM_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)[
                0, len(p) :
            ].tolist()
            for p in prompts
        ]


@pytest.fixture(scope="module")
def prompts(hf_tokenizer_smollm2) -> list[list[int]]:
    return [hf_tokenizer_smollm2(text)["input_ids"] for text in TEXTS]


@pytest.fixture(scope="module")
def reference(checkpoint, prompts):
    """family -> HF's greedy tokens on the prompts: one reference for the family's four quants."""
    made = {}

    def make(family: str) -> list[list[int]]:
        if family not in made:
            made[family] = hf_greedy(checkpoint(family)[1], prompts)
        return made[family]

    return make


@pytest.mark.parametrize("quant", ["Q4_0", "Q8_0", "Q4_K_M", "Q5_K_M"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_ort_quant_agrees_with_hf_at_least_as_long_as_llama_cpp(
    source, checkpoint, reference, prompts, cache_dir, family, quant, request
):
    if (family, quant) in SHORT_OF_LLAMA_CPP:
        request.applymarker(pytest.mark.xfail(strict=True, reason=SHORT_OF_LLAMA_CPP[family, quant]))
    folder, _ = checkpoint(family)
    f32 = cache_dir / f"tiny-{family}-f32.gguf"
    if not f32.is_file():
        convert(source, folder, f32)
    gguf = quantize(f32, cache_dir / f"tiny-{family}-{quant}.gguf", quant)
    out = cache_dir / f"tiny-{family}-{quant}-ort-quant"
    export_model(open_source(str(gguf)), out, ExportConfig(op_flavour="ort-quant", overwrite=True), progress=lambda _: None)

    with Engine(EngineConfig(model_dir=out, num_threads=2, host_tier_gb=0)) as engine:
        ours = [c.token_ids for c in engine.generate(prompts, SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True))]
    theirs = llama_cpp_greedy(gguf, prompts, NUM_TOKENS)

    ours_agree = [num_agreeing(o, r) for o, r in zip(ours, reference(family), strict=True)]
    theirs_agree = [num_agreeing(t, r) for t, r in zip(theirs, reference(family), strict=True)]
    assert all(o >= t for o, t in zip(ours_agree, theirs_agree)), (ours_agree, theirs_agree)
