"""Values a decoder partition computes once per run from its paging inputs, shared by all its layers.

Scatter indices of the new tokens' K/V, the additive attention masks of the full-attention and the
sliding layers (their block groups differ), and RoPE's cos / sin. With `contrib` (the ort-quant
and webgpu flavours) cos / sin come one row per token for com.microsoft RotaryEmbedding. With
`index_int32` (the webgpu flavour) the arithmetic on positions and slots is int32 (graph/fused_ops.py
says why and what stays int64).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto

from wicore.graph import io
from wicore.graph.fused_ops import IndexMath
from wicore.graph.ops import Graph
from wicore.graph.paged_attention import PagedValues, paged_values
from wicore.model.config import DecoderConfig, RopeConfig


@dataclass(frozen=True)
class SharedValues:
    """Values computed once per partition from the paging inputs and shared by all layers,
    keyed by is_sliding where full-attention and sliding layers differ (their block groups)."""

    positions: str
    block_tables: dict[bool, str]  # [batch, blocks] of the layer kind's group
    scatter_indices: dict[bool, str]  # [batch, seq, 2]: (block, offset) of each new token
    cos_sin: dict[bool, tuple[str, str]]  # cos, sin [batch, seq, 1, head_dim / 2]; [batch * seq, head_dim / 2] with contrib ops
    masks: dict[bool, str]  # additive mask [batch, 1, seq * groups, blocks * block_size]
    block_shape: str  # [0, -1, block_size]: Reshape target of [batch, total] to [batch, blocks, block_size]
    zeros_mass: str | None = None  # [batch, max_blocks] zeros: attention mass of a partition without full layers
    token_index: str | None = None  # contrib ops: flat index of each token [batch, seq], RotaryEmbedding's position_ids
    paged: PagedValues | None = None  # the paged attention's inputs (then no masks, tables or scatter indices)


def shared_values(
    g: Graph,
    cfg: DecoderConfig,
    start: int,
    stop: int,
    attention_stats: bool = False,
    contrib: bool = False,
    paged: bool = False,
    image_spans: bool = False,
    index_int32: bool = False,
    block_kinds: frozenset[bool] = frozenset(),
    dtype: int = TensorProto.FLOAT16,
) -> SharedValues:
    """Inputs every partition takes and what the layers share: scatter indices, RoPE, masks.

    `block_kinds` and `dtype` (paged graphs): the layer kinds on WiCore's BlockAttention
    (graph/paged_block.py) and the graphs' float type (float32: every layer on it, for the CPU).

    Key index j of a full layer's gathered cache is the token at position j of the row
    (block_tables list all its blocks in order). A sliding layer's window table starts at
    logical block `window_first_block`, so its key j is at position first * block_size + j.
    A query at position p sees the key at position k when

        k <= p  and  k < context_len             (causal, within the row)
        k >  p - sliding_window                  (sliding layers; every layer with window_all_layers)

    With `image_spans` the first condition is k < attend_until[p] (wicore.graph.io, "Images"):
    p + 1 for text, the end of its image for an image token, as HF's Gemma 3 masks: causal or
    within one image, and (sliding layers) in the window.
    """
    i64 = TensorProto.INT64
    ix = IndexMath(g, index_int32)
    if start == stop:
        raise ValueError("a partition needs at least one layer")
    kinds = sorted({cfg.is_sliding(i) for i in range(start, stop)})
    positions = g.input(io.POSITIONS, i64, ["batch", "seq"])
    p = "/model/shared"
    if paged:  # the op takes the paging inputs itself, and applies RoPE from its own caches
        float_type = onnx.helper.tensor_dtype_to_np_dtype(dtype).type
        values = paged_values(g, cfg, kinds, positions, block_kinds, io.key_cache(start), float_type, webgpu=index_int32)
        # except LongRoPE's, whose factors a row picks per step: one float16 row a token for RotaryEmbedding
        cos_sin = {
            is_sliding: rope_tables(g, cfg, positions, rope, _rope_name(is_sliding), contrib=True, to=dtype)
            for is_sliding in kinds
            if values.rope[is_sliding] is None
            for rope in [cfg.rope_local if is_sliding else cfg.rope_global]
        }
        token_index = _token_index(g, positions, ix) if cos_sin else None
        return SharedValues(positions, {}, {}, cos_sin, {}, "", token_index=token_index, paged=values)
    pool = io.key_cache(start)  # any pool of this partition gives the block size
    block_size_shape = g.op("Gather", [g.op("Shape", [pool], f"{p}/pool_shape"), g.const(1)], f"{p}/block_size")
    inputs = {  # int64, as fed (shapes of the block tables read from these)
        "positions": positions,
        "slots": g.input(io.SLOT_MAPPING, i64, ["batch", "seq"]),
        "tables": g.input(io.BLOCK_TABLES, i64, ["batch", "max_blocks"]),
        "lens": g.input(io.CONTEXT_LENS, i64, ["batch"]),
        "block_size": block_size_shape,
    }
    if True in kinds:
        inputs["window_slots"] = g.input(io.WINDOW_SLOT_MAPPING, i64, ["batch", "seq"])
        inputs["window_tables"] = g.input(io.WINDOW_BLOCK_TABLES, i64, ["batch", "max_window_blocks"])
        inputs["window_first"] = g.input(io.WINDOW_FIRST_BLOCK, i64, ["batch"])
    if image_spans:
        inputs["until"] = g.input(io.ATTEND_UNTIL, i64, ["batch", "seq"])
    index = ix.indices(inputs, f"{p}/index")  # in the index type
    slots = {False: index["slots"]}
    tables = {False: index["tables"]}
    if True in kinds:
        slots[True], tables[True], first = index["window_slots"], index["window_tables"], index["window_first"]
    lens, block_size, index_positions = index["lens"], index["block_size"], index["positions"]
    q_pos = g.op("Unsqueeze", [index_positions, g.const([-1])], f"{p}/q_pos")  # [b, s, 1]
    q_until = None  # [b, s, 1]: attend_until
    if image_spans:
        q_until = g.op("Unsqueeze", [index["until"], g.const([-1])], f"{p}/q_until")
    ctx = g.op("Unsqueeze", [lens, g.const([1, 2])], f"{p}/ctx")  # [b, 1, 1]

    scatter, masks, cos_sin = {}, {}, {}
    for is_sliding in kinds:
        name = "sliding" if is_sliding else "global"
        q = f"{p}/{name}"
        block = g.op("Div", [slots[is_sliding], block_size], f"{q}/slot_block")
        offset = ix.remainder(slots[is_sliding], block, block_size, f"{q}/slot_offset")
        block_offset = g.op(
            "Concat",
            [
                g.op("Unsqueeze", [block, g.const([-1])], f"{q}/block_u"),
                g.op("Unsqueeze", [offset, g.const([-1])], f"{q}/offset_u"),
            ],
            f"{q}/scatter_indices",
            axis=-1,
        )
        scatter[is_sliding] = ix.int64(block_offset, f"{q}/scatter_indices")  # ScatterND's indices
        table_input = inputs["window_tables" if is_sliding else "tables"]
        num_blocks = g.op("Gather", [g.op("Shape", [table_input], f"{q}/tables_shape"), g.const(1)], f"{q}/num_blocks")
        total = g.op("Mul", [num_blocks, block_size_shape], f"{q}/total")
        keys = g.op("Range", [ix.const(0), ix.index(total, f"{q}/total"), ix.const(1)], f"{q}/key_index")  # [total]
        if is_sliding:  # -> positions [b, 1, total]
            first_position = g.op("Mul", [first, block_size], f"{q}/first_position")
            first_u = g.op("Unsqueeze", [first_position, g.const([1, 2])], f"{q}/first_u")
            keys = g.op("Add", [keys, first_u], f"{q}/key_position")
        if q_until is None:
            causal = g.op("LessOrEqual", [keys, q_pos], f"{q}/causal")
        else:  # causal, or within the query's image
            causal = g.op("Less", [keys, q_until], f"{q}/causal_or_image")
        visible = g.op("And", [causal, g.op("Less", [keys, ctx], f"{q}/in_context")], f"{q}/visible")
        window = cfg.sliding_window if is_sliding else cfg.window_all_layers
        if window:
            window_start = g.op("Sub", [q_pos, ix.const(window)], f"{q}/window_start")
            visible = g.op("And", [visible, g.op("Greater", [keys, window_start], f"{q}/in_window")], f"{q}/visible_window")
        mask = g.op(
            "Where",
            [visible, g.const(0.0, np.float32), g.const(np.finfo(np.float32).min, np.float32)],
            f"{q}/mask",
        )
        masks[is_sliding] = group_mask(g, cfg, mask, total, f"{q}/mask")
        rope = cfg.rope_local if is_sliding else cfg.rope_global
        cos_sin[is_sliding] = rope_tables(g, cfg, index_positions, rope, _rope_name(is_sliding), contrib, index_type=ix.np_type)
    block_shape = g.op(
        "Concat",
        [g.const([0, -1]), g.op("Unsqueeze", [block_size_shape, g.const([0])], f"{p}/block_size_1d")],
        f"{p}/block_shape",
        axis=0,
    )
    zeros_mass = None
    if attention_stats and False not in kinds:
        shape = g.op("Shape", [inputs["tables"]], f"{p}/mass_shape")
        zeros_mass = g.op(
            "ConstantOfShape", [shape], f"{p}/zero_mass", value=onnx.helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0])
        )
    token_index = _token_index(g, positions, ix) if contrib else None
    return SharedValues(positions, tables, scatter, cos_sin, masks, block_shape, zeros_mass, token_index)


def _rope_name(is_sliding: bool) -> str:
    return f"/model/shared/rope_{'sliding' if is_sliding else 'global'}"


def _token_index(g: Graph, positions: str, ix: IndexMath) -> str:
    """The flat index of each token (RotaryEmbedding's position_ids into one-row-a-token caches, int64),
    in the shape of `positions` [batch, seq]."""
    p = "/model/shared"
    positions_shape = g.op("Shape", [positions], f"{p}/positions_shape")
    count = g.op("ReduceProd", [positions_shape], f"{p}/num_tokens", keepdims=0)
    flat = g.op("Range", [ix.const(0), ix.index(count, f"{p}/num_tokens"), ix.const(1)], f"{p}/token_range")
    index = g.op("Reshape", [flat, positions_shape], f"{p}/token_index")
    return ix.int64(index, f"{p}/token_index")


def rope_tables(
    g: Graph,
    cfg: DecoderConfig,
    positions: str,
    rope: RopeConfig,
    p: str,
    contrib: bool,
    to: int = TensorProto.FLOAT,
    index_type: type[np.integer] = np.int64,
) -> tuple[str, str]:
    """cos and sin [batch, seq, 1, head_dim / 2] of position * inv_freq (computed in float32, as in
    HF; of type `to`; `positions` of `index_type`); with contrib ops one row per token, [batch * seq, head_dim / 2],
    RotaryEmbedding's caches."""
    inv_freq = g.const(rope.inv_freq(cfg.head_dim), np.float32)
    pos = g.op("Cast", [positions], f"{p}/pos_f", to=TensorProto.FLOAT)
    if contrib:
        pos = g.op("Reshape", [pos, g.const([-1, 1])], f"{p}/pos_u")  # [b * s, 1]
    else:
        pos = g.op("Unsqueeze", [pos, g.const([-1, -2])], f"{p}/pos_u")  # [b, s, 1, 1]
    if rope.is_longrope:
        inv_freq = longrope_inv_freq(g, cfg, positions, rope, p, contrib, index_type)
    freqs = g.op("Mul", [pos, inv_freq], f"{p}/freqs")
    tables = g.op("Cos", [freqs], f"{p}/cos"), g.op("Sin", [freqs], f"{p}/sin")
    if rope.attention_factor != 1.0:  # LongRoPE's and YaRN's
        scale = g.const(np.float32(rope.attention_factor), np.float32)
        tables = g.op("Mul", [tables[0], scale], f"{p}/cos_scaled"), g.op("Mul", [tables[1], scale], f"{p}/sin_scaled")
    if to == TensorProto.FLOAT:
        return tables
    return g.op("Cast", [tables[0]], f"{p}/cos_cast", to=to), g.op("Cast", [tables[1]], f"{p}/sin_cast", to=to)


def longrope_inv_freq(
    g: Graph, cfg: DecoderConfig, positions: str, rope: RopeConfig, p: str, contrib: bool, index_type: type[np.integer] = np.int64
) -> str:
    """LongRoPE's frequencies of each row: the long factors' where the row's last position this step
    reaches past original_max_position_embeddings (transformers: where the forward's positions do;
    a prompt prefilled in several chunks takes the short ones in the chunks that stay inside),
    else the short ones. [b, 1, 1, half]; with contrib ops [b * s, half]. Padding positions are 0."""
    last = g.op("ReduceMax", [positions], f"{p}/last_position", axes=[1], keepdims=1)  # [b, 1]
    limit = rope.original_max_position_embeddings - 1
    is_long = g.op("Greater", [last, g.const(limit, index_type)], f"{p}/is_long")
    if contrib:
        is_long = g.op(
            "Reshape",
            [g.op("Expand", [is_long, g.op("Shape", [positions], f"{p}/shape")], f"{p}/is_long_rows"), g.const([-1, 1])],
            f"{p}/is_long_flat",
        )
    else:
        is_long = g.op("Unsqueeze", [is_long, g.const([-1, -2])], f"{p}/is_long_u")  # [b, 1, 1, 1]
    short, long = (g.const(rope.inv_freq(cfg.head_dim, long=flag), np.float32) for flag in (False, True))
    return g.op("Where", [is_long, long, short], f"{p}/inv_freq")


def group_mask(g: Graph, cfg: DecoderConfig, mask: str, total: str, name: str) -> str:
    """[b, s, total] -> [b, 1, s * groups, total]: one row per query head of a KV head's
    group, in the order graph/attention.py (layer_attention) lays the queries out (position major)."""
    groups = cfg.num_groups
    mask = g.op("Unsqueeze", [mask, g.const([1, 3])], f"{name}_u")  # [b, 1, s, 1, total]
    if groups > 1:
        mask = g.op("Expand", [mask, g.const([1, 1, 1, groups, 1])], f"{name}_groups")
    shape = g.op(
        "Concat", [g.const([0, 1, -1]), g.op("Unsqueeze", [total, g.const([0])], f"{name}_total")], f"{name}_shape", axis=0
    )
    return g.op("Reshape", [mask, shape], f"{name}_rows")
