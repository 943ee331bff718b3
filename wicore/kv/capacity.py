"""How long a context, and how many sequences, fit a device memory budget (`wicore plan`).

    budget  =  weights  +  KV pool  +  activations

- weights: what the model's sessions hold. An export's are read from its graphs (placement.py);
  a checkpoint that is not exported here (a 27B on a laptop) has them estimated from its config,
  as `wicore-export` would write them (`estimate_weight_bytes`, and `estimate_vision_bytes` for
  the vision tower an export keeps unless its attention is paged).
- KV pool: `KVLayout.pool_bytes`, the pool the engine plans for n sequences of a length: every
  token's block in the full-attention layers, the sliding layers' window plus a prefill chunk
  for each sequence, one padding sink per group. The same formula sizes `--kv-pool-gb`.
- activations: an estimate (`activation_bytes`), not a measurement: the intermediate tensors of
  one layer in the largest graph run the scheduler forms, all counted as alive at once. The
  runner runs rows of one length together, so a run is either the decodes (n rows of 1 token)
  or prefill chunks (up to max_num_batched_tokens / prefill_chunk rows of a chunk), each against
  the whole context. The portable attention materialises, per row, the gathered K and V with
  their float32 copies and the float32 scores and probabilities of every query head against
  every key: at the 27B shape, a 256-token chunk against 128K keys holds 12 GiB. The paged
  attention (FlashAttention over the KV pages) holds none of them. Checked once on the CPU EP
  (the tiny 131K-position model of tests/graph/test_long_context.py, one portable run against
  100K cached keys, the process's peak RSS before and after; 2026-11-25): a 256-token chunk grew
  it by 1,288 MiB against an estimate of 1,078, a 64-token chunk by 266 MiB against 342.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from wicore.blocks.block_groups import FULL
from wicore.devices.placement import GIB
from wicore.kv.layout import KVLayout, pool_gb_flag
from wicore.model.config import DecoderConfig
from wicore.model.vision import VisionConfig, vision_shapes

F32 = 4
# What the budget must leave beside this estimate, measured (docs/PERFORMANCE.md, "the KV pools' memory"):
# the 27B at 128K on an H100 used 3.8 GiB (int4) and 5.4 GiB (fp16) above its weights and KV pool, of
# which the estimate's activations were 0.3 GiB. Not measured on other EPs: said for every plan.
RUNTIME_NOTE = (
    "not counted: the runtime's own memory (on CUDA the context, library workspaces and arenas: 3.5-5G more "
    "for the 27B at 128K on an H100): give --budget-gb the device's memory less that"
)
QUANT_BLOCK = 32  # columns sharing one scale in the ort-quant flavour's MatMulNBits weights


@dataclass(frozen=True)
class Workload:
    """The engine settings the memory depends on (`wicore serve`'s flags of the same names)."""

    prefill_chunk: int = 256
    max_num_batched_tokens: int = 2048
    paged_attention: bool = False


def estimate_weight_bytes(
    cfg: DecoderConfig,
    itemsize: int,
    weight_bits: int | None = None,
    quantize_embedding: bool = False,
    expert_bits: int | None = None,
) -> int:
    """Bytes of the weights `wicore-export` writes from a float checkpoint: every linear layer and
    the tied embedding / LM head table in the float type (`itemsize` bytes), or with `weight_bits`
    (the ort-quant flavour) the linear layers and the LM head as `weight_bits` codes with one float
    scale per 32 columns, beside the embedding's float rows (`quantize_embedding`: rows read from the
    head's codes, with scales of their own); `expert_bits`: a mixture's expert weights in those bits
    instead. Norm weights in the float type."""
    h, hd = cfg.hidden_size, cfg.head_dim
    per_layer = h * hd * (2 * cfg.num_heads + 2 * cfg.num_kv_heads) + mlp_params(cfg)  # q, o; k, v; MLP or experts
    table = cfg.vocab_size * h
    # the LM head reads the table, or is a matrix of its own
    linear = cfg.num_layers * per_layer + table * (1 if cfg.tie_word_embeddings else 2)
    norms = cfg.num_layers * (4 * h + 2 * hd) + h
    if weight_bits is None:
        return (linear + norms) * itemsize
    rows = table // QUANT_BLOCK if quantize_embedding else table
    experts = cfg.num_layers * cfg.num_experts * 3 * h * cfg.moe_intermediate_size if expert_bits else 0
    codes = (linear - experts) * weight_bits // 8 + experts * (expert_bits or weight_bits) // 8
    return codes + linear // QUANT_BLOCK * itemsize + (rows + norms) * itemsize


def mlp_params(cfg: DecoderConfig) -> int:
    """Weights of one layer's MLP: gate, up and down, or every expert's, the router and a shared expert."""
    if cfg.num_experts:
        shared = 3 * cfg.hidden_size * cfg.shared_expert_intermediate_size + (
            cfg.hidden_size if cfg.shared_expert_intermediate_size else 0
        )
        return cfg.num_experts * (3 * cfg.hidden_size * cfg.moe_intermediate_size + cfg.hidden_size) + shared
    return 3 * cfg.hidden_size * cfg.intermediate_size


def estimate_vision_bytes(cfg: VisionConfig, itemsize: int) -> int:
    """Bytes of a multimodal export's vision tower and projector: every tensor the builder reads, in
    the float type (`itemsize` bytes)."""
    return sum(math.prod(shape) for shape in vision_shapes(cfg).values()) * itemsize


def activation_bytes(cfg: DecoderConfig, kv_itemsize: int, rows: int, queries: int, keys: int, paged: bool) -> int:
    """One layer's intermediate tensors in a run of `rows` rows of `queries` tokens against `keys`
    keys each (see the module docstring): float32 hidden states (residual, normed, attention output;
    gate, up, their product), the rows' logits, and with the portable attention per row the gathered
    K and V with float32 copies, the mask of each query against each key and the scores and
    probabilities of every query head."""
    tokens = rows * queries
    # an expert layer: each token's k experts' gate / up rows (and the routed copies of its hidden state)
    width = cfg.num_experts_per_tok * (cfg.moe_intermediate_size + cfg.hidden_size) if cfg.num_experts else cfg.intermediate_size
    hidden = tokens * 3 * (cfg.hidden_size + width) * F32
    logits = rows * cfg.vocab_size * F32
    if paged:
        return hidden + logits
    gathered = 2 * keys * cfg.num_kv_heads * cfg.head_dim * (kv_itemsize + F32)
    scores = queries * keys * (2 * cfg.num_heads + cfg.num_groups) * F32
    return hidden + logits + rows * (gathered + scores)


@dataclass(frozen=True)
class Capacity:
    """What fits `budget` bytes: the longest sequence, and how many sequences of `context` tokens."""

    budget: int
    weight_bytes: int
    model_context: int  # the model's max_position_embeddings
    memory_context: int  # tokens one sequence can reach in the memory left (whatever the model's maximum)
    longest_kv: int  # the KV pool of one sequence of `longest` tokens, and its activations
    longest_activations: int
    context: int
    num_sequences: int  # sequences of `context` tokens that fit at once
    kv_bytes: int  # their KV pool, and their activations
    activations: int

    @property
    def longest(self) -> int:
        return min(self.memory_context, self.model_context)

    def describe(self) -> str:
        lines = [
            f"memory budget {self.budget / GIB:.2f}G: weights {self.weight_bytes / GIB:.2f}G, "
            "KV pool and activations (an estimate: wicore/kv/capacity.py) in the rest"
        ]
        limit = (
            f"the model's maximum (the memory holds {self.memory_context})"
            if self.memory_context >= self.model_context
            else f"the memory (the model takes {self.model_context})"
        )
        if self.longest:
            lines.append(
                f"one sequence: up to {self.longest} tokens, limited by {limit}; "
                f"KV pool {self.longest_kv / GIB:.2f}G, activations {self.longest_activations / GIB:.2f}G"
            )
        else:
            lines.append("one sequence: no room; the weights and one KV block of each layer group exceed the budget")
        if self.num_sequences:
            lines.append(
                f"sequences of {self.context} tokens: {self.num_sequences} at once; KV pool {self.kv_bytes / GIB:.2f}G, "
                f"activations {self.activations / GIB:.2f}G (serve with kv_pool_gb {pool_gb_flag(self.kv_bytes)} "
                f"max_num_seqs {self.num_sequences})"
            )
        else:
            lines.append(f"sequences of {self.context} tokens: none fits")
        lines.append(RUNTIME_NOTE)
        return "\n".join(lines)


def plan_capacity(
    cfg: DecoderConfig, layout: KVLayout, kv_dtype: str, weight_bytes: int, budget: int, context: int, work: Workload
) -> Capacity:
    """The longest sequence and the number of `context`-token sequences that fit `budget` bytes
    beside `weight_bytes` of weights (each the largest count whose KV pool and activations fit)."""
    kv_itemsize = np.dtype(kv_dtype).itemsize
    room = budget - weight_bytes

    def need(num_seqs: int, tokens: int) -> tuple[int, int]:
        """(KV pool, activations) of `num_seqs` sequences of `tokens` tokens."""
        chunk = min(work.prefill_chunk, tokens)
        decodes = activation_bytes(cfg, kv_itemsize, num_seqs, 1, tokens, work.paged_attention)
        prefills = min(num_seqs, max(1, work.max_num_batched_tokens // chunk))
        chunks = activation_bytes(cfg, kv_itemsize, prefills, chunk, tokens, work.paged_attention)
        return layout.pool_bytes(num_seqs, tokens, work.prefill_chunk), max(decodes, chunks)

    fits = lambda num_seqs, tokens: sum(need(num_seqs, tokens)) <= room
    upper = max(room, 0) // layout.block_bytes(FULL) + 1  # blocks (or sequences, a block each at least) the room could hold
    memory_context = _largest(lambda blocks: fits(1, blocks * layout.block_size), upper) * layout.block_size
    longest = min(memory_context, cfg.max_position_embeddings)
    num_seqs = _largest(lambda n: fits(n, context), upper)
    longest_kv, longest_act = need(1, longest) if longest else (0, 0)
    kv, act = need(num_seqs, context) if num_seqs else (0, 0)
    return Capacity(
        budget, weight_bytes, cfg.max_position_embeddings, memory_context, longest_kv, longest_act, context, num_seqs, kv, act
    )


def _largest(ok, upper: int) -> int:
    """The largest n in [0, upper] with ok(n) (ok holds up to some n and not after), 0 if none."""
    low, high = 0, upper
    while low < high:
        mid = (low + high + 1) // 2
        if ok(mid):
            low = mid
        else:
            high = mid - 1
    return low
