"""wicore.export.gguf_file.dequantize: gguf-py's dequantize bit for bit, on every block type gguf-py
reads, across the chunks it hands gguf-py, and on the packaged 270M's tensors."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from wicore.export import gguf_file
from wicore.export.gguf_file import dequantize

PLAIN = [T.F32, T.F16]
BLOCK_TYPES = [t for t in GGML_QUANT_SIZES if t not in (*PLAIN, T.Q8_1, T.Q8_K, T.Q1_0) and GGML_QUANT_SIZES[t][0] > 1]


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal shape, dtype and bits (a NaN's payload and -0.0 included)."""
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def random_bytes(qtype: T, rows: int, blocks_per_row: int) -> np.ndarray:
    """[rows, row bytes] of random blocks: every bit pattern, float16 scales that are NaN or inf included."""
    size = GGML_QUANT_SIZES[qtype][1]
    return np.random.default_rng(int(qtype)).integers(0, 256, (rows, blocks_per_row * size), dtype=np.uint8)


@pytest.mark.parametrize("qtype", [*BLOCK_TYPES, T.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("chunk_blocks", [1, 3, None], ids=["chunk1", "chunk3", "default"])
def test_dequantize_is_gguf_py_bit_for_bit(qtype, chunk_blocks, monkeypatch):
    """Chunks of 1 and 3 blocks (the last chunk short: 7 x 5 blocks) and the default of one chunk."""
    if chunk_blocks is not None:
        monkeypatch.setattr(gguf_file, "_DEQUANTIZE_CHUNK_VALUES", chunk_blocks * GGML_QUANT_SIZES[qtype][0])
    data = random_bytes(qtype, 7, 5)
    with np.errstate(all="ignore"):  # random scales: inf and NaN on both sides
        assert_same_bits(dequantize(data, qtype), gguf.quants.dequantize(data, qtype))
        flat = data.reshape(-1)
        assert_same_bits(dequantize(flat, qtype), gguf.quants.dequantize(flat, qtype))


@pytest.mark.parametrize("qtype", PLAIN, ids=lambda t: t.name)
def test_plain_arrays_are_gguf_py_s(qtype):
    data = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32 if qtype == T.F32 else np.float16)
    got = dequantize(data, qtype)
    want = gguf.quants.dequantize(data, qtype)
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    np.testing.assert_array_equal(got, want)


def test_a_type_gguf_py_cannot_dequantize_raises_as_gguf_py_does():
    """Q8_1 (llama.cpp's activation blocks, never in a model file): gguf-py has no dequantize for it,
    and wicore.export.gguf.read_tensor turns the NotImplementedError into UnsupportedModelError."""
    block = np.zeros((1, GGML_QUANT_SIZES[T.Q8_1][1]), np.uint8)
    with pytest.raises(NotImplementedError, match="Q8_1"):
        gguf.quants.dequantize(block, T.Q8_1)
    with pytest.raises(NotImplementedError, match="Q8_1"):
        dequantize(block, T.Q8_1)


@pytest.mark.slow
def test_the_packaged_gemma_file_dequantizes_as_gguf_py_does():
    """One tensor of every type in the real 270M GGUF (the 168 MB token embedding apart: gguf-py's own
    dequantize takes ~20 s on it; the graph tests check the exported model against HF)."""
    from wicore.export.gguf_file import read_gguf
    from wicore.export.sources import PACKAGED, packaged_gguf

    pytest.importorskip(PACKAGED["gemma3-270m"])
    first = {}
    for t in read_gguf(packaged_gguf("gemma3-270m")).tensors.values():
        if t.name != "token_embd.weight":
            first.setdefault(t.tensor_type, t)
    assert {T.F32, T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K} <= set(first)
    for qtype, t in first.items():
        assert_same_bits(dequantize(t.data, qtype), gguf.quants.dequantize(t.data, qtype))
