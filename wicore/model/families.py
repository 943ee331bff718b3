"""What differs between the decoder families WiCore compiles: one table, read by the sources and the builder.

Everything not in a row (paged KV pools, grouped-query attention, rotate-half RoPE, last-row
logits, the engine and the API) is the same for every family. Per-model numbers (tied embeddings,
RoPE theta and scaling, sliding windows, soft-capping values, Granite's multipliers, expert counts)
live in the config (wicore.model.config); a row says which mechanisms the family has.

| family    | norm        | MLP act   | embed x sqrt(H) | norms         | q/k norm | qkv bias | checkpoint    | experts (router)            |
|-----------|-------------|-----------|-----------------|---------------|----------|----------|---------------|-----------------------------|
| gemma3    | x * (1 + w) | gelu_tanh | yes             | pre and post  | per head | no       |               |                             |
| gemma2    | x * (1 + w) | gelu_tanh | yes             | pre and post  | no       | no       |               |                             |
| llama     | x * w       | silu      | no              | pre           | no       | no       |               |                             |
| granite   | x * w       | silu      | no              | pre           | no       | no       |               |                             |
| phi3      | x * w       | silu      | no              | pre           | no       | no       | fused qkv, gate_up |                        |
| olmo2     | x * w       | silu      | no              | post only     | all heads| no       |               |                             |
| qwen2     | x * w       | silu      | no              | pre           | no       | yes      |               |                             |
| qwen3     | x * w       | silu      | no              | pre           | per head | no       |               |                             |
| qwen3_moe | x * w       | silu      | no              | pre           | per head | no       |               | softmax, top-k (renorm: config) |
| mixtral   | x * w       | silu      | no              | pre           | no       | no       |               | softmax, top-k, renormalised |
| qwen2_moe | x * w       | silu      | no              | pre           | no       | yes      |               | softmax, top-k (renorm: config); a shared expert |
| gpt_oss   | x * w       | clamped swiglu | no         | pre           | no       | yes, o too | stacked experts | top-k, softmax (= softmax, top-k, renormalised); biases |

"pre" norms: one before attention and one before the MLP; "post": Gemma's after attention and after
the MLP (Gemma has both, OLMo 2 only the post ones). The families with pre norms only name the one
before the MLP `post_attention_layernorm` in their checkpoints, WiCore (which uses Gemma's names)
`pre_feedforward_layernorm`; `hf_names` maps them. A q/k norm "per head" normalises each head's
head_dim channels; OLMo 2's normalises the whole projection (all heads together). "fused": the
checkpoint stores q/k/v (and gate/up) as one matrix, split by rows at load (`hf_fused`).
Mixture-of-experts rows route each token to the top-k of the config's experts (wicore.graph.moe);
Qwen2-MoE adds a shared expert every token runs, scaled by sigmoid of its own one-row gate.
gpt-oss (wicore.graph.sinks, wicore.graph.clamped_swiglu, wicore.export.stacked_experts): a learned
sink logit per head in each softmax's denominator, biases on q/k/v/o, on the router and on the
experts, whose SwiGLU is clamped (`swiglu_limit`) and adds 1 to up; its checkpoints stack the
experts ([E, H, 2W], gate and up columns interleaved). Its router takes the top k of the logits
and a softmax over those: the same probabilities as a softmax over all, top k, renormalised.
Families with `gguf_architecture` None are read from Hugging Face folders only; llama.cpp's GGUFs of
Qwen3-MoE (`qwen3moe`) and Mixtral (`llama` with an expert count) stack each layer's experts in one
tensor a projection (`ffn_gate_exps` ...), split per expert by wicore.export.gguf; so do gpt-oss's
(`gpt-oss`, MXFP4 experts, its header read by wicore.export.gguf_gpt_oss).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wicore.errors import UnsupportedModelError

# q/k norms
PER_HEAD = "head"
ALL_HEADS = "proj"
# routers of the mixture-of-experts rows
SOFTMAX_TOPK = "softmax_topk"  # softmax over all experts, then the top k (renormalised where the model says)


@dataclass(frozen=True)
class Family:
    name: str
    hf_model_types: tuple[str, ...]  # config.json `model_type`s of the family
    gguf_architecture: str | None = None  # GGUF `general.architecture`; None: Hugging Face folders only
    norm_offset: float = 0.0  # RMSNorm scales by (norm_offset + w); GGUF files store the sum
    activation: str = "silu"  # the gated MLP's activation: "gelu_tanh" or "silu"
    embedding_scale: bool = False  # token embeddings are multiplied by sqrt(hidden_size)
    pre_norms: bool = True  # an RMSNorm before attention and before the MLP
    post_norms: bool = False  # an RMSNorm after attention and after the MLP (on the block's output)
    qk_norm: str = ""  # "" none, PER_HEAD or ALL_HEADS: RMSNorm of queries / keys before RoPE
    qkv_bias: bool = False  # q, k and v projections have biases
    gguf_permuted_qk: bool = False  # llama.cpp's converter interleaved the Q/K rows for its RoPE
    local_rope: bool = False  # sliding layers have a RoPE of their own (`rope_local`)
    router: str = ""  # "" dense MLP; SOFTMAX_TOPK: a mixture of experts (wicore.graph.moe)
    shared_expert: bool = False  # beside the routed experts, one every token runs, scaled by sigmoid(its gate)
    o_bias: bool = False  # the attention's output projection has a bias
    attention_sinks: bool = False  # a learned logit per head in each softmax's denominator (wicore.graph.sinks)
    moe_bias: bool = False  # the router and the experts' projections have biases
    clamped_swiglu: bool = (
        False  # experts: (clamp(up) + 1) * g * sigmoid(alpha g), g = min(gate, limit) (graph/clamped_swiglu.py)
    )
    hf_stacked_experts: bool = False  # checkpoints stack the experts (wicore.export.stacked_experts)
    # On wicore.MatMulQ, a prompt's layer projections on int8 x (llama.cpp's Q8 activations, ~1.5-2x the float
    # GEMM): only where measured to keep HF's greedy tokens (graph/quant.py; docs/PERFORMANCE.md, issue 37)
    int8_prompts: bool = False
    hf_names: dict[str, str] = field(default_factory=dict)  # WiCore's per-layer name -> the checkpoint's
    # a checkpoint tensor -> the WiCore tensors stacked in its rows, in order (Phi-3's qkv_proj)
    hf_fused: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def sandwich_norms(self) -> bool:
        """Gemma's norms both before and after each block."""
        return self.pre_norms and self.post_norms

    @property
    def is_moe(self) -> bool:
        return bool(self.router)

    def layer_norm_names(self) -> tuple[str, ...]:
        names = ["input_layernorm", "pre_feedforward_layernorm"] if self.pre_norms else []
        if self.post_norms:
            names += ["post_attention_layernorm", "post_feedforward_layernorm"]
        return tuple(names)


_PRE_MLP_NORM = {"pre_feedforward_layernorm": "post_attention_layernorm"}
_PHI3_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
_MIXTRAL_NAMES = {
    **_PRE_MLP_NORM,
    "mlp.router": "block_sparse_moe.gate",
    "mlp.experts.{e}.gate_proj": "block_sparse_moe.experts.{e}.w1",
    "mlp.experts.{e}.down_proj": "block_sparse_moe.experts.{e}.w2",
    "mlp.experts.{e}.up_proj": "block_sparse_moe.experts.{e}.w3",
}
_GEMMA = dict(norm_offset=1.0, activation="gelu_tanh", embedding_scale=True, post_norms=True)

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("gemma3", ("gemma3_text", "gemma3"), "gemma3", qk_norm=PER_HEAD, local_rope=True, int8_prompts=True, **_GEMMA),  # type: ignore[arg-type]
        Family("gemma2", ("gemma2",), **_GEMMA),  # type: ignore[arg-type]
        Family("llama", ("llama", "mistral"), "llama", gguf_permuted_qk=True, hf_names=_PRE_MLP_NORM),
        Family("granite", ("granite",), hf_names=_PRE_MLP_NORM),
        Family("phi3", ("phi3",), hf_names=_PRE_MLP_NORM, hf_fused=_PHI3_FUSED),
        Family("olmo2", ("olmo2",), pre_norms=False, post_norms=True, qk_norm=ALL_HEADS),
        Family("qwen2", ("qwen2",), "qwen2", qkv_bias=True, hf_names=_PRE_MLP_NORM),
        Family("qwen3", ("qwen3",), "qwen3", qk_norm=PER_HEAD, hf_names=_PRE_MLP_NORM),
        Family(
            "qwen3_moe",
            ("qwen3_moe",),
            "qwen3moe",
            qk_norm=PER_HEAD,
            router=SOFTMAX_TOPK,
            hf_names={**_PRE_MLP_NORM, "mlp.router": "mlp.gate"},
        ),
        # llama.cpp writes Mixtral as a `llama` GGUF whose header has an expert count (family_of_gguf)
        Family("mixtral", ("mixtral",), "llama", gguf_permuted_qk=True, router=SOFTMAX_TOPK, hf_names=_MIXTRAL_NAMES),
        Family(
            "qwen2_moe",
            ("qwen2_moe",),
            qkv_bias=True,
            router=SOFTMAX_TOPK,
            shared_expert=True,
            hf_names={**_PRE_MLP_NORM, "mlp.router": "mlp.gate"},
        ),
        Family(
            "gpt_oss",
            ("gpt_oss",),
            "gpt-oss",
            qkv_bias=True,
            o_bias=True,
            attention_sinks=True,
            router=SOFTMAX_TOPK,
            moe_bias=True,
            clamped_swiglu=True,
            hf_stacked_experts=True,
            hf_names=_PRE_MLP_NORM,
        ),
    )
}


def supported() -> str:
    """The families and their names, for error messages."""
    return "; ".join(
        f"{f.name} (config.json model_type {'/'.join(f.hf_model_types)}"
        + (f", GGUF {f.gguf_architecture})" if f.gguf_architecture else ")")
        for f in FAMILIES.values()
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


def family_of_gguf(architecture: str | None, num_experts: int = 0) -> Family:
    """The family of a GGUF `general.architecture` and its header's expert count (llama.cpp writes Llama
    and Mixtral both as `llama`); UnsupportedModelError naming the supported ones."""
    rows = [f for f in FAMILIES.values() if f.gguf_architecture is not None and architecture == f.gguf_architecture]
    for f in rows:
        if f.is_moe == (num_experts > 0):
            return f
    if rows:  # the config says what the row lacks (experts, or a dense MLP)
        return rows[0]
    raise UnsupportedModelError(f"GGUF architecture {architecture!r} is not supported; WiCore compiles {supported()}")
