"""Mixture-of-experts GGUFs made by llama.cpp's own converter and quantizer from tiny random
Qwen3-MoE and Mixtral checkpoints (issue 33): WiCore reads the stacked experts, and

- from the f32 GGUF its prompt logits meet HF float32's within 1e-4 on three batched prompts that
  route to every expert of every layer;
- its ort-quant export of the Q8_0 and Q4_K_M GGUFs agrees with HF for at least as many greedy
  tokens as llama.cpp does on the same GGUF, on five prompts: HF on the GGUF's own weights (gguf-py
  dequantizes them, transformers' GGUF loader unpermutes Mixtral's Q/K), so that what is compared is
  each engine's arithmetic; the agreement with HF float32 (the checkpoint) is printed beside it;
- on a 512-token prompt its argmax from the Q8_0 GGUF meets HF float32's at least as often as
  llama.cpp's on the same file (both printed, with HF's own on the GGUF's weights).

Why HF on the GGUF's weights for the greedy tokens: a random model over a 49,152-token vocabulary
has near-ties that the weights' quantization alone flips. On the Q8_0 Qwen3-MoE, HF float32 on
the GGUF's weights leaves HF float32 on the checkpoint at the first token of the third prompt;
WiCore stays with the former for all 32 tokens there, llama.cpp's int8 arithmetic leaves it at
once and lands, by chance, on the checkpoint's token for 16 (measured 2026-11-27).

The issue asks >= 99% there; no engine reaches it on these models: HF float32 itself, run on the
Q8_0 GGUF's weights, meets its float32 argmax at 90.6% of the 512 positions (Qwen3-MoE; 92.4%
with only the layers quantized). It is not the routing: the top 2 changes at 21 of 512 positions
(6 and 16 in the two layers), and agreement where none changed is 91%. It is the tiny random
model's logits: SmolLM2's 49,152-token vocabulary over random weights puts the top two logits
within 0.04 of each other (the median logit change Q8_0 makes) at the positions that differ
(docs/PERFORMANCE.md, "MoE GGUFs", has the numbers).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llama_cpp_peer import (
    LLAMA_CPP_THREADS,
    convert,
    converter_or_skip,
    llama_cpp_greedy,
    num_agreeing,
    open_llama,
    quantize,
    random_checkpoint,
)
from moe_routing import experts_used
from test_gguf_llama_cpp import NUM_TOKENS, TEXTS, hf_greedy

from wicore.engine.engine import Engine, EngineConfig
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.gguf import GGUFSource
from wicore.export.sources import open_source
from wicore.types.sampling import SamplingParams

pytestmark = pytest.mark.slow

NUM_EXPERTS, TOP_K = 4, 2
# Rows of 256 (hidden and expert width): llama.cpp's K-quants need them.
SHAPE = dict(
    hidden_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    num_experts_per_tok=TOP_K,
)
FAMILIES = {
    # llama.cpp renormalises every qwen3moe's top k (its GGUF has no norm_topk_prob), as the released models do
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {"num_experts": NUM_EXPERTS, "moe_intermediate_size": 256, "intermediate_size": 512, "norm_topk_prob": True},
    ),
    # written as a `llama` GGUF with an expert count
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": NUM_EXPERTS, "intermediate_size": 256}),
}
# three prompts of different lengths, batched
PROMPT_TEXTS = (
    "The history of the printing press begins in the workshops of",
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "Water",
)


@pytest.fixture(scope="module")
def source(cache_dir: Path) -> Path:
    return converter_or_skip(cache_dir.parent)


def _init(name: str) -> tuple[float, float]:
    """Norms away from their init, routers scaled up so the routing is far from uniform."""
    if "norm" in name:
        return 1.0, 0.2
    return 0.0, 0.3 if name.endswith("gate.weight") else 0.1


@pytest.fixture(scope="module")
def checkpoint(source: Path, cache_dir: Path, hf_tokenizer_smollm2):
    """family -> (f32 GGUF by llama.cpp's converter, HF model): random weights with SmolLM2's tokenizer."""
    made = {}

    def make(family: str):
        if family not in made:
            folder = cache_dir / f"tiny-{family}-hf"
            model = random_checkpoint(FAMILIES[family], SHAPE, hf_tokenizer_smollm2, folder, _init, "eager")
            f32 = cache_dir / f"tiny-{family}-f32.gguf"
            if not f32.is_file():
                convert(source, folder, f32)
            made[family] = (f32, model)
        return made[family]

    return make


def hf_on_gguf_weights(model: object, gguf: Path, family: str) -> object:
    """A copy of the HF model whose linear weights are the GGUF's, dequantized by gguf-py (the
    stacked experts as transformers 5 stacks them: gate_up [E, 2W, H], down [E, H, W])."""
    import copy

    import gguf as gguf_py
    import torch
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    heads = {"num_attention_heads": SHAPE["num_attention_heads"], "num_key_value_heads": SHAPE["num_key_value_heads"]}
    unpermute = LlamaTensorProcessor(config=heads) if family == "mixtral" else None
    tensors = {}
    for t in gguf_py.GGUFReader(gguf).tensors:
        w = gguf_py.quants.dequantize(t.data, t.tensor_type).reshape(tuple(int(d) for d in reversed(t.shape)))
        tensors[t.name] = torch.from_numpy(unpermute.process(w, t.name).weights if unpermute else w).float()
    ours = copy.deepcopy(model)
    with torch.no_grad():
        ours.model.embed_tokens.weight.copy_(tensors["token_embd.weight"])
        ours.lm_head.weight.copy_(tensors["output.weight"])
        for i, layer in enumerate(ours.model.layers):
            b = f"blk.{i}."
            for gguf_name, proj in (("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "o_proj")):
                getattr(layer.self_attn, proj).weight.copy_(tensors[f"{b}{gguf_name}.weight"])
            layer.mlp.gate.weight.copy_(tensors[f"{b}ffn_gate_inp.weight"])
            gate_up = torch.cat([tensors[f"{b}ffn_gate_exps.weight"], tensors[f"{b}ffn_up_exps.weight"]], dim=1)
            layer.mlp.experts.gate_up_proj.copy_(gate_up)
            layer.mlp.experts.down_proj.copy_(tensors[f"{b}ffn_down_exps.weight"])
    return ours


def export(gguf: Path, out: Path, op_flavour: str) -> Path:
    export_model(open_source(str(gguf)), out, ExportConfig(op_flavour=op_flavour, overwrite=True), progress=lambda _: None)
    return out


def prompt_logits(folder: Path, prompts: list[list[int]]) -> list[np.ndarray]:
    with Engine(EngineConfig(model_dir=folder, num_threads=2, host_tier_gb=0)) as engine:
        completions = engine.generate(prompts, SamplingParams(max_tokens=1, prompt_logits=True))
    assert all(c.error is None for c in completions)
    return [c.prompt_logits for c in completions]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_f32_gguf_logits_match_hf_with_every_expert_used(checkpoint, cache_dir, hf_tokenizer_smollm2, reference_logits, family):
    f32, model = checkpoint(family)
    gguf = GGUFSource(f32)
    assert (gguf.family.name, gguf.config.num_experts, gguf.config.num_experts_per_tok) == (family, NUM_EXPERTS, TOP_K)
    assert gguf.config.norm_topk_prob and gguf.config.moe_intermediate_size == 256
    prompts = [hf_tokenizer_smollm2(text)["input_ids"] for text in PROMPT_TEXTS]
    assert experts_used(model, prompts, TOP_K) == [set(range(NUM_EXPERTS))] * SHAPE["num_hidden_layers"]
    ours = prompt_logits(export(f32, cache_dir / f"tiny-{family}-f32-portable", "portable"), prompts)
    for prompt, logits in zip(prompts, ours, strict=True):
        ref = reference_logits(model, prompt)
        np.testing.assert_allclose(logits, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K_M"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_ort_quant_agrees_with_hf_at_least_as_long_as_llama_cpp(checkpoint, cache_dir, hf_tokenizer_smollm2, family, quant):
    f32, model = checkpoint(family)
    gguf = quantize(f32, cache_dir / f"tiny-{family}-{quant}.gguf", quant)
    out = export(gguf, cache_dir / f"tiny-{family}-{quant}-ort-quant", "ort-quant")

    prompts = [hf_tokenizer_smollm2(text)["input_ids"] for text in TEXTS]
    checkpoint_greedy = hf_greedy(model, prompts)
    reference = hf_greedy(hf_on_gguf_weights(model, gguf, family), prompts)
    with Engine(EngineConfig(model_dir=out, num_threads=2, host_tier_gb=0)) as engine:
        ours = [c.token_ids for c in engine.generate(prompts, SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True))]
    theirs = llama_cpp_greedy(gguf, prompts, NUM_TOKENS)

    def agreeing(outs: list[list[int]], ref: list[list[int]]) -> list[int]:
        return [num_agreeing(o, r) for o, r in zip(outs, ref, strict=True)]

    ours_agree, theirs_agree = agreeing(ours, reference), agreeing(theirs, reference)
    print(
        f"{family} {quant}: greedy tokens agreeing with HF on the GGUF's weights, WiCore {ours_agree}, "
        f"llama.cpp {theirs_agree}; with HF float32 on the checkpoint, WiCore {agreeing(ours, checkpoint_greedy)}, "
        f"llama.cpp {agreeing(theirs, checkpoint_greedy)}, HF on the GGUF's weights {agreeing(reference, checkpoint_greedy)}"
    )
    assert all(o >= t for o, t in zip(ours_agree, theirs_agree)), (ours_agree, theirs_agree)


def llama_cpp_argmax(gguf: Path, prompt: list[int]) -> np.ndarray:
    """llama.cpp's argmax at every position of one prompt (its logits of every token)."""
    llm = open_llama(gguf, n_ctx=1024, n_batch=512, n_threads=LLAMA_CPP_THREADS, logits_all=True, verbose=False)
    try:
        llm.eval(prompt)
        return np.asarray(llm.scores[: len(prompt)]).argmax(-1)
    finally:
        llm.close()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_q8_0_argmax_agrees_with_hf_on_a_512_token_prompt(checkpoint, cache_dir, reference_logits, family):
    """The Q8_0 GGUF's experts run in QMoE on their own blocks: HF float32's argmax at as many of a
    512-token prompt's positions as llama.cpp's on the same file (module doc: why not 99%)."""
    f32, model = checkpoint(family)
    gguf = quantize(f32, cache_dir / f"tiny-{family}-Q8_0.gguf", "Q8_0")
    out = export(gguf, cache_dir / f"tiny-{family}-Q8_0-ort-quant", "ort-quant")
    prompt = np.random.default_rng(2).integers(0, model.config.vocab_size, 512).tolist()
    ref = reference_logits(model, prompt).argmax(-1)
    (ours,) = prompt_logits(out, [prompt])
    agree = float((ours.argmax(-1) == ref).mean())
    theirs = float((llama_cpp_argmax(gguf, prompt) == ref).mean())
    weights_only = float((reference_logits(hf_on_gguf_weights(model, gguf, family), prompt).argmax(-1) == ref).mean())
    print(
        f"{family} Q8_0: argmax agreement with HF float32 on 512 positions, WiCore {agree:.4f}, llama.cpp {theirs:.4f}, "
        f"HF float32 on the GGUF's weights {weights_only:.4f}"
    )
    assert agree >= theirs, (agree, theirs)
