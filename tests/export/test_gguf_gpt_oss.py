"""gpt-oss GGUFs as llama.cpp makes them: its converter on a tiny random GptOssForCausalLM, its
quantizer to MXFP4_MOE (the experts MXFP4, ggml type 39, as the released gguf of gpt-oss-20b has
them; the other matrices Q8_0). WiCore reads the header (wicore.export.gguf_gpt_oss), the sinks,
the biases and the MXFP4 experts, dequantized exactly (every MXFP4 value is a float32); against HF
transformers run on the GGUF's own weights (gguf-py dequantizes them): prompt logits within 1e-4
on three batched prompts that route to every expert of every layer, and the same greedy tokens.

Why float and not ONNX Runtime's QMoE: its 4-bit experts are integer codes times a scale (plus a
zero point), evenly spaced; MXFP4's E2M1 values (0, 0.5, 1, 1.5, 2, 3, 4, 6, and their negatives)
are not, so no int4 code table holds them without loss.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llama_cpp_peer import convert, converter_or_skip, quantize, random_checkpoint
from moe_routing import experts_used
from test_gguf_llama_cpp import NUM_TOKENS, TEXTS, hf_greedy
from test_gguf_moe import PROMPT_TEXTS, prompt_logits
from tiny_gpt_oss import YARN

from wicore.engine.engine import Engine, EngineConfig
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.gguf import GGUFSource
from wicore.export.sources import open_source
from wicore.model.config import FULL, SLIDING
from wicore.types.sampling import SamplingParams

pytestmark = pytest.mark.slow

NUM_EXPERTS, TOP_K = 4, 2
SHAPE = dict(
    hidden_size=64,
    intermediate_size=64,  # an expert's width: whole MXFP4 blocks of 32
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)
SPEC = (
    "GptOssConfig",
    "GptOssForCausalLM",
    {
        "num_local_experts": NUM_EXPERTS,
        "num_experts_per_tok": TOP_K,
        "sliding_window": 6,  # shorter than every prompt
        "layer_types": [SLIDING, FULL],
        "rope_parameters": YARN,
        "tie_word_embeddings": False,
    },
)
# every value MXFP4 can hold, at a block's exponent 0 (E2M1)
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])


def _init(name: str) -> tuple[float, float]:
    """Norms, biases and sinks away from their init; experts and routers wide enough to route apart."""
    if "norm" in name:
        return 1.0, 0.2
    if name.endswith(("bias", "sinks")):
        return 0.0, 1.0 if name.endswith("sinks") else 0.3
    return 0.0, 0.3 if "experts" in name or "router" in name else 0.1


@pytest.fixture(scope="module")
def mxfp4(cache_dir: Path, hf_tokenizer_smollm2) -> tuple[Path, object]:
    """(the MXFP4_MOE GGUF, the HF model it was made from)."""
    source = converter_or_skip(cache_dir.parent)
    folder = cache_dir / "tiny-gpt_oss-hf"
    model = random_checkpoint(SPEC, SHAPE, hf_tokenizer_smollm2, folder, _init, "eager")
    f32 = convert(source, folder, cache_dir / "tiny-gpt_oss-f32.gguf")
    return quantize(f32, cache_dir / "tiny-gpt_oss-MXFP4_MOE.gguf", "MXFP4_MOE"), model


def hf_on_gguf_weights(model: object, path: Path) -> object:
    """A copy of the HF model whose weights are the GGUF's, dequantized by gguf-py; the experts
    stacked as transformers stacks gpt-oss's: gate_up [E, H, 2W] (gate, up interleaved), down [E, W, H]."""
    import copy

    import gguf
    import torch

    tensors = {}
    for t in gguf.GGUFReader(path).tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(int(d) for d in reversed(t.shape)))
        tensors[t.name] = torch.from_numpy(np.ascontiguousarray(w)).float()
    ours = copy.deepcopy(model)
    state = {"model.embed_tokens.weight": tensors["token_embd.weight"], "lm_head.weight": tensors["output.weight"]}
    state["model.norm.weight"] = tensors["output_norm.weight"]
    projections = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj"}
    for i in range(SHAPE["num_hidden_layers"]):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        for name, proj in projections.items():
            state[f"{p}self_attn.{proj}.weight"] = tensors[f"{b}{name}.weight"]
            state[f"{p}self_attn.{proj}.bias"] = tensors[f"{b}{name}.bias"]
        state[f"{p}self_attn.sinks"] = tensors[f"{b}attn_sinks.weight"]
        state[f"{p}input_layernorm.weight"] = tensors[f"{b}attn_norm.weight"]
        state[f"{p}post_attention_layernorm.weight"] = tensors[f"{b}post_attention_norm.weight"]
        state[f"{p}mlp.router.weight"] = tensors[f"{b}ffn_gate_inp.weight"]
        state[f"{p}mlp.router.bias"] = tensors[f"{b}ffn_gate_inp.bias"]
        gate, up = tensors[f"{b}ffn_gate_exps.weight"], tensors[f"{b}ffn_up_exps.weight"]  # [E, W, H]
        state[f"{p}mlp.experts.gate_up_proj"] = torch.stack((gate.transpose(1, 2), up.transpose(1, 2)), -1).flatten(-2)
        bias = torch.stack((tensors[f"{b}ffn_gate_exps.bias"], tensors[f"{b}ffn_up_exps.bias"]), -1).flatten(-2)
        state[f"{p}mlp.experts.gate_up_proj_bias"] = bias
        state[f"{p}mlp.experts.down_proj"] = tensors[f"{b}ffn_down_exps.weight"].transpose(1, 2)
        state[f"{p}mlp.experts.down_proj_bias"] = tensors[f"{b}ffn_down_exps.bias"]
    ours.load_state_dict(state, strict=True)  # every parameter from the GGUF
    return ours


def test_the_header_and_the_mxfp4_experts_are_read(mxfp4):
    import gguf

    path = mxfp4[0]
    source = GGUFSource(path)
    cfg = source.config
    assert (source.family.name, cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == ("gpt_oss", 4, 2, 64)
    assert (cfg.layer_types, cfg.sliding_window, cfg.swiglu_alpha, cfg.swiglu_limit) == ((SLIDING, FULL), 6, 1.702, 7.0)
    assert (cfg.rope_global.factor, cfg.rope_global.original_max_position_embeddings) == (8.0, 32)
    stored = {t.name: t for t in gguf.GGUFReader(path).tensors}
    assert stored["blk.0.ffn_gate_exps.weight"].tensor_type == gguf.GGMLQuantizationType.MXFP4
    layer = source.layer(0).tensors
    gate = np.stack([layer[f"mlp.experts.{e}.gate_proj"] for e in range(NUM_EXPERTS)])
    exact = gguf.quants.dequantize(stored["blk.0.ffn_gate_exps.weight"].data, gguf.GGMLQuantizationType.MXFP4)
    np.testing.assert_array_equal(gate, exact.reshape(gate.shape))
    # each block of 32 is E2M1 values times one power of two
    blocks = np.abs(gate.reshape(-1, 32))
    scale = blocks.max(axis=1, keepdims=True) / 6
    power = 2.0 ** np.ceil(np.log2(np.where(scale > 0, scale, 1)))
    assert np.isin(blocks / power, E2M1).all()
    assert layer["self_attn.sinks"].shape == (4,) and layer["mlp.experts.3.down_proj.bias"].shape == (64,)


def test_mxfp4_gguf_logits_and_greedy_tokens_match_hf_on_its_weights(mxfp4, cache_dir, hf_tokenizer_smollm2, reference_logits):
    path, model = mxfp4
    reference = hf_on_gguf_weights(model, path)
    prompts = [hf_tokenizer_smollm2(text)["input_ids"] for text in PROMPT_TEXTS]
    assert experts_used(reference, prompts, TOP_K) == [set(range(NUM_EXPERTS))] * SHAPE["num_hidden_layers"]
    out = cache_dir / "tiny-gpt_oss-MXFP4_MOE-portable"
    export_model(open_source(str(path)), out, ExportConfig(overwrite=True), progress=lambda _: None)
    for prompt, logits in zip(prompts, prompt_logits(out, prompts), strict=True):
        np.testing.assert_allclose(logits, reference_logits(reference, prompt), atol=1e-4, rtol=0)

    prompts = [hf_tokenizer_smollm2(text)["input_ids"] for text in TEXTS]
    with Engine(EngineConfig(model_dir=out, num_threads=2, host_tier_gb=0)) as engine:
        ours = [c.token_ids for c in engine.generate(prompts, SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True))]
    assert ours == hf_greedy(reference, prompts)
