"""The float32 CPU graphs' attention on WiCore's own kernel (`--op-flavour ort-quant
--kernels wicore`; wicore/kernels/csrc/attention_cpu.cc), beside the linear layers' wicore.MatMulQ.

A decode step of the portable attention is ~30 small nodes a layer (the KV blocks gathered, cast,
transposed and reshaped into rows, two MatMuls, the mask added, a softmax, the context transposed
back); here the new K/V are still written by ScatterND, and one node reads the pools where they lie:

    q (RoPE'd, scaled) ──────────────────────────────┐
    k, v ─► ScatterND into the pools (in place) ─► BlockAttention(q, pools, block_tables, positions,
                                                   context_lens[, window_first_block]) ─► o_proj

Full-attention layers whose RoPE caches are small (`fuses_prologue`: the tiny GGUFs, SmolLM2) take the
prologue inside the op too, wicore.BlockAttentionQKV (attention_qkv_cpu.cc), as the paged graphs' fused layers do:

    qkv ─► BlockAttentionQKV(qkv, pools, block_tables, positions, slot_mapping, past_seqlens,
                             cos / sin caches, q / k norm weights (per head; the scale in q's)) ─► o_proj
           (the split, RoPE, q's scale and the K/V write inside; the pools written in place)

which drops each layer's Split, RoPEs, Reshapes and ScatterNDs and, where no layer needs them, the shared
prologue's slot indices and RoPE tables: a tiny GGUF's decode step runs 27 nodes, not 57 (docs/PERFORMANCE.md,
issue 37). The mask is the portable graphs' (graph/shared_values.py): causal, in the context, in the window;
Gemma 2's soft-capping inside. (The library's float32 GatedActivation is not emitted: in place of the
gated MLP's Split, activation and Mul it made decode steps slower, not faster, on both models measured;
docs/PERFORMANCE.md.) Exports this graph cannot express (int8 KV, attention statistics, images, attention sinks) keep the
portable attention (`can_use`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from onnx import TensorProto

from wicore.graph import io
from wicore.graph.ops import Graph
from wicore.graph.paged_attention import rope_caches
from wicore.kernels.library import DOMAIN
from wicore.model.families import ALL_HEADS

if TYPE_CHECKING:
    from wicore.model.config import DecoderConfig

# The RoPE caches' bytes (cos and sin in float32, max_position_embeddings rows of head_dim / 2) up to which a
# full-attention layer takes BlockAttentionQKV: a tiny GGUF's 128 KB, SmolLM2's 2 MB; Gemma 3's 32 MB at 32K
# positions would add a tenth to its export, and it keeps the graph ops' RoPE, computed a step at a time.
MAX_ROPE_CACHE_BYTES = 4 << 20


def can_use(dtype: str, kv_int8: bool, attention_stats: bool, image_inputs: bool, attention_sinks: bool) -> bool:
    """Whether a float32 graph on WiCore's CPU kernels takes BlockAttention (else the portable attention)."""
    return dtype == "fp32" and not (kv_int8 or attention_stats or image_inputs or attention_sinks)


def block_attention(g: Graph, cfg: DecoderConfig, q: str, k_pool: str, v_pool: str, is_sliding: bool, name: str) -> str:
    """[b, s, num_heads * head_dim] float32: q (any [b, s, ...] layout of heads in order) over the layer's pools."""
    tables = io.WINDOW_BLOCK_TABLES if is_sliding else io.BLOCK_TABLES
    inputs = [q, k_pool, v_pool, tables, io.POSITIONS, io.CONTEXT_LENS]
    if is_sliding:
        inputs.append(io.WINDOW_FIRST_BLOCK)
    window = cfg.sliding_window if is_sliding else cfg.window_all_layers
    return g.op(
        "BlockAttention",
        inputs,
        f"{name}/BlockAttention",
        domain=DOMAIN,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        window=int(window or 0),
        softcap=float(cfg.attn_logit_softcapping or 0.0),
    )


def greedy_tokens(g: Graph, logits: str) -> str:
    """io.GREEDY_TOKENS [n] from logits [n, vocab]: each row's first largest entry, as ONNX's ArgMax gives it
    (logits without NaN), on wicore.ArgMaxRows: ONNX Runtime's ArgMax took ~75 us of a 49,152-token row,
    ~5% of a tiny model's decode step (docs/PERFORMANCE.md, issue 37)."""
    return g.op("ArgMaxRows", [logits], "/model/greedy/ArgMaxRows", out=io.GREEDY_TOKENS, domain=DOMAIN)


def fuses_prologue(cfg: DecoderConfig, is_sliding: bool) -> bool:
    """Whether a layer takes BlockAttentionQKV (module docstring): full attention (the sliding layers' window
    tables are not the ones the op reads), per-head or no q/k norms, RoPE from fixed caches (not LongRoPE's per-step
    factors) of at most MAX_ROPE_CACHE_BYTES."""
    cache_bytes = 2 * cfg.max_position_embeddings * (cfg.head_dim // 2) * 4
    return (
        not is_sliding
        and cfg.family_row.qk_norm != ALL_HEADS
        and not cfg.rope_global.is_longrope
        and cache_bytes <= MAX_ROPE_CACHE_BYTES
    )


def block_attention_qkv(
    g: Graph, cfg: DecoderConfig, qkv: str, layer: int, norms: tuple[np.ndarray, np.ndarray] | None, scale: float, name: str
) -> str:
    """[b, s, num_heads * head_dim] float32 from qkv [b, s, (heads + 2 kv_heads) * head_dim] (bias added), the new
    K/V written into layer's pools in place; `norms`: the per-head q / k norm weights (the scale in q's), `scale`
    what q is multiplied by after RoPE."""
    if not g.has_input(io.PAST_SEQLENS):
        g.input(io.PAST_SEQLENS, TensorProto.INT32, ["batch"])
    weights = ["", ""] if norms is None else [g.const(w.astype(np.float32), np.float32) for w in norms]
    out, _, _ = g.op_multi(
        "BlockAttentionQKV",
        [
            qkv,
            io.key_cache(layer),
            io.value_cache(layer),
            io.BLOCK_TABLES,
            io.POSITIONS,
            io.SLOT_MAPPING,
            io.PAST_SEQLENS,
            *rope_caches(g, cfg, cfg.rope_global, "/model/shared/global/rope", np.float32),
            *weights,
        ],
        f"{name}/BlockAttentionQKV",
        3,
        outs=[None, io.key_cache_out(layer), io.value_cache_out(layer)],
        domain=DOMAIN,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        window=int(cfg.window_all_layers or 0),
        softcap=float(cfg.attn_logit_softcapping or 0.0),
        scale=float(scale),
        epsilon=float(cfg.rms_norm_eps),
    )
    return out
