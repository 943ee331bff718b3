"""The decoder's attention: one layer's grouped-query attention over the paged KV pool.

Functions of the builder (wicore.graph.decoder.DecoderBuilder: its config, family row, dtypes and
`linear` / `rms_norm`), as graph/moe.py is for the MLP. In the portable and batch-invariant graphs:

    x ─► qkv_proj (+ bias) ─► split ─► q/k RMSNorm ─► RoPE ─┬─► q  [b, kvh, s * groups, hd]
                                                          └─► k, v ─► ScatterND into the pools (in place)
    Gather(pool, block_tables) ─► (dequantize int8) ─► k, v rows [b, kvh, total, hd]
    softmax(q·kᵀ (softcapped) + mask, gpt-oss: + sinks) · v ─► [b, s, nh * hd] ─► o_proj (+ bias)

In the paged graphs one com.microsoft.PagedAttention node (graph/paged_attention.py) does the norms,
RoPE, the K/V write and the attention (OLMo 2's whole-projection norms and LongRoPE before it,
`paged_prologue`), or, on the layer kinds `--block-attention` names, graph ops and WiCore's
BlockAttention (graph/paged_block.py); the batch-invariant graphs take their two MatMuls from
graph/invariant_attention.py.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from wicore.graph import cpu_kernels, invariant_attention, io, paged_block
from wicore.graph.cpu_kernels import block_attention
from wicore.graph.kv_quant import dequantize_kv, quantize_kv
from wicore.graph.ops import MS_DOMAIN, Graph, block_mass, rotary
from wicore.graph.paged_attention import paged_attention
from wicore.graph.shared_values import SharedValues
from wicore.graph.sinks import softmax_with_sinks
from wicore.model.families import ALL_HEADS, PER_HEAD
from wicore.model.quant import BlockQuant, QuantizedTensor
from wicore.model.weights import LayerWeights

if TYPE_CHECKING:
    from wicore.graph.decoder import DecoderBuilder


def rope(b: DecoderBuilder, g: Graph, x: str, shared: SharedValues, is_sliding: bool, heads: int, name: str) -> str:
    """Rotate-half RoPE on [b, s, heads, head_dim] at the rows' positions (graph/ops.py rotary)."""
    cos, sin = shared.cos_sin[is_sliding]
    return rotary(g, x, cos, sin, shared.token_index, heads, b.cfg.head_dim, b.contrib, name)


def layer_attention(
    b: DecoderBuilder, g: Graph, layer: LayerWeights, x: str, shared: SharedValues, masses: list[str] | None
) -> str:
    """Paged grouped-query attention of one layer; returns [b, s, hidden] before the post-norm.
    With `masses`, a full-attention layer appends its attention mass per block [b, max_blocks]."""
    cfg, i = b.cfg, layer.index
    p = f"/model/layers.{i}/attn"
    nh, kvh, hd, groups = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_groups
    is_sliding = cfg.is_sliding(i)

    q_proj = layer["self_attn.q_proj"]
    scale = cfg.query_pre_attn_scalar**-0.5
    # The contrib path without q/k norms folds the attention scale into q_proj where that is exact.
    q_scaled = b.contrib and not b.paged and not b.family.qk_norm and is_power_of_two(scale)
    if q_scaled:
        q_proj = scaled_weight(q_proj, scale)
    qkv = b.linear(g, x, [q_proj, layer["self_attn.k_proj"], layer["self_attn.v_proj"]], f"{p}/qkv_proj")
    if b.family.qkv_bias:
        biases = [layer[f"self_attn.{n}_proj.bias"] for n in "qkv"]
        if q_scaled:
            biases[0] = biases[0] * np.float32(scale)
        bias_type = b.act_np_dtype
        bias = g.const(np.concatenate(biases).astype(bias_type), bias_type)
        qkv = g.op("Add", [qkv, bias], f"{p}/qkv_bias")
    if b.cpu_attention and cpu_kernels.fuses_prologue(cfg, is_sliding):  # the prologue in the op too
        norms = None
        if b.family.qk_norm == PER_HEAD:  # the scale in q's weight, Gemma's 1 + w folded in
            norms = (b.norm_weight(layer["self_attn.q_norm"], scale), b.norm_weight(layer["self_attn.k_norm"]))
        op_scale = 1.0 if norms is not None or q_scaled else scale
        return o_proj(b, g, layer, cpu_kernels.block_attention_qkv(g, cfg, qkv, i, norms, op_scale, p), p)
    if shared.paged is not None and paged_block.takes(b, is_sliding):  # WiCore's kernel (graph/paged_block.py)
        return o_proj(b, g, layer, paged_block.attention(b, g, layer, qkv, shared, scale, p), p)
    if shared.paged is not None:  # one op: q/k norms, RoPE, the K/V write and the attention
        norms = None
        if b.family.qk_norm == PER_HEAD and not b.webgpu_paged:  # Gemma's attention scale folded into the q-norm weight
            norms = (b.norm_weight(layer["self_attn.q_norm"], scale), b.norm_weight(layer["self_attn.k_norm"]))
        elif b.family.qk_norm or shared.paged.rope[is_sliding] is None:  # (the WebGPU EP's op has no q/k norms)
            qkv = paged_prologue(b, g, layer, qkv, shared, scale, p)
        sinks = layer["self_attn.sinks"] if b.family.attention_sinks else None
        op_scale = 1.0 if b.family.qk_norm else scale  # a q norm took it
        out = paged_attention(g, cfg, i, qkv, shared.paged, p, norms, scale=op_scale, sinks=sinks)
        if shared.paged.hidden_shape:
            return o_proj(b, g, layer, out, p)
        # [tokens, hidden] back to x's [b, s, hidden] by x's shape: no shape arithmetic (paged_values)
        return g.op("Reshape", [o_proj(b, g, layer, out, p), g.op("Shape", [x], f"{p}/hidden_shape")], f"{p}/rows")

    q, k, v = g.op_multi("Split", [qkv, g.const([nh * hd, kvh * hd, kvh * hd])], f"{p}/qkv_split", 3, axis=-1)
    if b.family.qk_norm == ALL_HEADS:  # OLMo 2: over every head's channels together, before the split into heads
        q = b.rms_norm(g, q, layer["self_attn.q_norm"], f"{p}/q_norm", scale=scale)
        k = b.rms_norm(g, k, layer["self_attn.k_norm"], f"{p}/k_norm")
    if b.contrib and b.family.qk_norm != PER_HEAD:  # RotaryEmbedding on the projections as they come
        q, k = flat_rope(b, g, q, k, shared, is_sliding, scale if not b.family.qk_norm and not q_scaled else None, p)
    else:
        q = g.op("Reshape", [q, g.const([0, 0, nh, hd])], f"{p}/q_heads")
        k = g.op("Reshape", [k, g.const([0, 0, kvh, hd])], f"{p}/k_heads")
        if b.family.qk_norm == PER_HEAD:
            q = b.rms_norm(g, q, layer["self_attn.q_norm"], f"{p}/q_norm", scale=scale)
            k = b.rms_norm(g, k, layer["self_attn.k_norm"], f"{p}/k_norm")
        elif b.family.qk_norm != ALL_HEADS:  # (the whole-projection q norm above took the scale)
            q = g.op("Mul", [q, g.const(np.float32(scale), np.float32)], f"{p}/q_scale")
        q = rope(b, g, q, shared, is_sliding, nh, f"{p}/q_rope")
        k = rope(b, g, k, shared, is_sliding, kvh, f"{p}/k_rope")
    v = g.op("Reshape", [v, g.const([0, 0, kvh, hd])], f"{p}/v_heads")

    # Write the new tokens' K/V into the KV buffers, then read the rows' blocks back.
    indices = shared.scatter_indices[is_sliding]
    k_pool = scatter(b, g, io.key_cache(i), k, indices, f"{p}/k_cache", io.key_cache_out(i))
    v_pool = scatter(b, g, io.value_cache(i), v, indices, f"{p}/v_cache", io.value_cache_out(i))
    if b.cpu_attention:  # one node over the pools where they lie (graph/cpu_kernels.py)
        return o_proj(b, g, layer, block_attention(g, cfg, q, k_pool, v_pool, is_sliding, p), p)
    tables = shared.block_tables[is_sliding]
    k_all = read_kv(b, g, g.op("Gather", [k_pool, tables], f"{p}/k_gather", axis=0), f"{p}/k_gather")
    v_all = read_kv(b, g, g.op("Gather", [v_pool, tables], f"{p}/v_gather", axis=0), f"{p}/v_gather")

    # Queries of one KV head in rows (position, group member), keys and values in rows of
    # positions: [b, kvh, s * groups, hd] and [b, kvh, total, hd].
    q = g.op("Reshape", [q, g.const([0, 0, kvh, groups, hd])], f"{p}/q_groups")
    q = g.op("Reshape", [kv_major(b, g, q, [0, 2, 1, 3, 4], f"{p}/q_T"), g.const([0, kvh, -1, hd])], f"{p}/q_rows")
    k_rows = g.op("Reshape", [kv_major(b, g, k_all, [0, 3, 1, 2, 4], f"{p}/k_T"), g.const([0, kvh, -1, hd])], f"{p}/k_rows")
    v_rows = g.op("Reshape", [kv_major(b, g, v_all, [0, 3, 1, 2, 4], f"{p}/v_T"), g.const([0, kvh, -1, hd])], f"{p}/v_rows")
    if b.batch_invariant:
        scores = invariant_attention.scores(g, q, k_rows, groups, hd, f"{p}/scores")
    else:
        k_t = g.op("Transpose", [k_rows], f"{p}/k_rows_T", perm=[0, 1, 3, 2])  # fused into the MatMul by ORT
        scores = g.op("MatMul", [q, k_t], f"{p}/scores")  # [b, kvh, s * groups, total]
    if cfg.attn_logit_softcapping:  # Gemma 2: cap * tanh(scores / cap), before the mask
        scores = softcap(g, scores, cfg.attn_logit_softcapping, f"{p}/softcap")
    masked = g.op("Add", [scores, shared.masks[is_sliding]], f"{p}/masked")
    if b.family.attention_sinks:  # gpt-oss: each head's sink in the denominator
        probs = softmax_with_sinks(g, masked, layer["self_attn.sinks"], kvh, groups, f"{p}/sinks")
    else:
        probs = g.op("Softmax", [masked], f"{p}/Softmax", axis=-1)
    if masses is not None and not is_sliding:
        masses.append(block_mass(g, probs, shared.block_shape, f"{p}/block_mass"))
    if b.batch_invariant:
        out = invariant_attention.context(g, probs, v_rows, groups, hd, f"{p}/context")
    else:
        out = g.op("MatMul", [probs, v_rows], f"{p}/context")  # [b, kvh, s * groups, hd]
    out = g.op("Reshape", [out, g.const([0, kvh, -1, groups, hd])], f"{p}/context_groups")
    out = kv_major(b, g, out, [0, 2, 1, 3, 4], f"{p}/context_T")  # [b, s, kvh, groups, hd]
    out = g.op("Reshape", [out, g.const([0, -1, nh * hd])], f"{p}/context_flat")
    return o_proj(b, g, layer, out, p)


def paged_prologue(b: DecoderBuilder, g: Graph, layer: LayerWeights, qkv: str, shared: SharedValues, scale: float, p: str) -> str:
    """What the paged op's own prologue cannot do, done before it, q, k and v then packed again for the op:
    OLMo 2's q/k norms over the whole projection (the attention scale in the q norm's weight), in the
    webgpu flavour any q/k norms (the WebGPU EP's op takes no norm weights), and LongRoPE's rotation
    (its factors picked per row and step: shared_values' rows, one a token).

        qkv ─► Split ─► q, k ─► RMSNorm (all heads) ─► RotaryEmbedding (LongRoPE) ─► Concat(q, k, v) ─► op
    """
    cfg, is_sliding = b.cfg, b.cfg.is_sliding(layer.index)
    nh, kvh, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q, k, v = g.op_multi("Split", [qkv, g.const([nh * hd, kvh * hd, kvh * hd])], f"{p}/qkv_split", 3, axis=-1)
    act = b.act_type
    if b.family.qk_norm == ALL_HEADS:
        q = b.rms_norm(g, q, layer["self_attn.q_norm"], f"{p}/q_norm", scale=scale, to=act, x_type=act)
        k = b.rms_norm(g, k, layer["self_attn.k_norm"], f"{p}/k_norm", to=act, x_type=act)
    elif b.family.qk_norm == PER_HEAD:  # the webgpu flavour's: norms over each head's channels, in heads
        q = g.op("Reshape", [q, g.const([0, 0, nh, hd])], f"{p}/q_heads")
        k = g.op("Reshape", [k, g.const([0, 0, kvh, hd])], f"{p}/k_heads")
        q = b.rms_norm(g, q, layer["self_attn.q_norm"], f"{p}/q_norm", scale=scale, to=act, x_type=act)
        k = b.rms_norm(g, k, layer["self_attn.k_norm"], f"{p}/k_norm", to=act, x_type=act)
        q = g.op("Reshape", [q, g.const([0, 0, nh * hd])], f"{p}/q_flat")
        k = g.op("Reshape", [k, g.const([0, 0, kvh * hd])], f"{p}/k_flat")
    assert shared.paged is not None
    if shared.paged.rope[is_sliding] is None:  # the op does not rotate these layers
        if shared.token_index is None:
            raise ValueError("LongRoPE in the paged graphs needs the token index (shared_values)")
        cos, sin = shared.cos_sin[is_sliding]
        rotary = (shared.token_index, cos, sin)
        q = g.op("RotaryEmbedding", [q, *rotary], f"{p}/q_rope/RotaryEmbedding", domain=MS_DOMAIN, num_heads=nh)
        k = g.op("RotaryEmbedding", [k, *rotary], f"{p}/k_rope/RotaryEmbedding", domain=MS_DOMAIN, num_heads=kvh)
    return g.op("Concat", [q, k, v], f"{p}/qkv_packed_again", axis=-1)


def flat_rope(
    b: DecoderBuilder, g: Graph, q: str, k: str, shared: SharedValues, is_sliding: bool, scale: float | None, p: str
) -> tuple[str, str]:
    """RoPE on q [b, s, nh * hd] and k [b, s, kvh * hd] as the qkv split gives them (com.microsoft
    RotaryEmbedding takes that layout): q comes back flat (the query grouping reshapes it), k in
    heads [b, s, kvh, hd] for the pool. `scale`: q's attention scale, where q_proj has not taken it."""
    cfg = b.cfg
    cos, sin = shared.cos_sin[is_sliding]
    if shared.token_index is None:
        raise ValueError("the contrib RotaryEmbedding needs the token index (shared_values with contrib)")
    if scale is not None:
        q = g.op("Mul", [q, g.const(np.float32(scale), np.float32)], f"{p}/q_scale")
    rotary_inputs = (shared.token_index, cos, sin)
    q = g.op("RotaryEmbedding", [q, *rotary_inputs], f"{p}/q_rope/RotaryEmbedding", domain=MS_DOMAIN, num_heads=cfg.num_heads)
    k = g.op("RotaryEmbedding", [k, *rotary_inputs], f"{p}/k_rope/RotaryEmbedding", domain=MS_DOMAIN, num_heads=cfg.num_kv_heads)
    return q, g.op("Reshape", [k, g.const([0, 0, cfg.num_kv_heads, cfg.head_dim])], f"{p}/k_heads")


def is_power_of_two(x: float) -> bool:
    """Whether multiplying by x is exact in floating point (barring overflow and subnormals)."""
    mantissa, _ = math.frexp(x)
    return x > 0 and mantissa == 0.5


def scaled_weight(weight: np.ndarray, factor: float) -> np.ndarray:
    """weight * factor, a power of two: a GGUF source's blocks keep their codes, their scales and offsets
    scaled (exactly), so the ort-quant flavour still transcodes them without loss."""
    blocks = getattr(weight, "blocks", None)
    values = (weight * np.float32(factor)).astype(weight.dtype, copy=False)
    if blocks is None:
        return values
    offsets = None if blocks.offsets is None else blocks.offsets * np.float32(factor)
    scaled = BlockQuant(blocks.codes, blocks.scales * np.float32(factor), offsets, blocks.bits, blocks.block_size)
    return QuantizedTensor(values, lambda: scaled)


def o_proj(b: DecoderBuilder, g: Graph, layer: LayerWeights, out: str, p: str) -> str:
    """The attention's output projection (and its bias, where the family has one), Granite's residual
    multiplier folded into its weight."""
    y = b.linear(g, out, [b.residual_scaled(layer["self_attn.o_proj"])], f"{p}/o_proj")
    if not b.family.o_bias:
        return y
    bias_type = b.act_np_dtype
    bias = g.const(b.residual_scaled(layer["self_attn.o_proj.bias"]).astype(bias_type), bias_type)
    return g.op("Add", [y, bias], f"{p}/o_proj/bias")


def kv_major(b: DecoderBuilder, g: Graph, x: str, perm: list[int], name: str) -> str:
    """Transpose that brings the KV-head axis forward. With one KV head (MQA, as Gemma 3 270M
    and 1B) the order of the elements is already right and the Reshapes around it suffice:
    no node, where ONNX Runtime would copy the tensor."""
    return x if b.cfg.num_kv_heads == 1 else g.op("Transpose", [x], name, perm=perm)


def scatter(b: DecoderBuilder, g: Graph, pool: str, update: str, indices: str, name: str, out: str) -> str:
    """ScatterND of the new tokens' K or V into the KV buffer; its output is the graph output `out`."""
    if b.kv_int8:
        update = quantize_kv(g, update, b.cfg.head_dim, f"{name}/quantize")
    elif b.dtype != "fp32":
        update = g.op("Cast", [update], f"{name}/Cast", to=b.onnx_dtype)
    return g.op("ScatterND", [pool, indices, update], f"{name}/ScatterND", out=out)


def read_kv(b: DecoderBuilder, g: Graph, blocks: str, name: str) -> str:
    """Gathered KV blocks in float32 (int8 ones dequantized)."""
    return dequantize_kv(g, blocks, b.cfg.head_dim, name) if b.kv_int8 else b.to_f32(g, blocks, name)


def softcap(g: Graph, x: str, cap: float, name: str, out: str | None = None) -> str:
    """cap * tanh(x / cap) in float32 (Gemma's logit and attention soft-capping)."""
    x = g.op("Div", [x, g.const(np.float32(cap), np.float32)], f"{name}_div")
    x = g.op("Tanh", [x], f"{name}_tanh")
    return g.op("Mul", [x, g.const(np.float32(cap), np.float32)], name, out=out)
