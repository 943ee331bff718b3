"""The sampling head: token choice next to the logits, so a sampled decode step reads back a
few numbers a row instead of its [vocab] float32 logits (1 MB a row for Gemma 3).

Inputs and outputs (wicore.graph.io, "Sampling head"), one entry per logits row:

    sampling_temperature [num_logits]      float32  > 0 (greedy rows: any positive value)
    sampling_uniform     [num_logits]      float32  in [0, 1): the row's draw, from its seeded generator
    sampling_token_bitmask [num_logits, W]  int32    W = ceil(vocab / 32): word i, bit j allows token
                                                    32 i + j (llguidance's layout, wicore.structured.bitmask);
                                                    all ones (-1) for a row without a grammar
    sampled_tokens       [num_logits]      int64    the token at `uniform` of the tempered
                                                    distribution's CDF, in token order
    top_probs            [num_logits, K]   float32  the K most likely tokens' tempered probabilities,
    top_ids              [num_logits, K]   int64    most likely first (ties: lower id first)

The draw is the host sampler's, moved: the weights are exp((logits - max) / T) and the token is
where u * total falls in their running sum (wicore.executor.sampler._inverse_cdf), so a row drawn
here gives the token the host would give for the same u (but for float32 rounding exactly at a
boundary between two tokens). The running sum is two-level, as on the host: 512-token block
sums, then one block's own sum. ONNX Runtime's CUDA CumSum adds every element's whole prefix
again (quadratic in the axis), so no CumSum here runs over more than 513 elements.

A refused token's logit is -inf before anything else (the masked distribution, as the host sampler
draws it), so a constrained row draws here beside the free ones:

    bitmask ─► uint32 ─► << (31 - j) ─► >> 31 ─► [n, W * 32] ─► first vocab ─► Where(allowed, logits, -inf) ─► logits

    logits ─► TopK(K) ─► max, candidates ─────────────────────────────────────────► top_probs, top_ids
       └─► exp((l - max) / T) ─► total, block sums ─► CumSum ─► block of u*total ─► its CumSum ─► sampled_tokens

The head is its own graph (`head_model`, built at load by wicore.executor.sampling_head), run
after the last partition on the logits it left on the device, and only in a step where a row
samples: a greedy step skips its TopK over the vocabulary (3.0 ms of a 29.3 ms batch-256 step
on an H100, issue 32). Exports made before that hold the same nodes in the last partition.

Top-k and top-p draws cut the distribution first: the host picks them from the K candidates
(exact when top_k <= K, or when the candidates' mass reaches top_p) and reads the logits only
otherwise.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from wicore.graph import io
from wicore.graph.ops import Graph

TOP_CANDIDATES = 64  # K (at most the vocabulary): covers llama.cpp's default top_k (40) and most nucleus cuts
CDF_BLOCK = 512  # tokens a block of the two-level running sum, here and in wicore.executor.sampler
OPSET = 17


def head_model(vocab_size: int, token_bitmask: bool = True) -> onnx.ModelProto:
    """The head alone: `logits` [num_logits, vocab] float32 and the head's inputs in, its outputs out.
    `token_bitmask`: the head takes the rows' grammar masks (a head without is an older build's)."""
    g = Graph("wicore_sampling_head")
    logits = g.input(io.LOGITS, TensorProto.FLOAT, ["num_logits", vocab_size])
    if token_bitmask:
        logits = masked_logits(g, logits, vocab_size)
    sampling_head(g, logits, vocab_size)
    return g.to_model(OPSET, doc="the sampling head (wicore.graph.sampling)")


def masked_logits(g: Graph, logits: str, vocab_size: int) -> str:
    """`logits` with every token the `sampling_token_bitmask` row refuses at -inf.

    Integer Div and Mod, not BitShift: ONNX Runtime's CUDA EP has no BitShift kernel, and a head
    node on the CPU would copy [rows, vocab] words each way every sampling step. A word, read as
    unsigned (int64, modulo 2**32: an integer Mod takes the divisor's sign), splits into two 16-bit
    halves [low, high] that int32 holds; bit j of a half is (half // 2**j) % 2, so the flat order
    is the word's bit order."""
    p = "/model/sampling/bitmask"
    num_words = -(-vocab_size // 32)
    words = g.input(io.SAMPLING_TOKEN_BITMASK, TensorProto.INT32, ["num_logits", num_words])
    wide = g.op("Cast", [words], f"{p}/wide", to=TensorProto.INT64)
    unsigned = g.op("Mod", [wide, g.const(np.int64(2**32), np.int64)], f"{p}/unsigned", fmod=0)
    halves = [
        g.op("Mod", [unsigned, g.const(np.int64(2**16), np.int64)], f"{p}/low", fmod=0),
        g.op("Div", [unsigned, g.const(np.int64(2**16), np.int64)], f"{p}/high"),
    ]
    halves = [g.op("Unsqueeze", [h, g.const([-1])], f"{name}/axis") for h, name in zip(halves, (f"{p}/low", f"{p}/high"))]
    halves32 = g.op("Cast", [g.op("Concat", halves, f"{p}/halves", axis=-1)], f"{p}/halves32", to=TensorProto.INT32)
    halves32 = g.op("Unsqueeze", [halves32, g.const([-1])], f"{p}/per_bit")  # [n, W, 2, 1]
    shifted = g.op("Div", [halves32, g.const(2 ** np.arange(16, dtype=np.int32), np.int32)], f"{p}/shifted")
    bits = g.op("Mod", [shifted, g.const(np.int32(2), np.int32)], f"{p}/bits", fmod=0)  # [n, W, 2, 16]
    bits = g.op("Reshape", [bits, g.const([0, num_words * 32])], f"{p}/flat")
    bits = g.op("Slice", [bits, g.const([0]), g.const([vocab_size]), g.const([1])], f"{p}/in_vocab")
    allowed = g.op("Cast", [bits], f"{p}/allowed", to=TensorProto.BOOL)
    return g.op("Where", [allowed, logits, g.const(-np.inf, np.float32)], f"{p}/masked")


def sampling_head(g: Graph, logits: str, vocab_size: int) -> None:
    """Add the head's inputs, nodes and outputs after `logits` [num_logits, vocab] float32."""
    p = "/model/sampling"
    f32 = TensorProto.FLOAT
    temperature = g.input(io.SAMPLING_TEMPERATURE, f32, ["num_logits"])
    uniform = g.input(io.SAMPLING_UNIFORM, f32, ["num_logits"])
    k = min(TOP_CANDIDATES, vocab_size)
    # TopK of the logits gives the candidates in the weights' order and the row's max (ONNX
    # Runtime's CUDA ReduceMax takes 13 ms over 8 rows of 262K; TopK 0.1 ms, H100).
    best, _ = g.op_multi("TopK", [logits, g.const([k])], f"{p}/TopK", 2, outs=(None, io.TOP_IDS), axis=-1, largest=1, sorted=1)
    top = g.op("Slice", [best, g.const([0]), g.const([1]), g.const([-1])], f"{p}/max")  # [n, 1]
    t = g.op("Unsqueeze", [temperature, g.const([-1])], f"{p}/T")

    def tempered(x: str, name: str) -> str:  # exp((x - max) / T): <= 1, a tiny T gives 0, not inf - inf
        return g.op("Exp", [g.op("Div", [g.op("Sub", [x, top], f"{name}/shift"), t], f"{name}/temper")], f"{name}/exp")

    weights = tempered(logits, f"{p}/weights")
    total = g.op("ReduceSum", [weights, g.const([-1])], f"{p}/total", keepdims=1)
    g.op("Div", [tempered(best, f"{p}/top"), total], f"{p}/top_probs", out=io.TOP_PROBS)
    g.output(io.TOP_PROBS, f32, ["num_logits", k])
    g.output(io.TOP_IDS, TensorProto.INT64, ["num_logits", k])
    _inverse_cdf(g, weights, uniform, vocab_size, p)
    g.output(io.SAMPLED_TOKENS, TensorProto.INT64, ["num_logits"])


def _inverse_cdf(g: Graph, weights: str, uniform: str, vocab_size: int, p: str) -> None:
    """sampled_tokens: the first token whose running weight exceeds u * total."""
    num_blocks = -(-vocab_size // CDF_BLOCK)
    padded = g.op("Pad", [weights, g.const([0, 0, 0, num_blocks * CDF_BLOCK - vocab_size])], f"{p}/pad")
    blocks = g.op("Reshape", [padded, g.const([0, num_blocks, CDF_BLOCK])], f"{p}/blocks")  # [n, B, 512]
    block_sums = g.op("ReduceSum", [blocks, g.const([-1])], f"{p}/block_sums", keepdims=0)  # [n, B]
    axis = g.const(1)
    cdf = g.op("CumSum", [block_sums, axis], f"{p}/block_cdf")
    before = g.op("CumSum", [block_sums, axis], f"{p}/block_cdf_before", exclusive=1)
    total = g.op("Gather", [cdf, g.const([num_blocks - 1])], f"{p}/cdf_total", axis=1)  # [n, 1]
    target = g.op("Mul", [g.op("Unsqueeze", [uniform, g.const([-1])], f"{p}/u"), total], f"{p}/target")
    block = _count_at_most(g, cdf, target, num_blocks - 1, f"{p}/block")  # [n, 1]
    offset = g.op("GatherElements", [before, block], f"{p}/offset", axis=1)  # [n, 1]
    index = g.op("Unsqueeze", [block, g.const([-1])], f"{p}/block_index")  # [n, 1, 1]
    index = g.op("Expand", [index, g.const([1, 1, CDF_BLOCK])], f"{p}/block_index_rows")
    row = g.op("GatherElements", [blocks, index], f"{p}/block_row", axis=1)  # [n, 1, 512]
    row = g.op("Reshape", [row, g.const([0, CDF_BLOCK])], f"{p}/block_row_flat")
    inner = g.op("Add", [g.op("CumSum", [row, axis], f"{p}/inner_cdf"), offset], f"{p}/inner")
    within = _count_at_most(g, inner, target, CDF_BLOCK - 1, f"{p}/within")
    token = g.op("Add", [g.op("Mul", [block, g.const(CDF_BLOCK)], f"{p}/block_start"), within], f"{p}/token")
    token = g.op("Min", [token, g.const(vocab_size - 1)], f"{p}/token_in_vocab")  # rounding past the last weight
    g.op("Squeeze", [token, g.const([-1])], f"{p}/tokens", out=io.SAMPLED_TOKENS)


def _count_at_most(g: Graph, cdf: str, target: str, last: int, name: str) -> str:
    """How many entries of each row of `cdf` are <= target ([n, 1] int64), capped at `last`:
    the index of the first entry above target."""
    at_most = g.op("Cast", [g.op("LessOrEqual", [cdf, target], f"{name}/le")], f"{name}/cast", to=TensorProto.INT64)
    count = g.op("ReduceSum", [at_most, g.const([-1])], f"{name}/count", keepdims=1)
    return g.op("Min", [count, g.const(np.int64(last))], f"{name}/index")
