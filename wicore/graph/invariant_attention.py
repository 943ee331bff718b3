"""The `batch-invariant` attention: the portable attention's two MatMuls written so that a row's
results do not depend on the other rows of its batch (`wicore-export --attention batch-invariant`).

Why the portable attention is not: ONNX Runtime's CPU MatMul (MLAS sgemm) sums the K axis in
slices and stores each slice's partial sum; the slice length depends on N as each thread sees
it (128 for N >= 128, up to 1,024 as N falls to 16). In the portable form

    scores  = q · kᵀ   M = s * groups, N = the batch's key width, K = head_dim (256 in Gemma 3)
    context = p · v    M = s * groups, N = head_dim split over threads, K = the key width

a short row batched with a long one gets a wider N (its masked keys) and so other partial sums
than alone, and the context's N per thread follows how many threads the batch's size buys. The
differences are ~1e-6; int8 activations (`ort-quant`) round some of them to another step, and
then a near-tie in the logits turns (3 of 16 greedy requests on the 270M).

Here every GEMM is one query token of one KV head against all its keys, keys as rows:

    q [b, kvh, s * g, hd] ─► [b, kvh, s, hd, g] ─┐
    k [b, kvh, total, hd] ─► [b, kvh, 1, total, hd] ─► MatMul ─► [b, kvh, s, total, g] ─► scores [b, kvh, s * g, total]
                                                         M = total, N = g, K = hd
    p [b, kvh, s * g, total] ─► [b, kvh, s, total, g] ─┐
    v [b, kvh, total, hd] ─► [b, kvh, 1, hd, total] ─► MatMul ─► [b, kvh, s, hd, g] ─► context [b, kvh, s * g, hd]
                                                         M = hd, N = g, K = total

N is the group size (2 or 4 in Gemma 3) whatever the batch, and M > N, so threads split M:
every sum runs over K in the same slices from 0 (1,024 long at N <= 16), and a row's padding
keys (probability exactly 0) only add zeros after its own. The cost: N = g fills 2 or 4 of a
SIMD register's 16 lanes, and v is transposed (docs/RELIABILITY.md measures it).
"""

from __future__ import annotations

from wicore.graph.ops import Graph

LAST_TWO = [0, 1, 2, 4, 3]  # swaps the last two axes of a 5-d tensor


def scores(g: Graph, q: str, k_rows: str, groups: int, head_dim: int, name: str) -> str:
    """q [b, kvh, s * groups, hd], k_rows [b, kvh, total, hd] -> scores [b, kvh, s * groups, total]."""
    q_tokens = g.op("Reshape", [q, g.const([0, 0, -1, groups, head_dim])], f"{name}/q_tokens")
    q_t = g.op("Transpose", [q_tokens], f"{name}/q_T", perm=LAST_TWO)
    keys = g.op("Unsqueeze", [k_rows, g.const([2])], f"{name}/k_u")
    s_t = g.op("MatMul", [keys, q_t], f"{name}/MatMul")  # [b, kvh, s, total, groups]
    total = g.op("Shape", [k_rows], f"{name}/total", start=2, end=3)
    shape = g.op("Concat", [g.const([0, 0, -1]), total], f"{name}/shape", axis=0)
    return g.op("Reshape", [g.op("Transpose", [s_t], f"{name}/T", perm=LAST_TWO), shape], f"{name}/rows")


def context(g: Graph, probs: str, v_rows: str, groups: int, head_dim: int, name: str) -> str:
    """probs [b, kvh, s * groups, total], v_rows [b, kvh, total, hd] -> [b, kvh, s * groups, hd]."""
    total = g.op("Shape", [v_rows], f"{name}/total", start=2, end=3)
    shape = g.op("Concat", [g.const([0, 0, -1, groups]), total], f"{name}/p_shape", axis=0)
    p_t = g.op("Transpose", [g.op("Reshape", [probs, shape], f"{name}/p_tokens")], f"{name}/p_T", perm=LAST_TWO)
    v_t = g.op("Unsqueeze", [g.op("Transpose", [v_rows], f"{name}/v_T", perm=[0, 1, 3, 2]), g.const([2])], f"{name}/v_u")
    c_t = g.op("MatMul", [v_t, p_t], f"{name}/MatMul")  # [b, kvh, s, hd, groups]
    out = g.op("Transpose", [c_t], f"{name}/T", perm=LAST_TWO)
    return g.op("Reshape", [out, g.const([0, 0, -1, head_dim])], f"{name}/rows")
