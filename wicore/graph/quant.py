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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wicore.graph.ops import MS_DOMAIN, DataFile, Graph
from wicore.model.quant import SUPPORTED_BITS, BlockQuant, concat_rows, quantize_symmetric


@dataclass(frozen=True)
class QuantLinear:
    """How the ort-quant flavour encodes linear weights."""

    weight_bits: int = 8  # for float weights and GGUF types without a lossless encoding
    block_size: int = 32
    accuracy_level: int = 4  # MatMulNBits: 4 = int8 activations on CPU; ignored by GPU kernels
    quantize_embedding: bool = False  # a float embedding table's rows in weight_bits too (gather)

    def __post_init__(self) -> None:
        if self.weight_bits not in SUPPORTED_BITS:
            raise ValueError(f"weight_bits {self.weight_bits}: expected one of {SUPPORTED_BITS}")

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
        w = self.blocks(weights)
        return matmul_nbits(g, x, w, name, dtype, self.accuracy_level, out, weight_name, data)

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
    accuracy_level: int = 4,
    out: str | None = None,
    weight_name: str | None = None,
    data: DataFile | None = None,
) -> str:
    """x [..., K] @ wᵀ for w [N, K]. A weight with per-block offsets (Q4_K, Q5_K, Q4_1, Q5_1) adds
    sum over each block of x times its offset:

        x ──► MatMulNBits(codes, scales) ──────────────────────────────────► (+) ──► y
        └───► MatMul(block indicator [K, K/bs]) ─► MatMul(offsetsᵀ [K/bs, N]) ─┘
    """
    rows, cols = w.shape
    prefix = weight_name or name
    qweight = g.weight(f"{prefix}.qweight", lambda: pack_codes(w), data)
    scales = g.weight(f"{prefix}.scales", lambda: w.scales.astype(dtype), data)
    attrs = {"K": cols, "N": rows, "bits": w.bits, "block_size": w.block_size, "accuracy_level": accuracy_level}
    if w.offsets is None:
        return g.op("MatMulNBits", [x, qweight, scales], f"{name}/MatMulNBits", out=out, domain=MS_DOMAIN, **attrs)
    y = g.op("MatMulNBits", [x, qweight, scales], f"{name}/MatMulNBits", domain=MS_DOMAIN, **attrs)
    num_blocks = cols // w.block_size
    indicator = np.repeat(np.eye(num_blocks, dtype=dtype), w.block_size, axis=0)  # [K, K/bs]
    sums = g.op("MatMul", [x, g.weight(f"/model/quant/block_sum_{cols}x{w.block_size}", indicator)], f"{name}/block_sums")
    offsets = g.weight(f"{prefix}.offsets", np.ascontiguousarray(w.offsets.T.astype(dtype)), data)
    correction = g.op("MatMul", [sums, offsets], f"{name}/offset_MatMul")
    return g.op("Add", [y, correction], f"{name}/offset_Add", out=out)
