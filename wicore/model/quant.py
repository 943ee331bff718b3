"""Blockwise-quantized weights: GGUF blocks transcoded losslessly, float weights quantized.

One representation, `BlockQuant`, for every linear weight of the `ort-quant` op
flavour. A weight [rows, cols] (Hugging Face's [out, in]) is cut along cols into
blocks of `block_size`; each block has one scale and, optionally, one offset:

    w[r, c] = scales[r, c // block_size] * codes[r, c]  (+ offsets[r, c // block_size])

with signed integer codes in [-2**(bits-1), 2**(bits-1)). This is exactly what
MatMulNBits computes with its default zero point 2**(bits-1); the offset (a
per-block constant, which MatMulNBits can only express as a float zero point,
slow or refused on CPU) is added by a small correction matmul in the graph.

GGUF types map onto it without loss (the integer codes are read out by
`gguf.quants.dequantize` itself, with the block's scale fields set to 1):

    Q8_0  d * q,             q in [-128, 127]   ->  8 bits, block 32
    Q5_0  d * (q - 16)                          ->  8 bits, block 32
    Q4_0  d * (q - 8)                           ->  4 bits, block 32
    Q6_K  d * sc16 * (q - 32)                   ->  8 bits, block 16
    Q4_K  d * sc * q - dmin * m,  q in [0, 15]  ->  4 bits, block 32, codes q - 8, offset 8 s - dmin m
    Q5_K  d * sc * q - dmin * m,  q in [0, 31]  ->  8 bits, block 32, codes q,     offset -dmin m
    Q4_1  d * q + m                             ->  4 bits, block 32, codes q - 8, offset 8 d + m
    Q5_1  d * q + m                             ->  8 bits, block 32, codes q,     offset m

Other types (and F32/F16/BF16 tensors) are dequantized and re-quantized
symmetrically (`quantize_symmetric`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SUPPORTED_BITS = (4, 8)


@dataclass(frozen=True)
class BlockQuant:
    """A [rows, cols] weight as integer codes with per-block scales (and offsets); see the module doc."""

    codes: np.ndarray  # int8 [rows, cols]
    scales: np.ndarray  # float32 [rows, cols // block_size]
    offsets: np.ndarray | None  # float32 [rows, cols // block_size], None when symmetric
    bits: int
    block_size: int

    def __post_init__(self) -> None:
        rows, cols = self.codes.shape
        if self.bits not in SUPPORTED_BITS:
            raise ValueError(f"bits {self.bits}: expected one of {SUPPORTED_BITS}")
        if cols % self.block_size:
            raise ValueError(f"{cols} columns are not a multiple of the block size {self.block_size}")
        if self.scales.shape != (rows, cols // self.block_size):
            raise ValueError(f"scales {self.scales.shape} do not match codes {self.codes.shape} / {self.block_size}")
        if self.offsets is not None and self.offsets.shape != self.scales.shape:
            raise ValueError(f"offsets {self.offsets.shape} do not match scales {self.scales.shape}")

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.codes.shape
        return rows, cols

    def dequantize(self) -> np.ndarray:
        """The float32 weight these codes stand for."""
        rows, cols = self.codes.shape
        blocks = self.codes.reshape(rows, -1, self.block_size).astype(np.float32)
        w = self.scales[:, :, None] * blocks
        if self.offsets is not None:
            w = w + self.offsets[:, :, None]
        return w.reshape(rows, cols)

    def widen(self, bits: int, block_size: int) -> BlockQuant:
        """The same values with more bits per code and/or smaller blocks (both lossless)."""
        if bits < self.bits or self.block_size % block_size:
            raise ValueError(f"cannot narrow {self.bits} bits / block {self.block_size} to {bits} / {block_size}")
        repeat = self.block_size // block_size
        offsets = None if self.offsets is None else np.repeat(self.offsets, repeat, axis=1)
        return BlockQuant(self.codes, np.repeat(self.scales, repeat, axis=1), offsets, bits, block_size)


class QuantizedTensor(np.ndarray):
    """A float32 weight dequantized from a source's blocks that still knows those blocks.

    Portable graphs use it as the plain array it is; the ort-quant flavour reads
    `blocks` (transcoded on first use) and so never re-quantizes what was already
    quantized. Views and results of arithmetic are plain values: their `blocks` is None.
    """

    _source: Callable[[], BlockQuant] | None
    _blocks: BlockQuant | None

    def __new__(cls, values: np.ndarray, blocks: Callable[[], BlockQuant]) -> QuantizedTensor:
        obj = np.asarray(values).view(cls)
        obj._source = blocks
        return obj

    def __array_finalize__(self, obj: object) -> None:
        self._source = None
        self._blocks = None

    @property
    def blocks(self) -> BlockQuant | None:
        if self._blocks is None and self._source is not None:
            self._blocks = self._source()
            if self._blocks.shape != self.shape:
                raise ValueError(f"blocks of shape {self._blocks.shape} behind a tensor of shape {self.shape}")
        return self._blocks


def concat_rows(parts: list[BlockQuant]) -> BlockQuant:
    """Stack weights along rows (fused q|k|v or gate|up), in the widest encoding any part needs."""
    bits = max(p.bits for p in parts)
    block_size = min(p.block_size for p in parts)
    parts = [p.widen(bits, block_size) for p in parts]
    offsets = None
    if any(p.offsets is not None for p in parts):
        offsets = np.concatenate([np.zeros_like(p.scales) if p.offsets is None else p.offsets for p in parts])
    return BlockQuant(
        np.concatenate([p.codes for p in parts]), np.concatenate([p.scales for p in parts]), offsets, bits, block_size
    )


def quantize_symmetric(w: np.ndarray, bits: int, block_size: int = 32) -> BlockQuant:
    """Round-to-nearest symmetric quantization: scale = max|w| / (2**(bits-1) - 1) per block."""
    rows, cols = w.shape
    if cols % block_size:
        raise ValueError(f"{cols} columns are not a multiple of the block size {block_size}")
    qmax = 2 ** (bits - 1) - 1
    blocks = np.asarray(w, dtype=np.float32).reshape(rows, -1, block_size)
    scales = np.abs(blocks).max(axis=-1) / np.float32(qmax)
    inverse = np.divide(1.0, scales, out=np.zeros_like(scales), where=scales > 0)
    codes = np.clip(np.rint(blocks * inverse[:, :, None]), -qmax, qmax).astype(np.int8)
    return BlockQuant(codes.reshape(rows, cols), scales.astype(np.float32), None, bits, block_size)
