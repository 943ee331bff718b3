"""What differs between the decoder families WiCore compiles: one table, read by the sources and the builder.

Everything not in a row (paged KV pools, grouped-query attention, rotate-half RoPE, last-row
logits, the engine and the API) is the same for every family. Per-model facts (tied embeddings,
RoPE theta and scaling, sliding window, logit softcapping) live in the config (wicore.model.config).

| family | norm          | MLP act   | embed x sqrt(H) | sandwich norms | q/k norm | qkv bias | GGUF Q/K rows |
|--------|---------------|-----------|-----------------|----------------|----------|----------|---------------|
| gemma3 | x * (1 + w)   | gelu_tanh | yes             | yes            | yes      | no       | as HF         |
| llama  | x * w         | silu      | no              | no             | no       | no       | permuted      |
| qwen2  | x * w         | silu      | no              | no             | no       | yes      | as HF         |
| qwen3  | x * w         | silu      | no              | no             | yes      | no       | as HF         |

"Sandwich norms": Gemma's post-attention and pre/post-feed-forward norms. The other families
have one norm before the MLP, which Hugging Face names `post_attention_layernorm` and WiCore
(which uses Gemma's names) `pre_feedforward_layernorm`; `hf_names` maps them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wicore.errors import UnsupportedModelError


@dataclass(frozen=True)
class Family:
    name: str
    hf_model_types: tuple[str, ...]  # config.json `model_type`s of the family
    gguf_architecture: str  # GGUF `general.architecture`
    norm_offset: float  # RMSNorm scales by (norm_offset + w); GGUF files store the sum
    activation: str  # the gated MLP's activation: "gelu_tanh" or "silu"
    embedding_scale: bool  # token embeddings are multiplied by sqrt(hidden_size)
    sandwich_norms: bool  # norms after attention and after the MLP as well as before each
    qk_norm: bool  # RMSNorm over each query / key head before RoPE
    qkv_bias: bool  # q, k and v projections have biases
    gguf_permuted_qk: bool  # llama.cpp's converter interleaved the Q/K rows for its RoPE
    local_rope: bool  # sliding layers have a RoPE of their own (`rope_local`)
    hf_names: dict[str, str] = field(default_factory=dict)  # WiCore's per-layer name -> the checkpoint's

    def layer_norm_names(self) -> tuple[str, ...]:
        names = ["input_layernorm", "pre_feedforward_layernorm"]
        if self.sandwich_norms:
            names += ["post_attention_layernorm", "post_feedforward_layernorm"]
        return tuple(names)


_PRE_MLP_NORM = {"pre_feedforward_layernorm": "post_attention_layernorm"}

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("gemma3", ("gemma3_text", "gemma3"), "gemma3", 1.0, "gelu_tanh", True, True, True, False, False, True),
        Family("llama", ("llama", "mistral"), "llama", 0.0, "silu", False, False, False, False, True, False, _PRE_MLP_NORM),
        Family("qwen2", ("qwen2",), "qwen2", 0.0, "silu", False, False, False, True, False, False, _PRE_MLP_NORM),
        Family("qwen3", ("qwen3",), "qwen3", 0.0, "silu", False, False, True, False, False, False, _PRE_MLP_NORM),
    )
}


def supported() -> str:
    """The families and their names, for error messages."""
    return "; ".join(
        f"{f.name} (config.json model_type {'/'.join(f.hf_model_types)}, GGUF {f.gguf_architecture})" for f in FAMILIES.values()
    )


def family(name: str) -> Family:
    if name not in FAMILIES:
        raise UnsupportedModelError(f"model family {name!r} is not supported; WiCore compiles {supported()}")
    return FAMILIES[name]


def family_of_model_type(model_type: str) -> Family:
    """The family of a config.json `model_type`; UnsupportedModelError naming the supported ones."""
    for f in FAMILIES.values():
        if model_type in f.hf_model_types:
            return f
    raise UnsupportedModelError(f"model_type {model_type!r} is not supported; WiCore compiles {supported()}")


def family_of_gguf(architecture: str | None) -> Family:
    """The family of a GGUF `general.architecture`; UnsupportedModelError naming the supported ones."""
    for f in FAMILIES.values():
        if architecture == f.gguf_architecture:
            return f
    raise UnsupportedModelError(f"GGUF architecture {architecture!r} is not supported; WiCore compiles {supported()}")
