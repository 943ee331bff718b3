"""Linear layers on WiCore's own CPU kernel, wicore.MatMulQ (wicore/kernels/csrc/matmul_q_cpu.cc).

llama.cpp's arithmetic: the activations in int8 blocks of 32 (one float scale each), integer dot
products against the weight's codes, one float scale a weight block, and a block offset (Q4_1, Q4_K,
Q5_K ...) times the block's sum of the quantized activations. The GGUF's blocks go in as
`BlockQuant` keeps them (wicore/model/quant.py), repacked:

    input      shape                    holds
    codes      uint8 [N, K * bits / 8]  code + 2**(bits-1); 4 bits: per 32 columns 16 bytes,
                                        column j in the low nibble and column j + 16 in the high one
    scales     float32 [N, K / bs]      bs = 16 (Q6_K) or 32
    offsets    float32 [N, K / bs]      only where the weight has them (an optional input)

8-bit codes are MatMulNBits' own B (graph/quant.py `pack_codes`, [N, K / bs, bs]), so a head's float
refinement and a tied embedding's GatherBlockQuantized share them.
"""

from __future__ import annotations

import numpy as np

from wicore.graph.ops import DataFile, Graph
from wicore.kernels.library import DOMAIN
from wicore.model.quant import BlockQuant

BLOCK = 32  # activation block (columns)
BLOCK_SIZES = (16, 32)  # weight blocks the kernel takes


def can_run(w: BlockQuant) -> bool:
    """Whether MatMulQ takes this weight (bits 4 or 8, blocks of 16 or 32, whole activation blocks)."""
    return w.bits in (4, 8) and w.block_size in BLOCK_SIZES and w.shape[1] % BLOCK == 0


def pack(w: BlockQuant) -> np.ndarray:
    """MatMulQ's codes (the module doc's layout): 8 bits uint8 [N, K / bs, bs], 4 bits [N, K / 2]."""
    rows, cols = w.shape
    if w.bits == 8:  # code + 128 is the code's bits with the top one flipped (two's complement)
        return (np.asarray(w.codes, np.int8).view(np.uint8) ^ 0x80).reshape(rows, cols // w.block_size, w.block_size)
    unsigned = (np.asarray(w.codes, np.int8).view(np.uint8) ^ 0x08) & 0x0F  # code + 8: two's complement, top bit flipped
    blocks = unsigned.reshape(rows, cols // BLOCK, 2, BLOCK // 2)
    return (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(rows, cols // 2)


def matmul_q(
    g: Graph,
    x: str,
    w: BlockQuant,
    name: str,
    out: str | None = None,
    weight_name: str | None = None,
    data: DataFile | None = None,
) -> str:
    """x [..., K] float32 @ wᵀ for w [N, K] on wicore.MatMulQ."""
    if not can_run(w):
        raise ValueError(
            f"MatMulQ takes 4- or 8-bit codes in blocks of 16 or 32 over whole 32 columns, not {w.bits} bits / "
            f"block {w.block_size} of {w.shape}"
        )
    prefix = weight_name or name
    # 8 bits: MatMulNBits' own B (pack_codes), shared with a head's refinement; 4 bits: this layout
    codes_name = f"{prefix}.qweight" if w.bits == 8 else f"{prefix}.qweight_q"
    codes = g.weight(codes_name, lambda: pack(w), data)
    scales = g.weight(f"{prefix}.scales", lambda: w.scales.astype(np.float32), data)
    inputs = [x, codes, scales]
    if w.offsets is not None:
        offsets = w.offsets  # a local, so that the lambda sees it narrowed
        inputs.append(g.weight(f"{prefix}.block_offsets", lambda: offsets.astype(np.float32), data))
    return g.op("MatMulQ", inputs, f"{name}/MatMulQ", out=out, domain=DOMAIN, bits=w.bits, block_size=w.block_size)
