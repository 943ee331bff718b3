"""Linear layers on WiCore's own CPU kernel, wicore.MatMulQ (wicore/kernels/csrc/matmul_q_cpu.cc).

llama.cpp's arithmetic: the activations in int8 blocks of 32 (one float scale each), integer dot
products against the weight's codes, one float scale a weight block, and a block offset (Q4_1, Q4_K,
Q5_K ...) times the block's sum of the quantized activations. By default (`residual`) the activations'
rounding error is rounded to int8 again in steps of d / 128 and dotted too: ~15-bit activations, which
keep SmolLM2's greedy near-ties where llama.cpp's int8 flips them, for ~10% of the step. The GGUF's blocks go in as
`BlockQuant` keeps them (wicore/model/quant.py), repacked at the GGUF's own widths:

    input      4 bits (rows in groups of GROUP,         5 / 6 bits (codes that span          8 bits
               N padded with zeros)                     32 / 64 values: Q5_0, Q5_K, Q6_K)
    codes      uint8 [N / 8, K / 32, 8, 16]: a group's  uint8 [N, K / 32, 16 + 4h]: the      uint8 [N, K / bs, bs]
               rows interleaved a block at a time;      4-bit nibbles, then h high bits a     code + 128
               code + 8, column j low nibble, j + 16    code (kernels.h); code + zero_point
               high
    scales     [N / 8, K / bs, 8]                       [N, K / bs]                           [N, K / bs]
    offsets    as the scales, only where the weight has them

bs = 16 (Q6_K) or 32. Scales and offsets of 4-, 5- and 6-bit codes are float16, or a float16 a super-block
times an int8 a block, wherever that gives every float32 value exactly (graph/matmul_q_scales.py), else
float32; 8-bit codes keep float32 ones (`pack`). The 4-bit
interleave makes a block of 8 rows one 128-byte run and its scales one vector, so the kernel addresses
everything from one pointer. 8-bit codes are MatMulNBits' own B (graph/quant.py `pack_codes`), so a head's
float refinement and a tied embedding's GatherBlockQuantized share them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wicore.graph.matmul_q_scales import Narrow, narrow, narrow_offsets
from wicore.graph.ops import DataFile, Graph
from wicore.kernels.library import DOMAIN
from wicore.model.quant import BlockQuant

BLOCK = 32  # activation block (columns)
BLOCK_SIZES = (16, 32)  # weight blocks the kernel takes
GROUP = 8  # 4-bit rows interleaved
NARROW_BITS = (5, 6)  # 8-bit codes that span at most 2**bits values are stored in bits (kernels.h)
# How a prompt's step (x [rows, seq, K] with seq >= 32) runs on AVX-512 (ops.cc): "float", x in float32 against
# the dequantized weight (matmul_q_float.cc), or "int8", llama.cpp's int8 x without the residual on vpdpbusd
# (matmul_q_int8.cc, ~1.5-2x faster). Chosen per tensor by graph/quant.py. Other steps of 32+ rows (32+ decode
# streams) take the float GEMM whatever it says; fewer rows the int8 rows with the residual.
PROMPT_PRECISIONS = ("float", "int8")


def can_run(w: BlockQuant) -> bool:
    """Whether MatMulQ takes this weight (bits 4 or 8, blocks of 16 or 32, whole activation blocks)."""
    return w.bits in (4, 8) and w.block_size in BLOCK_SIZES and w.shape[1] % BLOCK == 0


@dataclass(frozen=True)
class Packed:
    """MatMulQ's inputs for one weight: codes at `bits` (code + zero_point), scales and offsets each as
    float32 or `Narrow` (module doc), offsets = offset_scale * scales + mins where `mins` is narrow."""

    codes: np.ndarray
    bits: int
    zero_point: int
    scales: np.ndarray | Narrow
    offsets: np.ndarray | Narrow | None
    offset_scale: float = 0.0


def code_bits(w: BlockQuant) -> tuple[int, int]:
    """(bits, zero point) the codes are stored in: 4 bits as BlockQuant's, 8-bit codes in 5 or 6 where they
    span so few values (zero point: minus the smallest code), else 8."""
    if w.bits == 4:
        return 4, 8
    low, high = int(w.codes.min()), int(w.codes.max())
    for bits in NARROW_BITS:
        if high - low < 2**bits:
            return bits, -low
    return 8, 128


def pack_codes(w: BlockQuant, bits: int, zero_point: int) -> np.ndarray:
    """The codes in kernels.h's layout for `bits` (the module doc's table)."""
    rows, cols = w.shape
    if bits == 8:  # code + 128 is the code's bits with the top one flipped (two's complement)
        return (np.asarray(w.codes, np.int8).view(np.uint8) ^ 0x80).reshape(rows, cols // w.block_size, w.block_size)
    if bits == 4:
        padded = -(-rows // GROUP) * GROUP
        unsigned = np.zeros((padded, cols), np.uint8)
        unsigned[:rows] = (np.asarray(w.codes, np.int8).view(np.uint8) ^ 0x08) & 0x0F  # code + 8
        halves = unsigned.reshape(padded // GROUP, GROUP, cols // BLOCK, 2, BLOCK // 2)
        return np.ascontiguousarray((halves[:, :, :, 0] | (halves[:, :, :, 1] << 4)).transpose(0, 2, 1, 3))
    u = (w.codes.astype(np.int16) + zero_point).astype(np.uint8).reshape(rows, cols // BLOCK, BLOCK)
    nibbles = (u[:, :, :16] & 0x0F) | ((u[:, :, 16:] & 0x0F) << 4)
    high_bits = bits - 4
    fields = 8 // high_bits  # a byte's fields; byte j holds column j + (32 / fields) i at bits h i
    high = (u >> 4).reshape(rows, cols // BLOCK, fields, BLOCK // fields).astype(np.uint8)
    shifts = (high_bits * np.arange(fields, dtype=np.uint8))[None, None, :, None]
    packed_high = np.bitwise_or.reduce(high << shifts, axis=2).astype(np.uint8)
    return np.ascontiguousarray(np.concatenate([nibbles, packed_high], axis=2))


def pack(w: BlockQuant, narrow_widths: bool = True, narrow_8bit_scales: bool = False, narrow_codes: bool = True) -> Packed:
    """MatMulQ's inputs (the module doc's layouts); `narrow_widths` False: 4- or 8-bit codes and float32
    scales and offsets, as before narrow forms existed (the tests' reference); `narrow_codes` False: 8-bit
    codes kept 8 bits however few values they span (the same values; `matmul_q`).

    Codes that stay 8 bits (Q8_0, and a Q6_K head in the cache: graph/quant.py) keep float32 scales unless
    `narrow_8bit_scales`: they are MatMulNBits' own arrays, shared with the head's refinement; the heads in the
    cache take narrow ones (DotPairs reads them in place; docs/PERFORMANCE.md, issue 37)."""
    bits, zero_point = code_bits(w) if narrow_widths and narrow_codes else (w.bits, 8 if w.bits == 4 else 128)
    scales = np.asarray(w.scales, np.float32)
    offsets = None if w.offsets is None else np.asarray(w.offsets, np.float32)
    packed_scales: np.ndarray | Narrow = scales
    packed_offsets: np.ndarray | Narrow | None = offsets
    offset_scale = 0.0
    if narrow_widths and (bits != 8 or narrow_8bit_scales):
        packed_scales = narrow(scales, w.block_size) or scales
        found = None if offsets is None else narrow_offsets(offsets, scales, w.block_size)
        if found is not None:
            offset_scale, packed_offsets = found
    rows = w.shape[0]
    padded = -(-rows // GROUP) * GROUP if bits == 4 else rows

    def laid_out(a: np.ndarray | Narrow) -> np.ndarray | Narrow:
        if bits != 4:
            return a
        if isinstance(a, np.ndarray):
            return grouped(a, padded)
        return Narrow(grouped(a.half, padded), None if a.ints is None else grouped(a.ints, padded), a.blocks_per_super)

    return Packed(
        pack_codes(w, bits, zero_point),
        bits,
        zero_point,
        laid_out(packed_scales),
        None if packed_offsets is None else laid_out(packed_offsets),
        offset_scale,
    )


def grouped(per_block: np.ndarray, padded: int) -> np.ndarray:
    """[N, K / bs] -> [padded / 8, K / bs, 8], zeros past N, in per_block's dtype."""
    rows, num_blocks = per_block.shape
    out = np.zeros((padded, num_blocks), per_block.dtype)
    out[:rows] = per_block
    return np.ascontiguousarray(out.reshape(padded // GROUP, GROUP, num_blocks).transpose(0, 2, 1))


def inputs(packed: Packed) -> list[tuple[str, np.ndarray] | None]:
    """MatMulQ's inputs 1-7 (ops.cc) as (role, array), None where absent: codes, scales, offsets (float32),
    scales16, scale_ints, mins16, min_ints."""
    out: list[tuple[str, np.ndarray] | None] = [("qweight", packed.codes), None, None, None, None, None, None]
    for at, role, value in ((1, "scales", packed.scales), (2, "block_offsets", packed.offsets)):
        if value is None:
            continue
        if isinstance(value, np.ndarray):
            out[at] = (role, value)
            continue
        half_at = 3 if at == 1 else 5
        out[half_at] = (f"{role}_f16", value.half)
        if value.ints is not None:
            out[half_at + 1] = (f"{role}_ints", value.ints)
    return out


def attributes(
    packed: Packed, w: BlockQuant, residual: bool, prompt_precision: str | None = None
) -> dict[str, int | float | str]:
    """MatMulQ's attributes for `packed` (ops.cc); `prompt_precision` None leaves the attribute out, as graphs
    exported before it did (the float prompt GEMM)."""
    supers = [v.blocks_per_super for v in (packed.scales, packed.offsets) if isinstance(v, Narrow) and v.ints is not None]
    attrs: dict[str, int | float | str] = {
        "N": w.shape[0],
        "bits": packed.bits,
        "block_size": w.block_size,
        "residual": int(residual),
    }
    if len(set(supers)) > 1:
        raise ValueError(f"scales and offsets in super-blocks of different sizes: {supers}")
    attrs.update(zero_point=packed.zero_point, offset_scale=packed.offset_scale, blocks_per_super=supers[0] if supers else 0)
    if prompt_precision is not None:
        if prompt_precision not in PROMPT_PRECISIONS:
            raise ValueError(f"prompt_precision {prompt_precision!r}: expected one of {PROMPT_PRECISIONS}")
        attrs["prompt_precision"] = prompt_precision
    return attrs


def matmul_q(
    g: Graph,
    x: str,
    w: BlockQuant,
    name: str,
    out: str | None = None,
    weight_name: str | None = None,
    data: DataFile | None = None,
    residual: bool = True,
    narrow_codes: bool = True,
    narrow_8bit_scales: bool = False,
    prompt_precision: str = "float",
) -> str:
    """x [..., K] float32 @ wᵀ for w [N, K] on wicore.MatMulQ; `residual`: x's rounding error rounded again
    (~15-bit activations, HF's greedy tokens on SmolLM2), else llama.cpp's int8 activations alone;
    `narrow_codes` False: 5- / 6-bit codes as 8 bits (more bytes, less unpacking: `pack`);
    `narrow_8bit_scales`: 8-bit codes' scales narrow too where exact (`pack`); `prompt_precision`: a prompt's
    steps in float or int8 (PROMPT_PRECISIONS)."""
    if not can_run(w):
        raise ValueError(
            f"MatMulQ takes 4- or 8-bit codes in blocks of 16 or 32 over whole 32 columns, not {w.bits} bits / "
            f"block {w.block_size} of {w.shape}"
        )
    prefix = weight_name or name
    packed = pack(w, narrow_8bit_scales=narrow_8bit_scales, narrow_codes=narrow_codes)
    # 8-bit codes and float32 row-major scales: MatMulNBits' own arrays, shared; 4 bits' grouped ones and
    # 5 / 6 bits' codes: this kernel's own names
    suffix = {4: "_q", 5: "_q5", 6: "_q6", 8: ""}[packed.bits]
    names = [x]
    for entry in inputs(packed):
        if entry is None:
            names.append("")
            continue
        role, array = entry
        own = suffix if role == "qweight" or packed.bits == 4 else ""
        names.append(g.weight(f"{prefix}.{role}{own}", lambda a=array: a, data))  # type: ignore[misc]
    while names[-1] == "":
        names.pop()
    return g.op("MatMulQ", names, f"{name}/MatMulQ", out=out, domain=DOMAIN, **attributes(packed, w, residual, prompt_precision))
