"""GGUF quantized blocks transcoded, without loss, into `BlockQuant` (wicore.model.quant).

The table of which GGUF type becomes which codes, scales and offsets is in
wicore.model.quant's docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from wicore.export.gguf_file import dequantize
from wicore.model.quant import BlockQuant


@dataclass(frozen=True)
class _Layout:
    """Where one GGUF block type keeps its scale fields, and how its codes map to ours."""

    bits: int
    sub_block: int  # elements per scale
    unit: Callable[[np.ndarray], None]  # sets the block's scale fields so that dequantize gives the raw codes
    fields: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray | None]]  # (scale, offset) per sub-block
    code_shift: int  # added to the unit-dequantized values to get our signed codes
    read_codes: Callable[[np.ndarray], np.ndarray] | None = None  # a direct read, where the codes are plain bytes


_F16_ONE = np.array([1.0], dtype=np.float16).view(np.uint8)
_F16_ZERO = np.zeros(2, dtype=np.uint8)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 field at byte `start` of each block, as float32 [n_blocks, 1]."""
    return np.ascontiguousarray(blocks[:, start : start + 2]).view(np.float16).astype(np.float32)


def _unit_d(blocks: np.ndarray) -> None:  # Q8_0, Q5_0, Q4_0: d at bytes 0:2
    blocks[:, 0:2] = _F16_ONE


def _unit_d_m(blocks: np.ndarray) -> None:  # Q4_1, Q5_1: d at 0:2, m at 2:4
    blocks[:, 0:2] = _F16_ONE
    blocks[:, 2:4] = _F16_ZERO


def _unit_k(blocks: np.ndarray) -> None:  # Q4_K, Q5_K: d 0:2, dmin 2:4, 12 bytes of 6-bit scales/mins 4:16
    blocks[:, 0:2] = _F16_ONE
    blocks[:, 2:4] = _F16_ZERO
    blocks[:, 4:8] = 1  # scales 0-3 = 1 (low 6 bits), their high bits (mins' packing) 0
    blocks[:, 8:12] = 0  # mins 0-3 = 0
    blocks[:, 12:16] = 1  # scales 4-7 low nibble = 1, mins 4-7 = 0


def _unit_q6k(blocks: np.ndarray) -> None:  # Q6_K: int8 scales at 192:208, d at 208:210
    blocks[:, 192:208] = 1
    blocks[:, 208:210] = _F16_ONE


def _fields_d(blocks: np.ndarray) -> tuple[np.ndarray, None]:
    return _f16(blocks, 0), None


def _fields_d_m(shift: int) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    def fields(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d, m = _f16(blocks, 0), _f16(blocks, 2)
        return d, (np.float32(shift) * d + m).astype(np.float32)

    return fields


def _fields_k(shift: int) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    def fields(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        from gguf.quants import Q4_K

        sc, m = Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))
        scale = _f16(blocks, 0) * sc.astype(np.float32)  # as gguf: d * sc, in float32
        minimum = _f16(blocks, 2) * m.astype(np.float32)
        return scale, (np.float32(shift) * scale - minimum).astype(np.float32)

    return fields


def _fields_q6k(blocks: np.ndarray) -> tuple[np.ndarray, None]:
    sc = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)
    return _f16(blocks, 208) * sc, None


def _layouts() -> dict[int, _Layout]:
    from gguf import GGMLQuantizationType as T

    return {
        T.Q8_0: _Layout(8, 32, _unit_d, _fields_d, 0, lambda blocks: blocks[:, 2:34].view(np.int8)),
        T.Q5_0: _Layout(8, 32, _unit_d, _fields_d, 0),
        T.Q4_0: _Layout(4, 32, _unit_d, _fields_d, 0),
        T.Q6_K: _Layout(8, 16, _unit_q6k, _fields_q6k, 0),
        T.Q4_K: _Layout(4, 32, _unit_k, _fields_k(8), -8),
        T.Q5_K: _Layout(8, 32, _unit_k, _fields_k(0), 0),
        T.Q4_1: _Layout(4, 32, _unit_d_m, _fields_d_m(8), -8),
        T.Q5_1: _Layout(8, 32, _unit_d_m, _fields_d_m(0), 0),
    }


def can_transcode(qtype: int) -> bool:
    """Whether a GGUF tensor type maps losslessly onto BlockQuant."""
    return qtype in _layouts()


def transcode_gguf(data: np.ndarray, qtype: int, shape: tuple[int, int]) -> BlockQuant:
    """A GGUF tensor's raw bytes (GGUFTensor.data of wicore.export.gguf_file) -> BlockQuant of `shape` [rows, cols].

    Raises ValueError for a type `can_transcode` refuses."""
    import gguf

    layout = _layouts().get(qtype)
    if layout is None:
        raise ValueError(f"GGUF type {gguf.GGMLQuantizationType(qtype).name} has no lossless block encoding")
    gtype = gguf.GGMLQuantizationType(qtype)  # one of _layouts(): a known type
    block_elems, type_size = gguf.GGML_QUANT_SIZES[gtype]
    rows, cols = shape
    blocks = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1, type_size)
    if blocks.shape[0] * block_elems != rows * cols:
        raise ValueError(f"{blocks.shape[0]} blocks of {block_elems} do not make a {shape} tensor")
    if layout.read_codes is not None:
        codes = np.ascontiguousarray(layout.read_codes(blocks)).reshape(rows, cols)
    else:
        unit = blocks.copy()
        layout.unit(unit)
        raw = dequantize(unit, gtype).reshape(-1)  # small integers, exact in float32
        codes = (raw.astype(np.int16) + layout.code_shift).astype(np.int8).reshape(rows, cols)
    scale, offset = layout.fields(blocks)
    per_row = cols // layout.sub_block
    scales = scale.astype(np.float32).reshape(rows, per_row)
    offsets = None if offset is None else offset.reshape(rows, per_row)
    return BlockQuant(codes, scales, offsets, layout.bits, layout.sub_block)
