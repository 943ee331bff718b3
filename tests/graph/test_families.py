"""Every dense family through the one builder, against HF transformers on tiny random models.

Each model is saved as safetensors by transformers and exported from that folder; the prompts
are batched with different lengths and run past the sliding window where the config has one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_gemma3 import engine

from wicore.errors import UnsupportedModelError
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.types.sampling import SamplingParams

SHAPE = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)
CONFIGS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"rope_theta": 50_000.0, "tie_word_embeddings": False}),
    "llama-tied-llama3-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "tie_word_embeddings": True,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500_000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        },
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"rope_theta": 1_000_000.0}),
    "qwen2-sliding": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 1},
    ),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"rope_theta": 1_000_000.0, "tie_word_embeddings": True}),
    # every layer slides (transformers masks them all with sliding_window)
    "mistral-sliding": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 6}),
    # soft-capped attention scores and logits (caps small enough to bend them), sandwich norms, alternating windows
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            "sliding_window": 6,
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 5.0,
            "hidden_activation": "gelu_pytorch_tanh",
            "pad_token_id": 0,
        },
    ),
    # fused qkv_proj / gate_up_proj, Phi-3-mini's window on every layer
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"sliding_window": 8, "pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1}),
    # LongRoPE (Phi-3-mini-128k, Phi-3.5-mini): the 40-token prompt is past original_max_position_embeddings
    # (long factors), the others inside (short ones); the 23-token one crosses it while it generates
    "phi3-longrope": (
        "Phi3Config",
        "Phi3ForCausalLM",
        {
            "pad_token_id": 0,
            "eos_token_id": 2,
            "bos_token_id": 1,
            "original_max_position_embeddings": 32,
            "rope_scaling": {
                "type": "longrope",
                "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 13.0, 18.0],
            },
        },
    ),
    # norms after attention and MLP only, q/k norms over all heads
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {"pad_token_id": 0, "eos_token_id": 2, "bos_token_id": 1}),
    # its four multipliers
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        {"embedding_multiplier": 6.0, "residual_multiplier": 0.3, "attention_multiplier": 0.2, "logits_scaling": 4.0},
    ),
}
# weights drawn with std 0.1 (transformers' default 0.02 leaves the tiny models attending almost
# uniformly: a graph without RoPE or without the soft-cap still matched HF)
INIT = 0.1
RNG = np.random.default_rng(1)
PROMPTS = [RNG.integers(0, 512, n).tolist() for n in (23, 9, 40)]


def build(tmp: Path, name: str, export: ExportConfig | None = None, **config: object) -> tuple[Path, object]:
    """(exported folder, HF model) of one of CONFIGS (`export`: the portable fp32 export by default;
    `config`: more config settings); norms and biases drawn away from their init."""
    import torch
    import transformers

    config_class, model_class, overrides = CONFIGS[name]
    torch.manual_seed(0)
    cfg = getattr(transformers, config_class)(**{**SHAPE, "initializer_range": INIT, **overrides, **config})
    model = getattr(transformers, model_class)(cfg).eval()
    model.set_attn_implementation("eager")
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "norm" in param_name or param_name.endswith(".bias"):
                param.normal_(0.5 if "norm" in param_name else 0.0, 0.5)
    model.save_pretrained(tmp / "hf")
    export_model(open_source(str(tmp / "hf")), tmp / "model", export or ExportConfig(), progress=lambda _: None)
    return tmp / "model", model


# transformers picks LongRoPE's factors per forward, WiCore per step: a prompt past the switch in one chunk
PREFILL_CHUNK = {"phi3-longrope": 64}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_batched_logits_match_hf(tmp_path, reference_logits, name):
    folder, model = build(tmp_path, name)
    with engine(folder, prefill_chunk=PREFILL_CHUNK.get(name, 16)) as eng:
        completions = eng.generate(PROMPTS, SamplingParams(max_tokens=1, prompt_logits=True))
    for prompt, completion in zip(PROMPTS, completions, strict=True):
        assert completion.error is None
        ref = reference_logits(model, prompt)
        np.testing.assert_allclose(completion.prompt_logits, ref, atol=1e-4, rtol=0)
        assert (completion.prompt_logits.argmax(-1) == ref.argmax(-1)).all()


# phi3-longrope: transformers' Phi-3 generate drops its cache at the step that crosses
# original_max_position_embeddings and recomputes the sequence with the long factors; so does WiCore
# (Scheduler: the row is prefilled again, its first switch + 1 tokens in one chunk)
GREEDY = ("gemma2", "phi3", "phi3-longrope", "olmo2", "granite", "mistral-sliding")


@pytest.mark.slow
@pytest.mark.parametrize("name", GREEDY)
def test_greedy_text_matches_hf_generate(tmp_path, reference_greedy, name):
    folder, model = build(tmp_path, name)
    with engine(folder, prefill_chunk=PREFILL_CHUNK.get(name, 16)) as eng:
        completions = eng.generate(PROMPTS, SamplingParams(max_tokens=12, ignore_eos=True))
    for prompt, completion in zip(PROMPTS, completions, strict=True):
        assert completion.token_ids == reference_greedy(model, prompt, 12)


@pytest.mark.slow
def test_a_row_crossing_longropes_switch_leaves_the_others_alone(tmp_path, reference_greedy):
    """The 23-token prompt crosses original_max_position_embeddings (32) at its 10th token and is
    prefilled again; the 9- and 40-token rows decoding beside it keep HF's tokens, as they do alone."""
    folder, model = build(tmp_path, "phi3-longrope")
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    with engine(folder, prefill_chunk=16, enable_prefix_cache=False) as eng:  # "alone" computes its rows again
        together = eng.generate(PROMPTS, params)
        assert eng.stats().long_rope_recomputes == 1
        alone = [eng.generate([p], params)[0] for p in PROMPTS[1:]]
        assert eng.stats().long_rope_recomputes == 1  # neither crosses: the 40-token prompt starts past it
    for prompt, completion in zip(PROMPTS, together, strict=True):
        assert completion.token_ids == reference_greedy(model, prompt, 12)
    assert [c.token_ids for c in together[1:]] == [c.token_ids for c in alone]


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "falcon", "num_hidden_layers": 2}')
    with pytest.raises(
        UnsupportedModelError,
        match="model_type 'falcon' is not supported; WiCore compiles gemma3 .*gemma2.*llama.*phi3.*olmo2.*qwen3_moe.*mixtral",
    ):
        open_source(str(tmp_path))
