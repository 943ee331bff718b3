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
        Exports with --kv-cache-dtype int8: int8, head_dim + head_dim / 32 wide (graph/kv_quant.py).

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

Exports with the sampling head (`--sampling-head`, on by default with the paged attention) also
draw sampled rows there (graph/sampling.py), so those read back a token and K candidates:

    sampling_temperature [num_logits]      float32  the row's temperature (> 0)
    sampling_uniform     [num_logits]      float32  the row's uniform draw in [0, 1)
    sampling_token_bitmask [num_logits, ceil(vocab / 32)]  int32  (the head built at load) the tokens
                                                 each row may take, 32 a word (wicore.structured.bitmask)
    sampled_tokens       [num_logits]      int64    inverse CDF of the tempered distribution at it
    top_probs / top_ids  [num_logits, K]   float32 / int64  the K most likely tokens (tempered)

Graphs exported with the `paged` attention (graph/paged_attention.py, CUDA EP) take, instead of
context_lens and window_first_block:

    cumulative_seqlens       [batch + 1]  int32  r * seq: where row r's tokens start, packed
    past_seqlens             [batch]      int32  the row's tokens already in the cache
    attention_bounds         [2]          int32  (host) the longest row's new tokens, and its
                                                 tokens in the cache after the step
    window_logical_tables    [batch, max_blocks]  int64  the window group's blocks at their logical
                                                 index (position // block_size), the released
                                                 ones the sink block: the op counts every
                                                 layer's positions from the sequence's start

(Paged exports before 2026-11-25 took window_block_tables with window_past_seqlens and
window_attention_bounds, counted from the first block the window group holds; the runtime
still feeds them to graphs that declare them.)

The block size is read from the pool's shape inside the graph, so it is chosen
when the runtime allocates the pools, not at export time.

Images (exports of a multimodal checkpoint, portable attention). The vision partition
(graph/vision.py) turns the pixel values of n images into the embeddings of their soft tokens:

    pixel_values    [num_images, 3, size, size]                  float32
    image_features  [num_images, mm_tokens_per_image, hidden]   float32  (the text width)

In the prompt an image is <start_of_image>, mm_tokens_per_image <image_soft_token>s and
<end_of_image>. The decoder partitions take the features of the image tokens a step runs, and
where each image ends, so that the tokens of one image attend to each other both ways:

    image_embeds         [num_image_tokens, hidden]  float32  first partition: replace the (scaled)
                                                              token embeddings of ...
    image_token_indices  [num_image_tokens]          int64    ... these tokens, flat indices into
                                                              batch * seq (no image: both empty)
    attend_until         [batch, seq]                int64    every partition: a query sees keys at
                                                              positions < attend_until (and in the
                                                              context, and in the window of a
                                                              sliding layer): position + 1 for text
                                                              (causal), one past the last soft token
                                                              of its image for an image token

         positions   5   6   7   8   9  10  11          (image soft tokens at 6..9, block I)
         token       t  [I   I   I   I]  t   t
         attend_until 6  10  10  10  10  11  12

As in HF (`token_type_ids`), only the soft tokens are bidirectional: <start_of_image> and
<end_of_image> are text. A step never cuts an image (runtime/request.py), so every soft token
of an image is in the cache or in the step when its queries run. The `paged` attention's
kernel is causal only: paged exports have no vision partition and refuse images.
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
SAMPLING_TEMPERATURE = "sampling_temperature"
SAMPLING_UNIFORM = "sampling_uniform"
SAMPLING_TOKEN_BITMASK = "sampling_token_bitmask"
SAMPLED_TOKENS = "sampled_tokens"
TOP_PROBS = "top_probs"
TOP_IDS = "top_ids"
CUMULATIVE_SEQLENS = "cumulative_seqlens"
PAST_SEQLENS = "past_seqlens"
ATTENTION_BOUNDS = "attention_bounds"
WINDOW_PAST_SEQLENS = "window_past_seqlens"
WINDOW_LOGICAL_TABLES = "window_logical_tables"
WINDOW_ATTENTION_BOUNDS = "window_attention_bounds"

PIXEL_VALUES = "pixel_values"
IMAGE_FEATURES = "image_features"
IMAGE_EMBEDS = "image_embeds"
IMAGE_TOKEN_INDICES = "image_token_indices"
ATTEND_UNTIL = "attend_until"

SINK_BLOCK = 0  # reserved: padding tokens scatter here, no sequence ever owns it


def key_cache(layer: int) -> str:
    return f"key_cache.{layer}"


def value_cache(layer: int) -> str:
    return f"value_cache.{layer}"


def key_cache_out(layer: int) -> str:
    return f"key_cache_out.{layer}"


def value_cache_out(layer: int) -> str:
    return f"value_cache_out.{layer}"
