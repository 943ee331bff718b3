"""Attention sinks (gpt-oss): a learned logit per query head that joins each softmax's denominator
and no value, so a head can attend to "nothing" (its weights then sum to less than 1).

transformers appends the sink as one more column of each head's scores and drops it after the
softmax; the same in standard ops, on the portable attention's score rows (one KV head's queries
in rows (position, group member), wicore.graph.decoder):

    scores [b, kvh, s * groups, T] ─► [b, kvh, s, groups, T]     sink [1, kvh, 1, groups, 1]
    m = max(max_T scores, sink)
    probs = exp(scores - m) / (sum_T exp(scores - m) + exp(sink - m)) ─► [b, kvh, s * groups, T]

A row whose keys are all masked gets weights ~0 (the sink takes the mass), never NaN.
"""

from __future__ import annotations

import numpy as np

from wicore.graph.ops import Graph


def softmax_with_sinks(g: Graph, scores: str, sinks: np.ndarray, num_kv_heads: int, groups: int, name: str) -> str:
    """Softmax over the last axis of `scores` [b, kvh, s * groups, T] (float32, masked) with head
    h = kv_head * groups + member's sink `sinks[h]` in each denominator; the same shape back."""
    sink = g.const(sinks.astype(np.float32).reshape(1, num_kv_heads, 1, groups, 1), np.float32)
    shape = g.op("Shape", [scores], f"{name}/shape")
    keys = g.op("Shape", [scores], f"{name}/num_keys", start=3)
    per_head = g.op("Concat", [g.const([0, num_kv_heads, -1, groups]), keys], f"{name}/per_head_shape", axis=0)
    x = g.op("Reshape", [scores, per_head], f"{name}/per_head")
    m = g.op("Max", [g.op("ReduceMax", [x], f"{name}/ReduceMax", axes=[-1], keepdims=1), sink], f"{name}/max")
    e = g.op("Exp", [g.op("Sub", [x, m], f"{name}/shifted")], f"{name}/Exp")
    total = g.op("ReduceSum", [e, g.const([-1])], f"{name}/ReduceSum", keepdims=1)
    sink_e = g.op("Exp", [g.op("Sub", [sink, m], f"{name}/sink_shifted")], f"{name}/sink_Exp")
    probs = g.op("Div", [e, g.op("Add", [total, sink_e], f"{name}/denominator")], f"{name}/probs")
    return g.op("Reshape", [probs, shape], f"{name}/out")
