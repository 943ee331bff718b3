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

SINK_BLOCK = 0  # reserved: padding tokens scatter here, no sequence ever owns it


def key_cache(layer: int) -> str:
    return f"key_cache.{layer}"


def value_cache(layer: int) -> str:
    return f"value_cache.{layer}"


def key_cache_out(layer: int) -> str:
    return f"key_cache_out.{layer}"


def value_cache_out(layer: int) -> str:
    return f"value_cache_out.{layer}"
