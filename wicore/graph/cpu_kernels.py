"""The float32 CPU graphs' attention on WiCore's own kernel (`--op-flavour ort-quant
--kernels wicore`; wicore/kernels/csrc/attention_cpu.cc), beside the linear layers' wicore.MatMulQ.

A decode step of the portable attention is ~30 small nodes a layer (the KV blocks gathered, cast,
transposed and reshaped into rows, two MatMuls, the mask added, a softmax, the context transposed
back); here the new K/V are still written by ScatterND, and one node reads the pools where they lie:

    q (RoPE'd, scaled) ──────────────────────────────┐
    k, v ─► ScatterND into the pools (in place) ─► BlockAttention(q, pools, block_tables, positions,
                                                   context_lens[, window_first_block]) ─► o_proj

The mask is the portable graphs' (graph/shared_values.py): causal, in the context, in the window;
Gemma 2's soft-capping inside. (The library's float32 GatedActivation is not emitted: in place of the
gated MLP's Split, activation and Mul it made decode steps slower, not faster, on both models measured;
docs/PERFORMANCE.md.) Exports this graph cannot express (int8 KV, attention statistics, images, attention sinks) keep the
portable attention (`can_use`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wicore.graph import io
from wicore.graph.ops import Graph
from wicore.kernels.library import DOMAIN

if TYPE_CHECKING:
    from wicore.model.config import DecoderConfig


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
