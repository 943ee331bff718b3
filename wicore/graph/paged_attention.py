"""The `paged` attention: ONNX Runtime's com.microsoft.PagedAttention reads and writes the fp16 KV
buffers in place (the CUDA EP's; in the webgpu op flavours the WebGPU EP's, paged_values' `webgpu`;
the `portable` attention in decoder.py runs on every EP).

Where the portable attention gathers every block of a row, casts it to float32 and transposes it
(about 1.2 ms a layer at batch 32 on the Gemma-3-27B shape), this op reads the blocks where they
are, GQA and the sliding window included, in one kernel (flash-decoding style for decode rows,
FlashAttention or a memory-efficient kernel for prefill chunks).

The op takes the batch's tokens packed, [tokens, width]. WiCore's rows are
[batch, seq], every row `seq` tokens long (the runner batches rows of equal length), so row r
is tokens r * seq ... r * seq + seq - 1:

    cumulative_seqlens  [batch + 1]  int32  0, seq, 2 seq, ...
    past_seqlens        [batch]      int32  tokens of the row already in the cache (its start)
    slot_mapping        [batch, seq] int64  where each new token's K/V goes (padding: the sink block)
    block_tables        [batch, n]   int64  the row's blocks from logical block 0
    attention_bounds    [2]          int32  host memory: the longest row's new tokens and its
                                            tokens in the cache after the step (kernel choice)

The op also norms q and k and rotates them (its fused prologue) before it writes K, so a layer
hands it the projection's packed [tokens, (heads + 2 kv_heads) * hd] rows as they are: one
kernel where a Split, two norms and two RotaryEmbedding kernels were (~10 us a layer at batch 1
on the 27B shape). Gemma's attention scale is folded into the q-norm weight, so the op's scale
is 1 there; families without q/k norms give the op their scale. The prologue takes a token's
position from past_seqlens + its index in the row and looks up RoPE's cos / sin caches, one row
per position up to the model's context, computed in float32 as transformers computes them.

So every layer counts positions from the start of the sequence, the sliding ones included: their
window group holds the row's blocks from some logical block on (the older ones were released), and
the runtime lists them at their logical index, the released ones as the sink block
(window_logical_tables). FlashAttention's local window skips the tiles left of the window, so at
8K context a sliding layer still reads ~1K cached tokens, not 8K.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from wicore.graph import io
from wicore.graph.ops import MS_DOMAIN, Graph
from wicore.model.config import DecoderConfig, RopeConfig


def flash_page_size(head_dim: int) -> int:
    """The KV block size the op needs to run its FlashAttention kernels: a K/V tile of the paged
    kernel must not straddle a block (256 tokens for heads up to 64 wide, 128 up to 128, 64 above).
    With smaller blocks ONNX Runtime 1.31 falls back to a scalar decode kernel: on the 27B shape
    4.5x slower at batch 32 and 3.5x at batch 1 (docs/PERFORMANCE.md)."""
    return 256 if head_dim <= 64 else 128 if head_dim <= 128 else 64


@dataclass(frozen=True)
class PagedValues:
    """The op's per-batch inputs, shared by every layer of a partition (keyed by is_sliding)."""

    cumulative_seqlens: str
    past_seqlens: str  # [batch] int32
    bounds: str  # [2] int32, host memory
    slots: dict[bool, str]  # [tokens] int32; empty in the webgpu flavour (the op writes by the tables)
    tables: dict[bool, str]  # [batch, max_blocks] int32, from logical block 0
    # cos, sin [max_position_embeddings, head_dim / 2] float16; None: the layers rotate q and k before the
    # op (LongRoPE, whose factors a row picks per step: graph/attention.py paged_prologue)
    rope: dict[bool, tuple[str, str] | None]
    hidden_shape: str  # [batch, seq, -1]: Reshape target of the packed output; "": none (the webgpu flavour)
    # WiCore's BlockAttention on some layer kinds (graph/paged_block.py): ScatterND's (block, offset) of each
    # new token [batch, seq, 2] int64 by kind, and each row's tokens in the cache after the step [batch] int64
    scatter: dict[bool, str] | None = None
    context_lens: str | None = None


def paged_values(
    g: Graph,
    cfg: DecoderConfig,
    kinds: list[bool],
    positions: str,
    block_kinds: frozenset[bool] = frozenset(),
    pool: str = "",
    dtype: type[np.floating] = np.float16,
    webgpu: bool = False,
) -> PagedValues:
    """Declare the paging inputs of the paged attention and convert them to the op's int32. With
    `block_kinds` (the layer kinds on BlockAttention, `pool` any pool of the partition for the block
    size) also the K/V write's indices and the context lengths; `dtype`: the RoPE caches'.
    `webgpu` (the webgpu flavour's paged graphs): no slot mapping (the WebGPU EP's op takes none and
    writes a new token's K/V where its block table and position say, which is where the runtime's
    slots are: the tables list a row's every block, at its logical index), and no shape arithmetic,
    so that ONNX Runtime can capture the graphs on the WebGPU EP (`enableGraphCapture`, which takes no
    copy node): the int32 inputs are fed as they are, the tables cast on the adapter under capture
    (where the EP takes int64 Casts; without capture these two Casts run on the CPU, each then one
    copy), and the layers reshape the op's packed output after o_proj, by their input's shape
    (attention.py), where a Concat of shapes ran on the adapter between two copies:

        cumulative_seqlens, past_seqlens (int32) ──────────────► the op           (adapter)
        block_tables, window_logical_tables (int64) ─► Cast ───► the op's tables
    """
    p = "/model/paged"
    i32, i64 = TensorProto.INT32, TensorProto.INT64
    cumulative = g.input(io.CUMULATIVE_SEQLENS, i32, ["batch_plus_1"])
    past = g.input(io.PAST_SEQLENS, i32, ["batch"])
    bounds = g.input(io.ATTENTION_BOUNDS, i32, [2])
    slots: dict[bool, str] = {}
    tables: dict[bool, str] = {}
    rope: dict[bool, tuple[str, str] | None] = {}
    scatter: dict[bool, str] = {}
    block_size = ""
    if block_kinds:
        block_size = on_device(
            g, g.op("Gather", [g.op("Shape", [pool], f"{p}/pool_shape"), g.const(1)], f"{p}/pool_block"), f"{p}/block_size"
        )
    for is_sliding in kinds:
        kind = "sliding" if is_sliding else "global"
        table = g.input(io.WINDOW_LOGICAL_TABLES if is_sliding else io.BLOCK_TABLES, i64, ["batch", "max_blocks"])
        tables[is_sliding] = g.op("Cast", [table], f"{p}/{kind}/tables", to=i32)
        if not webgpu:
            slot = g.input(io.WINDOW_SLOT_MAPPING if is_sliding else io.SLOT_MAPPING, i64, ["batch", "seq"])
            flat = g.op("Reshape", [slot, g.const([-1])], f"{p}/{kind}/slots_flat")
            slots[is_sliding] = g.op("Cast", [flat], f"{p}/{kind}/slots", to=i32)
        layer_rope = cfg.rope_local if is_sliding else cfg.rope_global
        rope[is_sliding] = None if layer_rope.is_longrope else rope_caches(g, cfg, layer_rope, f"{p}/{kind}/rope", dtype)
        if is_sliding in block_kinds:
            scatter[is_sliding] = slot_indices(g, slot, block_size, f"{p}/{kind}/scatter_indices")
    batch_seq = g.op("Shape", [positions], f"{p}/batch_seq")
    shape = "" if webgpu else g.op("Concat", [batch_seq, g.const([-1])], f"{p}/hidden_shape", axis=0)  # (webgpu: above)
    if not block_kinds:
        return PagedValues(cumulative, past, bounds, slots, tables, rope, shape)
    # every row is `seq` tokens long (module docstring): past + seq tokens in the cache after the step
    seq = on_device(g, g.op("Gather", [batch_seq, g.const(1)], f"{p}/seq_dim"), f"{p}/seq")
    lens = g.op("Add", [g.op("Cast", [past], f"{p}/past_i64", to=i64), seq], f"{p}/context_lens")
    return PagedValues(cumulative, past, bounds, slots, tables, rope, shape, scatter, lens)


def on_device(g: Graph, dim: str, name: str) -> str:
    """A shape's scalar int64 (host memory) as a [1] tensor computed where the arithmetic on it runs:
    Range(dim, dim + 1) takes its bounds from host memory, so the CUDA EP places no copy node (a copy
    node would keep ONNX Runtime from capturing the graph)."""
    return g.op("Range", [dim, g.op("Add", [dim, g.const(1)], f"{name}/end"), g.const(1)], name)


def slot_indices(g: Graph, slots: str, block_size: str, name: str) -> str:
    """slot_mapping [batch, seq] int64 -> ScatterND's indices [batch, seq, 2]: (block, offset in it)."""
    block = g.op("Div", [slots, block_size], f"{name}/block")
    offset = g.op("Sub", [slots, g.op("Mul", [block, block_size], f"{name}/block_start")], f"{name}/offset")
    pair = [g.op("Unsqueeze", [x, g.const([-1])], f"{name}/{n}_u") for x, n in ((block, "block"), (offset, "offset"))]
    return g.op("Concat", pair, name, axis=-1)


def rope_caches(
    g: Graph, cfg: DecoderConfig, rope: RopeConfig, name: str, dtype: type[np.floating] = np.float16
) -> tuple[str, str]:
    """cos and sin [max_position_embeddings, head_dim / 2] in `dtype` of position * inv_freq,
    computed in float32 as transformers computes them (the op's cos_cache and sin_cache), times
    YaRN's attention factor where the rope has one (as transformers scales its cos and sin)."""

    def table(fn: np.ufunc) -> np.ndarray:
        angles = np.arange(cfg.max_position_embeddings, dtype=np.float32)[:, None] * rope.inv_freq(cfg.head_dim)
        return (fn(angles) * np.float32(rope.attention_factor)).astype(dtype)

    return g.weight(f"{name}.cos_cache", lambda: table(np.cos)), g.weight(f"{name}.sin_cache", lambda: table(np.sin))


def paged_attention(
    g: Graph,
    cfg: DecoderConfig,
    layer: int,
    qkv: str,
    paged: PagedValues,
    name: str,
    norms: tuple[np.ndarray, np.ndarray] | None,
    scale: float,
    sinks: np.ndarray | None = None,
) -> str:
    """qkv [b, s, (heads + 2 kv_heads) * hd] (the KV dtype, float16), as the projection gives it ->
    the attention output [b, s, heads * hd], the layer's K/V written. The op norms q and k with
    `norms` (their float weights, the family's offset and any scale folded in; None: no q/k norm)
    and rotates them (unless the partition's rope caches are None: q and k come rotated); `scale`
    multiplies q·k, then Gemma 2's soft-capping (the op's softcap) bends the scores; `sinks` [heads]
    (gpt-oss's) join each head's softmax denominator (the op's head_sink, graph/sinks.py)."""
    is_sliding = cfg.is_sliding(layer)
    rows = g.op("Reshape", [qkv, g.const([-1, (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim])], f"{name}/qkv_packed")
    weights = ["", ""]
    if norms is not None:
        weights = [g.const(w.astype(np.float16), np.float16) for w in norms]
    rope = paged.rope[is_sliding]
    cos, sin = rope if rope is not None else ("", "")
    inputs = [
        rows,
        "",  # key and value: packed with the query
        "",
        io.key_cache(layer),
        io.value_cache(layer),
        paged.cumulative_seqlens,
        paged.past_seqlens,
        paged.tables[is_sliding],
        cos,
        sin,
        paged.slots.get(is_sliding, ""),  # none: the webgpu flavour's (paged_values)
        "" if sinks is None else g.const(sinks.astype(np.float16), np.float16),  # head_sink
        *weights,  # q_norm_weight, k_norm_weight
        "",  # k_scale
        "",  # v_scale
        paged.bounds,
    ]
    # A key at position j is visible to a query at position p when p - window < j <= p: `window`
    # keys, the query's own included, which is how the op counts local_window_size (it hands
    # FlashAttention window - 1 keys to the left). Measured: window - 1 here differed from HF
    # transformers from the window's first position on (max |logit diff| 0.8-1.7 on tiny models).
    # A window on every layer (Mistral, Phi-3) is a window on the full-attention layers, whose
    # blocks are all kept (the op looks at the window only).
    window = cfg.sliding_window if is_sliding else cfg.window_all_layers or -1
    attrs: dict[str, object] = {"do_rotary": int(rope is not None), "local_window_size": window, "scale": scale}
    if cfg.attn_logit_softcapping:
        attrs["softcap"] = float(cfg.attn_logit_softcapping)
    if norms is not None:
        attrs["qk_norm_epsilon"] = cfg.rms_norm_eps
    out, _, _ = g.op_multi(
        "PagedAttention",
        inputs,
        f"{name}/PagedAttention",
        3,
        outs=[None, io.key_cache_out(layer), io.value_cache_out(layer)],
        domain=MS_DOMAIN,
        num_heads=cfg.num_heads,
        kv_num_heads=cfg.num_kv_heads,
        **attrs,
    )
    return g.op("Reshape", [out, paged.hidden_shape], f"{name}/heads_merged") if paged.hidden_shape else out
