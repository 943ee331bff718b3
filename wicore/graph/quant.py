"""Linear layers of the `ort-quant` op flavour: com.microsoft MatMulNBits over block-quantized weights.

Weights come from wicore.export.quant: a GGUF source's blocks transcoded without
loss (a `QuantizedTensor` carries them), anything else quantized symmetrically
to `weight_bits`. Fused weights (q|k|v, gate|up) share the widest encoding of
their parts. Measured on ONNX Runtime 1.32 CPU (AMD EPYC Zen 4, 2 threads),
[1, 640] x [640, 262144] (the LM head): fp32 MatMul 19.5 ms, MatMulNBits
8-bit/block 32 5.7 ms, 4-bit/block 32 9.4 ms, both with accuracy_level 4 (int8
activations, as llama.cpp's Q8 dot products). Float zero points are refused
for 8 bits and ~100x slower for 4 bits on CPU, hence the offset path below.
The embedding's rows are gathered from 8- or 4-bit blocks with GatherBlockQuantized (QuantLinear.gather).

Activations (`QuantLinear.accuracy_level` None, the default; docs/PERFORMANCE.md, issue 37):

    weight              activations                       why
    4-bit layer         float (accuracy_level 0)          int8 activations flip SmolLM2-135M's greedy tokens
                                                          (its first answer token on 2 of 5 chats, as llama.cpp's
                                                          Q8 dot products do); MLAS has fp32 kernels for 4-bit
                                                          blocks: ~1.3x the int8 path's time at batch 1
    8-bit layer         float, as two 4-bit halves        MLAS has no fp32 kernel for 8-bit blocks: ONNX Runtime
                        (split_nibbles)                   dequantizes the whole weight at every call (SmolLM2's
                                                          Q8_0 head: ~650 ms against ~11 ms, the "4 tok/s" of float
                                                          activations); int8 activations there lost a tiny Qwen2
                                                          Q4_K_M's (Q6_K v/down) agreement with HF on 1 of 5 prompts
    8-bit LM head       int8, its top HEAD_CANDIDATES     the largest tensor: int8 is 2x the split's speed, and the
                        again in float (`head`)           argmax is the float one wherever it is among the top 64

accuracy_level 4 everywhere is llama.cpp's arithmetic (int8 activations, Q8 dot products), 0 everywhere
float with the nibble split for 8-bit layers and heads.

On wicore.MatMulQ (`kernels` "wicore") a step of one to 31 rows takes int8 activations with the residual
(~15-bit), other steps of 32+ rows (32+ decode streams) the float GEMM, and a prompt's steps (rows of 32+
tokens) the node's `prompt_precision` (graph/matmul_q.py), measured per tensor on five prompts against HF
float32 (docs/PERFORMANCE.md, issue 37, 2026-11-29):

    tensor              prompt                                why
    layer projection    int8 (`layer_prompt`) where the       ~1.5-2x the float GEMM (Gemma 3 270M's 512-token
    (qkv, o, gate|up,   family's row says so (int8_prompts:   prompt 3.4-3.8x llama.cpp's, 1.5-2.0x on float);
    down)               Gemma 3), else float                  Gemma 3 keeps HF's 32 tokens on all five prompts.
                                                              SmolLM2-135M (Llama) loses the first token of two
                                                              chats on int8 x, as llama.cpp does, and float for
                                                              any one role does not win it back: the error is
                                                              the sum over 30 layers, so its layers stay float
    LM head             float (HEAD_PROMPT): x in float32     its argmax is the token: int8 x flips it where a
                        against the dequantized weight        column of x is an outlier (tests/graph/
                                                              test_matmul_nbits.py); it is one row a sequence,
                                                              so a prompt's speed does not hang on it
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from wicore.graph.matmul_i8 import can_run as i8_can_run
from wicore.graph.matmul_i8 import matmul_i8
from wicore.graph.matmul_q import PROMPT_PRECISIONS, can_run, matmul_q
from wicore.graph.ops import MS_DOMAIN, DataFile, Graph
from wicore.kernels.library import DOMAIN
from wicore.model.quant import SUPPORTED_BITS, BlockQuant, concat_rows, quantize_symmetric


@dataclass(frozen=True)
class QuantLinear:
    """How the ort-quant flavour encodes linear weights."""

    weight_bits: int = 8  # for float weights and GGUF types without a lossless encoding
    block_size: int = 32
    # a mixture of experts' expert weights in these bits instead (float sources); None: weight_bits.
    # The experts are nearly all of such a model's bytes, the attention and the LM head a few percent.
    expert_bits: int | None = None
    # MatMulNBits: 4 = int8 activations on CPU, 0 = float; None: per tensor (module doc). GPU kernels ignore it.
    accuracy_level: int | None = None
    quantize_embedding: bool = False  # a float embedding table's rows in weight_bits too (gather)
    # "wicore": float32 graphs' linear layers on wicore.MatMulQ (graph/matmul_q.py, WiCore's CPU kernel)
    # instead of MatMulNBits: accuracy_level 4 llama.cpp's int8 activations, else int8 plus a residual
    kernels: str = "ort"
    # with kernels "wicore": float16 graphs' (the CUDA flavour's) on wicore.MatMulQ16 (`matmul_q16`: MatMulNBits'
    # inputs, read in place), faster at 1 to 16 rows and slower above, so asked for (ExportConfig.matmul_q16)
    matmul_q16: bool = False
    # with kernels "wicore": float16 graphs' layers and head on wicore.MatMulI8 (`matmul_i8`, graph/matmul_i8.py: int8
    # weights a scale per output channel, int8 activations above 16 rows), where the shape fits (matmul_i8.can_run)
    matmul_i8: bool = False
    # MatMulQ's prompt_precision for the layers' projections (module doc); the head keeps HEAD_PROMPT
    layer_prompt: str = "float"

    def __post_init__(self) -> None:
        if self.kernels not in ("ort", "wicore"):
            raise ValueError(f"kernels {self.kernels!r}: expected ort or wicore")
        if self.weight_bits not in SUPPORTED_BITS:
            raise ValueError(f"weight_bits {self.weight_bits}: expected one of {SUPPORTED_BITS}")
        if self.expert_bits not in (None, *SUPPORTED_BITS):
            raise ValueError(f"expert_bits {self.expert_bits}: expected one of {SUPPORTED_BITS}")
        if self.accuracy_level not in (None, 0, 4):
            raise ValueError(f"accuracy_level {self.accuracy_level}: expected None (per tensor), 0 or 4")
        if self.layer_prompt not in PROMPT_PRECISIONS:
            raise ValueError(f"layer_prompt {self.layer_prompt!r}: expected one of {PROMPT_PRECISIONS}")

    def for_experts(self) -> QuantLinear:
        """The encoding of a mixture's expert weights: this one, in `expert_bits` where set."""
        return self if self.expert_bits is None else replace(self, weight_bits=self.expert_bits, expert_bits=None)

    def level(self, w: BlockQuant) -> int:
        """The MatMulNBits accuracy_level of a layer's weight: the configured one, or float (module doc)."""
        return FLOAT if self.accuracy_level is None else self.accuracy_level

    def can_quantize(self, weights: list[np.ndarray]) -> bool:
        """Whether these [out, in] weights have blocks: their source's (a GGUF's), or rows that are
        whole blocks (a tiny model's width of 48 is not: such a weight stays float)."""
        return all(getattr(w, "blocks", None) is not None or w.shape[-1] % self.block_size == 0 for w in weights)

    def blocks(self, weights: list[np.ndarray]) -> BlockQuant:
        """The [out, in] weights stacked by rows, each part from its source blocks where it has them."""
        parts = []
        for w in weights:
            source = getattr(w, "blocks", None)  # QuantizedTensor: the GGUF blocks behind the floats
            parts.append(source if source is not None else quantize_symmetric(w, self.weight_bits, self.block_size))
        return concat_rows(parts)

    def linear(
        self,
        g: Graph,
        x: str,
        weights: list[np.ndarray],
        name: str,
        dtype: type,
        out: str | None = None,
        weight_name: str | None = None,
        data: DataFile | None = None,
    ) -> str:
        """x [..., in] @ concat(weights)ᵀ in `dtype` (the model's float type). Initializers are named
        after `weight_name` (default `name`) and written to `data` (default the graph's file)."""
        if self.runs_matmul_i8(weights, dtype):
            return matmul_i8(g, x, weights, name, out, weight_name, data)
        w = self.blocks(weights)
        if self.runs_matmul_q(w, dtype):
            return matmul_q(
                g, x, w, name, out, weight_name, data, self.accuracy_level != INT8, prompt_precision=self.layer_prompt
            )
        if self.runs_matmul_q16(w, dtype):
            return matmul_q16(g, x, w, name, out, weight_name, data)
        return matmul_nbits(g, x, w, name, dtype, self.level(w), out, weight_name, data)

    def runs_matmul_q(self, w: BlockQuant, dtype: type) -> bool:
        """Whether this weight runs on wicore.MatMulQ: `kernels` "wicore", float32 graphs, a layout it takes."""
        return self.kernels == "wicore" and dtype == np.float32 and can_run(w)

    def runs_matmul_i8(self, weights: list[np.ndarray], dtype: type) -> bool:
        """Whether these [out, in] weights run on wicore.MatMulI8: asked for (`matmul_i8`, `kernels` "wicore"),
        float16 graphs, a shape the op takes (K a multiple of 16, N of 4)."""
        rows = sum(w.shape[0] for w in weights)
        return self.matmul_i8 and self.kernels == "wicore" and dtype == np.float16 and i8_can_run(rows, weights[0].shape[1])

    def runs_matmul_q16(self, w: BlockQuant, dtype: type) -> bool:
        """Whether this weight runs on wicore.MatMulQ16: asked for (`matmul_q16`, `kernels` "wicore"), float16 graphs,
        symmetric 4- or 8-bit blocks of a multiple of 32 (a GGUF's Q4_K with offsets stays on MatMulNBits)."""
        return (
            self.matmul_q16
            and self.kernels == "wicore"
            and dtype == np.float16
            and w.offsets is None
            and w.bits in (4, 8)
            and w.block_size % 32 == 0
        )

    def head(
        self,
        g: Graph,
        x: str,
        weight: np.ndarray,
        name: str,
        dtype: type,
        out: str | None = None,
        weight_name: str | None = None,
        data: DataFile | None = None,
    ) -> str:
        """The LM head x [n, hidden] -> logits [n, vocab], as `linear`; where it runs on int8
        activations alone (8-bit weights), the logits of its top HEAD_CANDIDATES are computed again from
        the float x and the weight's own codes, so the argmax is the float one:

            x ─► MatMulNBits (int8 x) ─► TopK ids ─┬──────────────────────────────► ScatterElements ─► logits
            │                                      └► Gather codes, scales, offsets ─► MatMul ◄─ x ┘ (float)

        MatMulQ with its residual (~15-bit activations, as every other layer) needs no refinement: its
        logits are within ~1e-5 of the float ones, and the 13 nodes after it (a TopK over the vocabulary
        the largest) were a third of a tiny model's decode step besides the head (docs/PERFORMANCE.md).

        On MatMulI8 (`matmul_i8`) the head is one more layer: at 16 rows or fewer (single-stream decode) weight-only,
        above on int8 x as the layers (graph/matmul_i8.py: the risk that brings, and the check that bounds it).
        """
        if self.runs_matmul_i8([weight], dtype):
            return matmul_i8(g, x, [weight], name, out, weight_name, data)
        w = self.blocks([weight])
        if self.runs_matmul_q(w, dtype):
            residual = self.accuracy_level != INT8
            narrow = w.codes.size > WIDE_HEAD_CODES
            if w.bits != 8 or residual:
                return matmul_q(g, x, w, name, out, weight_name, data, residual, narrow, not narrow, HEAD_PROMPT)
            logits = matmul_q(g, x, w, name, None, weight_name, data, residual, narrow, prompt_precision=HEAD_PROMPT)
            return refine_top(g, x, logits, w, f"{name}/refine", weight_name or name, data, out)
        if self.runs_matmul_q16(w, dtype):
            return matmul_q16(g, x, w, name, out, weight_name, data)
        level = INT8 if self.accuracy_level is None and w.bits == 8 else self.level(w)
        if level == FLOAT or w.bits != 8 or dtype != np.float32:
            return matmul_nbits(g, x, w, name, dtype, level, out, weight_name, data)
        logits = matmul_nbits(g, x, w, name, dtype, level, None, weight_name, data)
        return refine_top(g, x, logits, w, f"{name}/refine", weight_name or name, data, out)

    def gather(
        self, g: Graph, indices: str, table: np.ndarray, name: str, weight_name: str, dtype: type, data: DataFile | None
    ) -> str | None:
        """Rows [..., hidden] of an embedding table in symmetric 8- or 4-bit blocks: its source's own
        (Q8_0, Q4_0: the same values), or, for a float table with `quantize_embedding`, the linear
        weights' encoding (a quarter or an eighth of fp16's bytes: 2.6 GiB less for Gemma 3 27B in 4
        bits; an error of the head's size added to every token's embedding). None otherwise, and for
        blocks with offsets (Q4_K ...): float rows. The codes are the tied LM head's MatMulNBits
        weight when both use `weight_name`, so the head and the rows agree:

            codes [vocab, hidden / bs, bs * bits / 8] ─► GatherBlockQuantized(quantize_axis 2) ─► Reshape [.., hidden]
                  └──────────────────────────────────► MatMulNBits (lm_head)
        """
        w = getattr(table, "blocks", None)
        if w is None and self.quantize_embedding:
            w = quantize_symmetric(table, self.weight_bits, self.block_size)
        if w is None or w.bits not in (4, 8) or w.offsets is not None:
            return None
        codes = g.weight(f"{weight_name}.qweight", lambda: pack_codes(w), data)
        scales = g.weight(f"{weight_name}.row_scales", lambda: w.scales[:, :, None].astype(dtype), data)
        rows = g.op(
            "GatherBlockQuantized",
            [codes, indices, scales],
            f"{name}/GatherBlockQuantized",
            domain=MS_DOMAIN,
            gather_axis=0,
            quantize_axis=2,
            block_size=w.block_size,
            bits=w.bits,
        )
        return g.op("Reshape", [rows, g.const([0, 0, -1])], f"{name}/Reshape")


FLOAT, INT8 = 0, 4  # MatMulNBits accuracy_level: float activations; int8 activations (CPU)
HEAD_PROMPT = "float"  # the LM head's MatMulQ prompt_precision (module doc)
HEAD_CANDIDATES = 64  # logits the head computes again in float (QuantLinear.head)
# A MatMulQ head of at most this many codes keeps them 8 bits where they would fit in 5 or 6 (a Q6_K head):
# read from the cache every step, it is bound by the kernel's work, and 6-bit codes in 16-column blocks took
# 2.45 ms against 1.93 as 8 bits (49,152 x 256, one thread, the same bits; docs/PERFORMANCE.md, issue 37).
# On an AVX2-only AMD EPYC too (its AVX2 rows): 1.13-1.28x the 6-bit codes' speed alone, and in the engine the
# 8-bit head's step no longer than the 6-bit one's (issue 37, 2026-11-30), so the rule does not hang on the CPU.
# Its scales are narrow where exact all the same (a Q6_K head's float16 x int8: 0.8 MB, not 3.1 of float32;
# a Q8_0 head's float16), read in place by DotPairs: a tiny GGUF's step 4-8% faster (issue 37, 2026-11-29).
# Past it (Llama 3.2 1B's 128,256 x 2,048) the head streams from memory and its bytes count.
WIDE_HEAD_CODES = 32 << 20


def refine_top(
    g: Graph, x: str, logits: str, w: BlockQuant, name: str, prefix: str, data: DataFile | None, out: str | None
) -> str:
    """`logits` [n, vocab] with its HEAD_CANDIDATES largest entries per row replaced by x [n, K] times
    their rows of the 8-bit `w` (codes, scales and offsets as matmul_nbits stored them), in float."""
    rows, cols = w.shape
    num_blocks = cols // w.block_size
    k = min(HEAD_CANDIDATES, rows)
    _, ids = g.op_multi("TopK", [logits, g.const([k])], f"{name}/TopK", 2, axis=-1)  # [n, k]
    codes = g.op("Gather", [g.weight(f"{prefix}.qweight", lambda: pack_codes(w), data), ids], f"{name}/codes")
    weights = g.op("Sub", [g.op("Cast", [codes], f"{name}/Cast", to=1), g.const(128.0, np.float32)], f"{name}/signed")
    scales = g.weight(f"{prefix}.scales", lambda: w.scales.astype(np.float32), data)
    scale = g.op("Unsqueeze", [g.op("Gather", [scales, ids], f"{name}/scales"), g.const([-1])], f"{name}/scale")
    weights = g.op("Mul", [weights, scale], f"{name}/dequantize")  # [n, k, blocks, block_size]
    if w.offsets is not None:
        block_offsets = w.offsets  # a local, so that the lambda sees it narrowed
        offsets = g.weight(f"{prefix}.offsets", lambda: np.ascontiguousarray(block_offsets.T.astype(np.float32)), data)
        offset = g.op(
            "Transpose", [g.op("Gather", [offsets, ids], f"{name}/offsets", axis=1)], f"{name}/offsets_T", perm=[1, 2, 0]
        )
        offset = g.op("Unsqueeze", [offset, g.const([-1])], f"{name}/offset")
        weights = g.op("Add", [weights, offset], f"{name}/shift")
    weights = g.op("Reshape", [weights, g.const([0, k, num_blocks * w.block_size])], f"{name}/rows")  # [n, k, K]
    column = g.op("Unsqueeze", [x, g.const([-1])], f"{name}/x")  # [n, K, 1]
    exact = g.op("MatMul", [weights, column], f"{name}/MatMul")  # [n, k, 1]
    exact = g.op("Squeeze", [exact, g.const([-1])], f"{name}/exact")
    return g.op("ScatterElements", [logits, ids, exact], f"{name}/ScatterElements", out=out, axis=-1)


def split_nibbles(w: BlockQuant) -> tuple[BlockQuant, BlockQuant]:
    """An 8-bit weight as the sum of two 4-bit ones, exactly: each code c = 16 h + (l - 8) + 8 with
    h = c >> 4 and l = c & 15, so w = 16 s h + s (l - 8) + (8 s + offset)."""
    codes = w.codes.astype(np.int16)
    high = BlockQuant((codes >> 4).astype(np.int8), (16 * w.scales).astype(np.float32), None, 4, w.block_size)
    offsets = 8 * w.scales + (0 if w.offsets is None else w.offsets)
    low = BlockQuant(((codes & 15) - 8).astype(np.int8), w.scales, offsets.astype(np.float32), 4, w.block_size)
    return high, low


def pack_codes(w: BlockQuant) -> np.ndarray:
    """MatMulNBits' B: uint8 [N, K / block, block * bits / 8], codes + 2**(bits-1), low nibble first."""
    rows, cols = w.shape
    # In two's complement, code + 2**(bits-1) is the code's low `bits` bits with the top one flipped.
    codes = np.asarray(w.codes, np.int8).view(np.uint8)
    if w.bits == 8:
        return (codes ^ 0x80).reshape(rows, cols // w.block_size, -1)
    unsigned = codes[:, 0::2] & 0x0F  # in place from here: a 27B export packs ~13 G codes
    unsigned ^= 0x08
    high = codes[:, 1::2] ^ 0x08
    high <<= 4
    unsigned |= high
    return unsigned.reshape(rows, cols // w.block_size, -1)


def matmul_nbits(
    g: Graph,
    x: str,
    w: BlockQuant,
    name: str,
    dtype: type,
    accuracy_level: int = INT8,
    out: str | None = None,
    weight_name: str | None = None,
    data: DataFile | None = None,
) -> str:
    """x [..., K] @ wᵀ for w [N, K]. A weight with per-block offsets (Q4_K, Q5_K, Q4_1, Q5_1) adds
    sum over each block of x times its offset:

        x ──► MatMulNBits(codes, scales) ──────────────────────────────────► (+) ──► y
        └───► MatMul(block indicator [K, K/bs]) ─► MatMul(offsetsᵀ [K/bs, N]) ─┘
    """
    # MLAS has float kernels for 4-bit blocks only; fp16 graphs are the GPU's, whose 8-bit kernels need no split
    if accuracy_level == FLOAT and w.bits == 8 and dtype == np.float32:
        high, low = split_nibbles(w)
        y = matmul_nbits(g, x, high, f"{name}/high", dtype, FLOAT, None, f"{weight_name or name}.high", data)
        y_low = matmul_nbits(g, x, low, f"{name}/low", dtype, FLOAT, None, f"{weight_name or name}.low", data)
        return g.op("Add", [y, y_low], f"{name}/nibbles_Add", out=out)
    rows, cols = w.shape
    prefix = weight_name or name
    qweight = g.weight(f"{prefix}.qweight", lambda: pack_codes(w), data)
    scales = g.weight(f"{prefix}.scales", lambda: w.scales.astype(dtype), data)
    attrs: dict[str, Any] = {"K": cols, "N": rows, "bits": w.bits, "block_size": w.block_size, "accuracy_level": accuracy_level}
    if w.offsets is None:
        return g.op("MatMulNBits", [x, qweight, scales], f"{name}/MatMulNBits", out=out, domain=MS_DOMAIN, **attrs)
    y = g.op("MatMulNBits", [x, qweight, scales], f"{name}/MatMulNBits", domain=MS_DOMAIN, **attrs)
    num_blocks = cols // w.block_size
    indicator: np.ndarray = np.repeat(np.eye(num_blocks, dtype=dtype), w.block_size, axis=0)  # [K, K/bs]
    sums = g.op("MatMul", [x, g.weight(f"/model/quant/block_sum_{cols}x{w.block_size}", indicator)], f"{name}/block_sums")
    offsets = g.weight(f"{prefix}.offsets", np.ascontiguousarray(w.offsets.T.astype(dtype)), data)
    correction = g.op("MatMul", [sums, offsets], f"{name}/offset_MatMul")
    return g.op("Add", [y, correction], f"{name}/offset_Add", out=out)


def matmul_q16(
    g: Graph,
    x: str,
    w: BlockQuant,
    name: str,
    out: str | None = None,
    weight_name: str | None = None,
    data: DataFile | None = None,
) -> str:
    """x [..., K] float16 @ wᵀ on wicore.MatMulQ16 (wicore/kernels/csrc/kernels.h): MatMulNBits' B and float16
    scales under the same initializer names, its attributes less accuracy_level, so the two ops are one
    rename apart. On CUDA a GEMV up to 16 rows reads the 4-bit codes in place (MatMulNBits' batch-1 kernel
    read the 27B shape's weights at ~1 TB/s, issue 32) and a tensor-core kernel above dequantizes tile by
    tile in shared memory, where MatMulNBits writes the whole weight in float16 first."""
    rows, cols = w.shape
    prefix = weight_name or name
    qweight = g.weight(f"{prefix}.qweight", lambda: pack_codes(w), data)
    scales = g.weight(f"{prefix}.scales", lambda: w.scales.astype(np.float16), data)
    attrs: dict[str, Any] = {"K": cols, "N": rows, "bits": w.bits, "block_size": w.block_size}
    return g.op("MatMulQ16", [x, qweight, scales], f"{name}/MatMulQ16", out=out, domain=DOMAIN, **attrs)
