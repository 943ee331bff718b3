"""The paged graphs' attention on WiCore's own kernel (`--attention paged`, `--block-attention`):
wicore.BlockAttention (wicore/kernels/csrc/attention.cu, float16 on CUDA; attention_cpu.cc, float32)
in place of ONNX Runtime's PagedAttention on some layer kinds, over the same pools in the same layout.

As ORT's op, WiCore's does the q/k norms, RoPE and the K/V write in its own prologue: one node a layer,
every input a graph input or a weight (no shape arithmetic, no small ops between the projections):

    qkv ─► BlockAttentionQKV(qkv, pools, block_tables | window_logical_tables, positions,
                             slot_mapping | window_slot_mapping, past_seqlens,
                             cos / sin caches, q / k norm weights (per head; Gemma's scale in q's)) ─► o_proj
           (the pools written in place: key_cache_out is bound to the pool)

Where the op's prologue cannot (OLMo 2's norm over the whole projection, LongRoPE's per-step factors),
the prologue is graph ops before wicore.BlockAttention, which takes q ready:

    qkv ─► Split ─► q, k: RMSNorm (whole projection, the scale in q's weight; else q × scale)
                    ─► RotaryEmbedding (the op's cos / sin caches at `positions`; LongRoPE: one row a token)
              k, v ─► ScatterND into the pools at slot_mapping (in place)
    BlockAttention(q, pools, block_tables | window_logical_tables, positions, past_seqlens + seq) ─► o_proj

The sliding layers' tables list the window group's blocks at their logical index (io.py), so the
kernel counts positions from the sequence's start and reads the window's blocks only; the lengths
come from past_seqlens on the device, so a CUDA graph captures the whole layer.

Where it goes (`DecoderBuilder.block_kinds`): "sliding" puts the sliding layers on it, where the kernel
beats ORT's FlashAttention split-KV one (docs/PERFORMANCE.md), and leaves full layers on ORT's op
(cuDNN's kernel is faster there); "all" puts every layer on it, which also runs in float32 on the CPU
(the graph structure the tests check against the portable export); FUSED (what `auto` resolves to on the
CUDA paged export with WiCore's kernels) the AUTO_KINDS whose prologue the op fuses (the sliding layers). Layers it cannot
take keep ORT's op: attention sinks, and head dims the CUDA kernel lacks in float16 graphs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from wicore.graph import io
from wicore.graph.ops import MS_DOMAIN, Graph
from wicore.graph.shared_values import SharedValues
from wicore.kernels.library import DOMAIN
from wicore.model.families import ALL_HEADS, PER_HEAD
from wicore.model.weights import LayerWeights

if TYPE_CHECKING:
    from wicore.graph.decoder import DecoderBuilder

MODES = ("off", "sliding", "all")  # `--block-attention`'s choices besides auto
# `--block-attention auto` on the CUDA paged export (ExportConfig.resolved_block_attention): the layer kinds
# AUTO_KINDS, each where BlockAttentionQKV's own prologue serves it (fuses); the graph-op prologue that
# LongRoPE's layers would take measured 0.5x ORT's op, so those keep ORT's (docs/PERFORMANCE.md).
FUSED = "fused"
# The sliding layers (H200, 27B shape at 8 layers, docs/PERFORMANCE.md): decode steps with them on the op ran
# 1.05x / 1.14x / 1.36x ORT's speed at batch 1 / 64 / 256 (2026-11-28; full layers: no faster than cuDNN's kernel
# at batch 64 and 256, so they stay on ORT's). Its prefill chunks lost end to end until they ran on tensor-core
# tiles (attention_tiles.cu): tools/gpu_block_attention_bench.sh's three cases, wicore bench throughput
# (2026-11-30, the tiles pipelined, three blocks an SM): 64 x (4,096 + 32) 1.03x / 1.01x ORT's output (two
# rounds, alternating), 256 x (512 + 256) 1.13x, 64 x (512 + 256) 1.05-1.12x (the lease before, its prefill
# slower); the 27B shape's greedy, sampled, top-k and top-p tokens equal ORT's (96 / 96 each) and its logits
# against HF float32 at 1,100 tokens argmax 1.0000; the tiny families' greedy tokens equal (72 / 72).
AUTO_KINDS: frozenset[bool] = frozenset({True})
CUDA_HEAD_DIMS = (64, 128, 256)  # the float16 kernel's (BlockAttentionCudaSupports)


def layer_kinds(mode: str) -> frozenset[bool]:
    """The layer kinds (is_sliding) a mode puts on BlockAttention (FUSED: fused_kinds narrows them per family)."""
    kinds = {"off": frozenset(), "sliding": frozenset({True}), "all": frozenset({True, False}), FUSED: AUTO_KINDS}
    if mode not in kinds:
        raise ValueError(f"block attention {mode!r}: one of {', '.join(kinds)}")
    return kinds[mode]


def fused_kinds(b: DecoderBuilder) -> frozenset[bool]:
    """Of b's layer kinds on BlockAttention, those BlockAttentionQKV's own prologue serves (FUSED)."""
    return frozenset(kind for kind in b.block_kinds if fuses(b, kind))


def takes(b: DecoderBuilder, is_sliding: bool) -> bool:
    """Whether a layer of this kind runs on BlockAttention in b's paged graphs."""
    if is_sliding not in b.block_kinds or b.family.attention_sinks:
        return False
    return b.dtype != "fp16" or b.cfg.head_dim in CUDA_HEAD_DIMS


def fuses(b: DecoderBuilder, is_sliding: bool) -> bool:
    """Whether BlockAttentionQKV's own prologue serves a layer of this kind (per-head or no q/k norms,
    RoPE from fixed caches); else graph ops before BlockAttention."""
    rope = b.cfg.rope_local if is_sliding else b.cfg.rope_global
    return b.family.qk_norm != ALL_HEADS and not rope.is_longrope


def prologue_kinds(b: DecoderBuilder) -> frozenset[bool]:
    """The layer kinds on BlockAttention with the prologue as graph ops (their shared values: the K/V
    write's indices and the context lengths, graph/paged_attention.py)."""
    return frozenset(kind for kind in b.block_kinds if not fuses(b, kind))


def attention(b: DecoderBuilder, g: Graph, layer: LayerWeights, qkv: str, shared: SharedValues, scale: float, p: str) -> str:
    """qkv [b, s, (heads + 2 kv_heads) * hd] (bias added) -> the attention output [b, s, heads * hd], the
    layer's K/V written into its pools."""
    if fuses(b, b.cfg.is_sliding(layer.index)):
        return fused_attention(b, g, layer, qkv, shared, scale, p)
    cfg, i = b.cfg, layer.index
    paged = shared.paged
    assert paged is not None and paged.scatter is not None and paged.context_lens is not None
    is_sliding = cfg.is_sliding(i)
    nh, kvh, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q, k, v = g.op_multi("Split", [qkv, g.const([nh * hd, kvh * hd, kvh * hd])], f"{p}/qkv_split", 3, axis=-1)
    if b.family.qk_norm == ALL_HEADS:  # OLMo 2: over the whole projection, the scale in q's weight
        q = b.rms_norm(g, q, layer["self_attn.q_norm"], f"{p}/q_norm", scale=scale, to=b.act_type)
        k = b.rms_norm(g, k, layer["self_attn.k_norm"], f"{p}/k_norm", to=b.act_type)
    elif b.family.qk_norm == PER_HEAD:  # Gemma 3, Qwen 3: per head, the scale in q's weight
        q = per_head_norm(b, g, q, layer["self_attn.q_norm"], nh, scale, f"{p}/q_norm")
        k = per_head_norm(b, g, k, layer["self_attn.k_norm"], kvh, 1.0, f"{p}/k_norm")
    else:
        q = g.op("Mul", [q, g.const(b.act_np_dtype(scale), b.act_np_dtype)], f"{p}/q_scale")
    rope = paged.rope[is_sliding]
    if rope is not None:
        rotary = (io.POSITIONS, *rope)
    else:  # LongRoPE: cos / sin one row a token (shared_values), the row's factors picked per step
        if shared.token_index is None:
            raise ValueError("LongRoPE in the paged graphs needs the token index (shared_values)")
        rotary = (shared.token_index, *shared.cos_sin[is_sliding])
    q = g.op("RotaryEmbedding", [q, *rotary], f"{p}/q_rope/RotaryEmbedding", domain=MS_DOMAIN, num_heads=nh)
    k = g.op("RotaryEmbedding", [k, *rotary], f"{p}/k_rope/RotaryEmbedding", domain=MS_DOMAIN, num_heads=kvh)
    heads = g.const([0, 0, kvh, hd])
    k = g.op("Reshape", [k, heads], f"{p}/k_heads")
    v = g.op("Reshape", [v, heads], f"{p}/v_heads")
    indices = paged.scatter[is_sliding]
    k_pool = g.op("ScatterND", [io.key_cache(i), indices, k], f"{p}/k_cache/ScatterND", out=io.key_cache_out(i))
    v_pool = g.op("ScatterND", [io.value_cache(i), indices, v], f"{p}/v_cache/ScatterND", out=io.value_cache_out(i))
    tables = io.WINDOW_LOGICAL_TABLES if is_sliding else io.BLOCK_TABLES
    window = cfg.sliding_window if is_sliding else cfg.window_all_layers
    return g.op(
        "BlockAttention",
        [q, k_pool, v_pool, tables, io.POSITIONS, paged.context_lens],
        f"{p}/BlockAttention",
        domain=DOMAIN,
        num_heads=nh,
        num_kv_heads=kvh,
        window=int(window or 0),
        softcap=float(cfg.attn_logit_softcapping or 0.0),
    )


def fused_attention(
    b: DecoderBuilder, g: Graph, layer: LayerWeights, qkv: str, shared: SharedValues, scale: float, p: str
) -> str:
    """One BlockAttentionQKV node: the prologue inside the op (module docstring)."""
    cfg, i = b.cfg, layer.index
    paged = shared.paged
    assert paged is not None
    is_sliding = cfg.is_sliding(i)
    rope = paged.rope[is_sliding]
    assert rope is not None  # fuses(): no LongRoPE
    weights = ["", ""]
    op_scale = scale
    if b.family.qk_norm == PER_HEAD:  # Gemma 3, Qwen 3: the scale in q's weight, Gemma's 1 + w folded in
        dtype = b.act_np_dtype
        q_w, k_w = b.norm_weight(layer["self_attn.q_norm"], scale), b.norm_weight(layer["self_attn.k_norm"])
        weights = [g.const(w.astype(dtype), dtype) for w in (q_w, k_w)]
        op_scale = 1.0
    window = cfg.sliding_window if is_sliding else cfg.window_all_layers
    out, _, _ = g.op_multi(
        "BlockAttentionQKV",
        [
            qkv,
            io.key_cache(i),
            io.value_cache(i),
            io.WINDOW_LOGICAL_TABLES if is_sliding else io.BLOCK_TABLES,
            io.POSITIONS,
            io.WINDOW_SLOT_MAPPING if is_sliding else io.SLOT_MAPPING,
            io.PAST_SEQLENS,
            *rope,
            *weights,
        ],
        f"{p}/BlockAttentionQKV",
        3,
        outs=[None, io.key_cache_out(i), io.value_cache_out(i)],
        domain=DOMAIN,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        window=int(window or 0),
        softcap=float(cfg.attn_logit_softcapping or 0.0),
        scale=float(op_scale),
        epsilon=float(cfg.rms_norm_eps),
    )
    return out


def per_head_norm(b: DecoderBuilder, g: Graph, x: str, weight: np.ndarray, heads: int, scale: float, name: str) -> str:
    """RMSNorm of each head of x [b, s, heads * hd], back in that layout."""
    hd = b.cfg.head_dim
    x = g.op("Reshape", [x, g.const([0, 0, heads, hd])], f"{name}/heads")
    x = b.rms_norm(g, x, weight, name, scale=scale, to=b.act_type)
    return g.op("Reshape", [x, g.const([0, 0, heads * hd])], f"{name}/flat")
