"""The `paged` attention: ONNX Runtime's com.microsoft.PagedAttention reads and writes the fp16 KV
buffers in place (CUDA EP only; the `portable` attention in gemma3.py runs on every EP).

Where the portable attention gathers every block of a row, casts it to float32 and transposes it
(about 1.2 ms a layer at batch 32 on the Gemma-3-27B shape), this op reads the blocks where they
are, GQA and the sliding window included, in one kernel (flash-decoding style for decode rows,
FlashAttention or a memory-efficient kernel for prefill chunks).

The op takes the batch's tokens packed, [tokens, heads * head_dim]. WiCore's rows are
[batch, seq], every row `seq` tokens long (the runner batches rows of equal length), so row r
is tokens r * seq ... r * seq + seq - 1:

    cumulative_seqlens  [batch + 1]  int32  0, seq, 2 seq, ...
    past_seqlens        [batch]      int32  tokens of the row already in the cache (its start)
    slot_mapping        [batch, seq] int64  where each new token's K/V goes (padding: the sink block)
    block_tables        [batch, n]   int64  the row's blocks from logical block 0
    attention_bounds    [2]          int32  host memory: the longest row's new tokens and its
                                            tokens in the cache after the step (kernel choice)

The sliding layers see their rows from the first block the window group still holds: their
table is window_block_tables and their past length window_past_seqlens = start - first *
block_size. Positions only enter the op through the causal mask and the window, both of which
depend on differences of positions, so the shift changes nothing but what is read: at 8K
context the op walks ~1K cached tokens of a sliding layer, not 8K of which 7K are masked.

Gemma's q/k norms and RoPE run before the op (float16, one fused kernel each; the op's own
q/k norm and rotary would count positions from past_seqlens, which the sliding layers' window
shift moves), and the attention scale is already folded into the q-norm weight, so the op's
scale is 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx import TensorProto

from wicore.graph import io
from wicore.graph.ops import MS_DOMAIN, Graph
from wicore.model.config import Gemma3Config


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
    past_seqlens: dict[bool, str]  # [batch] int32
    bounds: dict[bool, str]  # [2] int32, host memory
    slots: dict[bool, str]  # [tokens] int32
    tables: dict[bool, str]  # [batch, n] int32
    hidden_shape: str  # [batch, seq, -1]: Reshape target of the packed output


def paged_values(g: Graph, cfg: Gemma3Config, kinds: list[bool], positions: str) -> PagedValues:
    """Declare the paging inputs of the paged attention and convert them to the op's int32."""
    p = "/model/paged"
    i32, i64 = TensorProto.INT32, TensorProto.INT64
    cumulative = g.input(io.CUMULATIVE_SEQLENS, i32, ["batch_plus_1"])
    names = {
        False: (io.SLOT_MAPPING, io.BLOCK_TABLES, io.PAST_SEQLENS, io.ATTENTION_BOUNDS),
        True: (io.WINDOW_SLOT_MAPPING, io.WINDOW_BLOCK_TABLES, io.WINDOW_PAST_SEQLENS, io.WINDOW_ATTENTION_BOUNDS),
    }
    slots, tables, past, bounds = {}, {}, {}, {}
    for is_sliding in kinds:
        slot_name, table_name, past_name, bounds_name = names[is_sliding]
        kind = "sliding" if is_sliding else "global"
        past[is_sliding] = g.input(past_name, i32, ["batch"])
        bounds[is_sliding] = g.input(bounds_name, i32, [2])
        slot = g.input(slot_name, i64, ["batch", "seq"])
        table = g.input(table_name, i64, ["batch", "max_window_blocks" if is_sliding else "max_blocks"])
        flat = g.op("Reshape", [slot, g.const([-1])], f"{p}/{kind}/slots_flat")
        slots[is_sliding] = g.op("Cast", [flat], f"{p}/{kind}/slots", to=i32)
        tables[is_sliding] = g.op("Cast", [table], f"{p}/{kind}/tables", to=i32)
    shape = g.op("Concat", [g.op("Shape", [positions], f"{p}/batch_seq"), g.const([-1])], f"{p}/hidden_shape", axis=0)
    return PagedValues(cumulative, past, bounds, slots, tables, shape)


def paged_attention(
    g: Graph, cfg: Gemma3Config, layer: int, q: str, k: str, v: str, paged: PagedValues, name: str, scale: float = 1.0
) -> str:
    """Token rows q [tokens, heads * hd], k and v [tokens, kv_heads * hd] (the KV dtype, float16;
    q and k normed and rotated) -> the attention output [b, s, heads * hd], the layer's K/V written.
    `scale` multiplies q·k (1: Gemma's is folded into its q-norm weight)."""
    is_sliding = cfg.is_sliding(layer)
    inputs = [
        q,
        k,
        v,
        io.key_cache(layer),
        io.value_cache(layer),
        paged.cumulative_seqlens,
        paged.past_seqlens[is_sliding],
        paged.tables[is_sliding],
        "",  # cos_cache: RoPE is applied before the op
        "",  # sin_cache
        paged.slots[is_sliding],
        *[""] * 5,  # head_sink, q_norm_weight, k_norm_weight, k_scale, v_scale
        paged.bounds[is_sliding],
    ]
    # A key at position j is visible to a query at position p when p - window < j <= p: `window`
    # keys, the query's own included, which is how the op counts local_window_size (it hands
    # FlashAttention window - 1 keys to the left). Measured: window - 1 here differed from HF
    # transformers from the window's first position on (max |logit diff| 0.8-1.7 on tiny models).
    window = cfg.sliding_window if is_sliding else -1
    out, _, _ = g.op_multi(
        "PagedAttention",
        inputs,
        f"{name}/PagedAttention",
        3,
        outs=[None, io.key_cache_out(layer), io.value_cache_out(layer)],
        domain=MS_DOMAIN,
        num_heads=cfg.num_heads,
        kv_num_heads=cfg.num_kv_heads,
        scale=scale,
        local_window_size=window,
    )
    return g.op("Reshape", [out, paged.hidden_shape], f"{name}/heads_merged")
