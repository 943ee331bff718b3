"""Names and meaning of the decoder step graphs' inputs and outputs (DESIGN.md, "Decoder step graph").

    input_ids       [batch, seq]            int64  first partition only
    hidden_states   [batch, seq, hidden]    float32  other partitions (output `hidden_states_out`)
    positions       [batch, seq]            int64  absolute position of each token (RoPE, masks)
    slot_mapping    [batch, seq]            int64  pool slot (block * block_size + offset) the token's
                                                   K/V is written to; padding tokens use the sink block
    block_tables    [batch, max_blocks]     int64  the row's blocks in order; unused entries any valid
                                                   block (they are masked by context_lens)
    context_lens    [batch]                 int64  tokens of the row in the cache after this step
    logits_indices  [num_logits]            int64  last partition only: flat indices into the
                                                   batch * seq tokens whose logits are wanted
    logits          [num_logits, vocab]     float32
    attention_mass  [batch, max_blocks]     float32  optional (--attention-stats): attention
                                                   probability each block received in this step,
                                                   summed over the partition's layers, heads, queries
    key_cache.{i} / value_cache.{i}         [num_blocks, block_size, kv_heads, head_dim]
        pool of layer i; updated in place: `key_cache_out.{i}` is bound to the same buffer.

Sliding-window layers keep their KV in a block group of their own, so that blocks
that fell out of the window can be released (partitions with sliding layers only):

    window_slot_mapping  [batch, seq]         int64  as slot_mapping, in the window group's pools
    window_block_tables  [batch, max_wblocks] int64  the row's window-group blocks in order, from
                                                     logical block `window_first_block` on
    window_first_block   [batch]              int64  logical index (position // block_size) of the
                                                     first block listed in window_block_tables
    key_cache.{i} / value_cache.{i} of a sliding layer  [num_window_blocks, block_size, kvh, hd]

`attention_mass` covers the full-attention layers only (their tables list every block).

The last partition also outputs the greedy choice, so a step whose rows all decode greedily
reads token ids back instead of [num_logits, vocab] float32 logits:

    greedy_tokens   [num_logits]            int64  argmax of each logits row

Graphs exported with the `paged` attention (graph/paged_attention.py, CUDA EP) take, instead of
context_lens and window_first_block:

    cumulative_seqlens       [batch + 1]  int32  r * seq: where row r's tokens start, packed
    past_seqlens             [batch]      int32  the row's tokens already in the cache
    attention_bounds         [2]          int32  (host) the longest row's new tokens, and its
                                                 tokens in the cache after the step
    window_past_seqlens      [batch]      int32  as past_seqlens, counted from the first block of
                                                 window_block_tables (the released ones left out)
    window_attention_bounds  [2]          int32  (host) as attention_bounds, counted the same way

The block size is read from the pool's shape inside the graph, so it is chosen
when the runtime allocates the pools, not at export time.
"""

from __future__ import annotations

INPUT_IDS = "input_ids"
HIDDEN_STATES = "hidden_states"
HIDDEN_STATES_OUT = "hidden_states_out"
POSITIONS = "positions"
SLOT_MAPPING = "slot_mapping"
BLOCK_TABLES = "block_tables"
CONTEXT_LENS = "context_lens"
LOGITS_INDICES = "logits_indices"
LOGITS = "logits"
ATTENTION_MASS = "attention_mass"
WINDOW_SLOT_MAPPING = "window_slot_mapping"
WINDOW_BLOCK_TABLES = "window_block_tables"
WINDOW_FIRST_BLOCK = "window_first_block"
GREEDY_TOKENS = "greedy_tokens"
CUMULATIVE_SEQLENS = "cumulative_seqlens"
PAST_SEQLENS = "past_seqlens"
ATTENTION_BOUNDS = "attention_bounds"
WINDOW_PAST_SEQLENS = "window_past_seqlens"
WINDOW_ATTENTION_BOUNDS = "window_attention_bounds"

SINK_BLOCK = 0  # reserved: padding tokens scatter here, no sequence ever owns it


def key_cache(layer: int) -> str:
    return f"key_cache.{layer}"


def value_cache(layer: int) -> str:
    return f"value_cache.{layer}"


def key_cache_out(layer: int) -> str:
    return f"key_cache_out.{layer}"


def value_cache_out(layer: int) -> str:
    return f"value_cache_out.{layer}"
