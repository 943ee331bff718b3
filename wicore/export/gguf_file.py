"""A GGUF file read in one pass: its metadata as Python values, its tensors as memory-mapped arrays.

gguf-py's `GGUFReader` builds a numpy view for every part of every value, 786k of them for
Gemma 3's 262k-token vocabulary: ~15 s an open. This reads the same layout straight from the
mapped file (a string array in one loop, a numeric array as one slice) and gives what the
exporter used of it: `ReaderField.contents()`'s values and `ReaderTensor`'s fields. gguf-py
stays the source of the type codes and block sizes.

    "GGUF" | u32 version (2, 3) | u64 tensor count | u64 key count
    key count x     string key | u32 value type | value
    tensor count x  string name | u32 n_dims | u64 dims[n_dims] (innermost first) | u32 ggml type | u64 offset
    zero padding up to general.alignment (a u32, default 32)
    tensor data     each tensor at the padded end of the header + its offset

    string = u64 byte length | UTF-8 bytes        array = u32 item type | u64 count | items

Every number is little-endian: big-endian files (llama.cpp's `--bigendian`) are refused. A
file that ends early or holds an impossible value raises ModelSourceError, never an IndexError.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quant_shape_from_byte_shape, quant_shape_to_byte_shape

from wicore.errors import ModelSourceError

_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
# Scalar value types by their struct code (numpy reads the same codes as dtypes).
_SCALARS: dict[int, str] = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}
_SCALAR_STRUCTS = {vtype: struct.Struct("<" + code) for vtype, code in _SCALARS.items()}
_MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp refuses a tensor of more
_MAX_NESTING = 8  # arrays of arrays: a bound on the recursion a corrupt file could ask for
# Tensor types gguf-py gives as typed arrays; the others come as their blocks' bytes.
_TYPED: dict[int, np.dtype] = {
    GGMLQuantizationType.F16: np.dtype("<f2"),
    GGMLQuantizationType.F32: np.dtype("<f4"),
    GGMLQuantizationType.F64: np.dtype("<f8"),
    GGMLQuantizationType.I8: np.dtype("i1"),
    GGMLQuantizationType.I16: np.dtype("<i2"),
    GGMLQuantizationType.I32: np.dtype("<i4"),
    GGMLQuantizationType.I64: np.dtype("<i8"),
}


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file, with gguf-py's ReaderTensor's fields of the same names."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # ggml's order, innermost dimension first: Hugging Face's shape reversed
    # Read-only and memory-mapped, in HF's order: typed for F16/F32/F64/I8-I64, else the blocks
    # as uint8 with the last dimension in bytes (gguf.quants.dequantize takes either).
    data: np.ndarray


@dataclass(frozen=True)
class GGUFContents:
    """What a GGUF file holds. `metadata` maps each key to a str, int, float or bool, or a list of
    them (an array of arrays is a list of lists, where gguf-py's `contents()` flattens it)."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]  # in the file's order


# Values per call of gguf-py's dequantize: 256 KiB of float32, within a core's L2 cache (on the
# 2-core VM, 2^16 took 1.5 s for the 270M's quantized tensors; 2^12 13 s, 2^22 3 s).
_DEQUANTIZE_CHUNK_VALUES = 1 << 16


def dequantize(data: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """`gguf.quants.dequantize(data, qtype)`: the same float32 values bit for bit, in a steady time.

    gguf-py dequantizes 16 rows of `data` per call of its numpy code (`_apply_over_grouped_rows`):
    quick for a tensor's [rows, row bytes], but the block arrays [blocks, block bytes] that
    wicore.export.gguf_quant reads the codes from make that 16 blocks a call, and the per-call
    overhead took 28 s of the 270M's export (on the 2-core VM). Every block dequantizes on its own
    (nothing sums across blocks), so this hands gguf-py the blocks as one row of up to
    `_DEQUANTIZE_CHUNK_VALUES` values at a time, whatever the shape: the same arithmetic on the
    same numbers.
    """
    if qtype in _TYPED or qtype not in GGML_QUANT_SIZES:  # plain arrays, or a type gguf-py refuses itself
        return gguf_dequantize(data, qtype)
    block_elems, type_size = GGML_QUANT_SIZES[qtype]
    shape = quant_shape_from_byte_shape(data.shape, qtype)
    blocks = np.ascontiguousarray(data).view(np.uint8).reshape(-1, type_size)
    out = np.empty((blocks.shape[0], block_elems), dtype=np.float32)
    step = max(1, _DEQUANTIZE_CHUNK_VALUES // block_elems)
    for start in range(0, blocks.shape[0], step):
        chunk = blocks[start : start + step]
        out[start : start + chunk.shape[0]] = gguf_dequantize(chunk.reshape(1, -1), qtype).reshape(-1, block_elems)
    return out.reshape(shape)


class _FormatError(Exception):
    """The file breaks the layout; read_gguf says which file."""


def _past_end(what: str, start: int, num_bytes: int, size: int) -> _FormatError:
    return _FormatError(f"{what} (byte {start}, {num_bytes} bytes) runs past the end of the file ({size} bytes)")


def read_gguf(path: Path) -> GGUFContents:
    """Parse the GGUF file at `path` (the tensors' bytes stay on disk until read)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 4:
                raise _FormatError(f"the file is {size} bytes long")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if buf[:4] != b"GGUF":
            raise ModelSourceError(
                f"{path} is not a GGUF file (it begins with {buf[:4]!r}, not b'GGUF'); pass a .gguf model file"
            )
        return _parse(path, _Cursor(buf))
    except OSError as exc:
        raise ModelSourceError(f"{path} cannot be read: {exc}") from exc
    except _FormatError as exc:
        raise ModelSourceError(f"{path} is not a readable GGUF file (truncated or corrupt?): {exc}") from None


def _parse(path: Path, cur: _Cursor) -> GGUFContents:
    cur.pos = 4
    version = cur.unpack(_U32, "the version")
    if version not in _VERSIONS:
        if int.from_bytes(version.to_bytes(4, "little"), "big") in _VERSIONS:
            raise ModelSourceError(
                f"{path} is a big-endian GGUF, which WiCore does not read; convert it with gguf-py's "
                f"gguf_convert_endian.py {path} little"
            )
        raise ModelSourceError(f"{path} is GGUF version {version}; WiCore reads versions 2 and 3")
    num_tensors, num_keys = cur.unpack(_U64, "the tensor count"), cur.unpack(_U64, "the key count")
    metadata: dict[str, Any] = {}
    alignment = _DEFAULT_ALIGNMENT
    for _ in range(num_keys):
        key = cur.string("a key")
        if key in metadata:
            raise _FormatError(f"key {key} appears twice")
        vtype = cur.unpack(_U32, f"the type of {key}")
        metadata[key] = cur.value(vtype, key)
        if key == "general.alignment":
            alignment = metadata[key]
            if vtype != GGUFValueType.UINT32 or alignment == 0 or alignment & (alignment - 1):
                raise _FormatError(f"general.alignment {alignment!r} is not a u32 power of two")
    infos = [_tensor_info(cur) for _ in range(num_tensors)]
    data_start = -(-cur.pos // alignment) * alignment
    tensors: dict[str, GGUFTensor] = {}
    for name, dims, ggml_type, offset in infos:
        if name in tensors:
            raise _FormatError(f"tensor {name} appears twice")
        tensors[name] = _tensor(cur, name, dims, ggml_type, data_start + offset)
    return GGUFContents(path, version, metadata, tensors)


def _tensor_info(cur: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = cur.string("a tensor name")
    num_dims = cur.unpack(_U32, f"the rank of {name}")
    if num_dims > _MAX_DIMS:
        raise _FormatError(f"tensor {name} has {num_dims} dimensions; llama.cpp reads at most {_MAX_DIMS}")
    dims = struct.unpack_from(f"<{num_dims}Q", cur.buf, cur.take(8 * num_dims, f"the shape of {name}"))
    return name, dims, cur.unpack(_U32, f"the type of {name}"), cur.unpack(_U64, f"the offset of {name}")


def _tensor(cur: _Cursor, name: str, dims: tuple[int, ...], raw_type: int, start: int) -> GGUFTensor:
    """A tensor's data as gguf-py's ReaderTensor gives it: typed, or its blocks' bytes."""
    try:
        ggml_type = GGMLQuantizationType(raw_type)
        block_size, type_size = GGML_QUANT_SIZES[ggml_type]
    except (ValueError, KeyError):
        raise _FormatError(f"tensor {name} has the unknown type {raw_type}") from None
    shape = tuple(reversed(dims))
    num_bytes = math.prod(dims) * type_size // block_size
    dtype = _TYPED.get(ggml_type)
    if dtype is None:
        dtype = np.dtype(np.uint8)
        if not dims:
            raise _FormatError(f"tensor {name} of type {ggml_type.name} has no dimensions")
        try:
            shape = quant_shape_to_byte_shape(shape, ggml_type)
        except ValueError as exc:
            raise _FormatError(f"tensor {name}: {exc}") from None
    if start + num_bytes > len(cur.buf):
        raise _past_end(f"the data of tensor {name}", start, num_bytes, len(cur.buf))
    data = np.frombuffer(cur.buf, dtype, num_bytes // dtype.itemsize, start) if num_bytes else np.empty(0, dtype)
    return GGUFTensor(name, ggml_type, dims, data.reshape(shape))


class _Cursor:
    """A read position in the mapped file; every read checks that the file holds it."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, num_bytes: int, what: str) -> int:
        """The offset of the next `num_bytes` bytes, moved past."""
        start = self.pos
        if num_bytes > len(self.buf) - start:
            raise _past_end(what, start, num_bytes, len(self.buf))
        self.pos = start + num_bytes
        return start

    def unpack(self, scalar: struct.Struct, what: str) -> Any:
        return scalar.unpack_from(self.buf, self.take(scalar.size, what))[0]

    def string(self, what: str) -> str:
        num_bytes = self.unpack(_U64, f"the length of {what}")
        start = self.take(num_bytes, what)
        try:
            return str(self.buf[start : start + num_bytes], "utf-8")
        except UnicodeDecodeError as exc:
            raise _FormatError(f"{what} at byte {start} is not UTF-8 ({exc.reason})") from None

    def value(self, vtype: int, key: str, depth: int = 0) -> Any:
        scalar = _SCALAR_STRUCTS.get(vtype)
        if scalar is not None:
            return self.unpack(scalar, key)
        if vtype == GGUFValueType.STRING:
            return self.string(key)
        if vtype != GGUFValueType.ARRAY:
            raise _FormatError(f"{key} has the unknown value type {vtype}")
        item_type, count = self.unpack(_U32, f"the item type of {key}"), self.unpack(_U64, f"the length of {key}")
        code = _SCALARS.get(item_type)
        if code is not None:
            dtype = np.dtype("<" + code)
            start = self.take(count * dtype.itemsize, key)
            return np.frombuffer(self.buf, dtype, count, start).tolist() if count else []
        if item_type == GGUFValueType.STRING:
            return self.strings(count, key)
        if depth == _MAX_NESTING:
            raise _FormatError(f"{key} nests arrays more than {_MAX_NESTING} deep")
        return [self.value(item_type, key, depth + 1) for _ in range(count)]

    def strings(self, count: int, key: str) -> list[str]:
        """An array of `count` strings, the vocabulary's 262k among them: one loop, no cursor calls."""
        buf, pos, size, out = self.buf, self.pos, len(self.buf), []
        unpack_length = _U64.unpack_from
        for index in range(count):
            if pos + 8 > size:
                raise _past_end(f"the length of {key}[{index}]", pos, 8, size)
            (num_bytes,) = unpack_length(buf, pos)
            end = pos + 8 + num_bytes
            if end > size:
                raise _past_end(f"{key}[{index}]", pos + 8, num_bytes, size)
            try:
                out.append(str(buf[pos + 8 : end], "utf-8"))
            except UnicodeDecodeError as exc:
                raise _FormatError(f"{key}[{index}] at byte {pos + 8} is not UTF-8 ({exc.reason})") from None
            pos = end
        self.pos = pos
        return out
