"""Linear layers on WiCore's own CPU kernel, wicore.MatMulQ (wicore/kernels/csrc/matmul_q_cpu.cc).

llama.cpp's arithmetic: the activations in int8 blocks of 32 (one float scale each), integer dot
products against the weight's codes, one float scale a weight block, and a block offset (Q4_1, Q4_K,
Q5_K ...) times the block's sum of the quantized activations. By default (`residual`) the activations'
rounding error is rounded to int8 again in steps of d / 128 and dotted too: ~15-bit activations, which
keep SmolLM2's greedy near-ties where llama.cpp's int8 flips them, for ~10% of the step. The GGUF's blocks go in as
`BlockQuant` keeps them (wicore/model/quant.py), repacked:

    input      8 bits                        4 bits (rows in groups of GROUP, N padded with zeros)
    codes      uint8 [N, K / bs, bs]         uint8 [N / 8, K / 32, 8, 16]: a group's rows interleaved a block
               code + 128                    at a time; code + 8, column j low nibble, j + 16 high
    scales     float32 [N, K / bs]           float32 [N / 8, K / bs, 8]
    offsets    as the scales, only where the weight has them (an optional input)

bs = 16 (Q6_K) or 32. The 4-bit interleave makes a block of 8 rows one 128-byte run and its scales one
vector, so the kernel addresses everything from one pointer. 8-bit codes are MatMulNBits' own B
(graph/quant.py `pack_codes`), so a head's float refinement and a tied embedding's
GatherBlockQuantized share them.
"""

from __future__ import annotations

import numpy as np

from wicore.graph.ops import DataFile, Graph
from wicore.kernels.library import DOMAIN
from wicore.model.quant import BlockQuant

BLOCK = 32  # activation block (columns)
BLOCK_SIZES = (16, 32)  # weight blocks the kernel takes
GROUP = 8  # 4-bit rows interleaved


def can_run(w: BlockQuant) -> bool:
    """Whether MatMulQ takes this weight (bits 4 or 8, blocks of 16 or 32, whole activation blocks)."""
    return w.bits in (4, 8) and w.block_size in BLOCK_SIZES and w.shape[1] % BLOCK == 0


def pack(w: BlockQuant) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """MatMulQ's codes, scales and offsets (the module doc's layouts)."""
    rows, cols = w.shape
    offsets = None if w.offsets is None else w.offsets.astype(np.float32)
    if w.bits == 8:  # code + 128 is the code's bits with the top one flipped (two's complement)
        codes = (np.asarray(w.codes, np.int8).view(np.uint8) ^ 0x80).reshape(rows, cols // w.block_size, w.block_size)
        return codes, w.scales.astype(np.float32), offsets
    padded = -(-rows // GROUP) * GROUP
    unsigned = np.zeros((padded, cols), np.uint8)
    unsigned[:rows] = (np.asarray(w.codes, np.int8).view(np.uint8) ^ 0x08) & 0x0F  # code + 8
    halves = unsigned.reshape(padded // GROUP, GROUP, cols // BLOCK, 2, BLOCK // 2)
    codes = (halves[:, :, :, 0] | (halves[:, :, :, 1] << 4)).transpose(0, 2, 1, 3)  # [groups, blocks, 8, 16]
    return np.ascontiguousarray(codes), grouped(w.scales, padded), None if offsets is None else grouped(offsets, padded)


def grouped(per_block: np.ndarray, padded: int) -> np.ndarray:
    """[N, K / bs] -> [padded / 8, K / bs, 8] float32, zeros past N."""
    rows, num_blocks = per_block.shape
    out = np.zeros((padded, num_blocks), np.float32)
    out[:rows] = per_block
    return np.ascontiguousarray(out.reshape(padded // GROUP, GROUP, num_blocks).transpose(0, 2, 1))


def matmul_q(
    g: Graph,
    x: str,
    w: BlockQuant,
    name: str,
    out: str | None = None,
    weight_name: str | None = None,
    data: DataFile | None = None,
    residual: bool = True,
) -> str:
    """x [..., K] float32 @ wᵀ for w [N, K] on wicore.MatMulQ; `residual`: x's rounding error rounded again
    (~15-bit activations, HF's greedy tokens on SmolLM2), else llama.cpp's int8 activations alone."""
    if not can_run(w):
        raise ValueError(
            f"MatMulQ takes 4- or 8-bit codes in blocks of 16 or 32 over whole 32 columns, not {w.bits} bits / "
            f"block {w.block_size} of {w.shape}"
        )
    prefix = weight_name or name
    # 8 bits: MatMulNBits' own arrays, shared; 4 bits: this kernel's interleaved ones
    suffix = "" if w.bits == 8 else "_q"
    inputs = [
        x,
        g.weight(f"{prefix}.qweight{suffix}", lambda: pack(w)[0], data),
        g.weight(f"{prefix}.scales{suffix}", lambda: pack(w)[1], data),
    ]
    if w.offsets is not None:
        inputs.append(g.weight(f"{prefix}.block_offsets{suffix}", lambda: pack(w)[2], data))  # type: ignore[arg-type,return-value]
    attrs = {"N": w.shape[0], "bits": w.bits, "block_size": w.block_size, "residual": int(residual)}
    return g.op("MatMulQ", inputs, f"{name}/MatMulQ", out=out, domain=DOMAIN, **attrs)
