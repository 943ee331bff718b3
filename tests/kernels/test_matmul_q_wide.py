"""A head's 5- / 6-bit codes held 8 bits wide by the kernel (ops.cc `wide_codes`, on AVX-512 VNNI CPUs; forced
here with WICORE_MATMULQ_WIDEN, since this project's CPUs may lack VNNI): the widened codes are an 8-bit
export's, and every path gives the same bits widened or not."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from tests.kernels.test_matmul_q import PATHS, gguf_like, has_vnni, reference, session
from wicore.graph.matmul_q import attributes, pack


def widen(path: str, codes: np.ndarray, n: int, k: int, bits: int, zero_point: int, simd: bool) -> np.ndarray:
    """ops.cc's WicoreMatMulQWiden: the kernel's widening of n rows of packed 5- / 6-bit codes."""
    lib = ctypes.CDLL(path)
    lib.WicoreMatMulQWiden.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    lib.WicoreMatMulQWiden.restype = None
    src = np.ascontiguousarray(codes)
    out = np.zeros((n, k), np.uint8)
    lib.WicoreMatMulQWiden(src.ctypes.data, n, k, bits, zero_point, int(simd), out.ctypes.data)
    return out


@pytest.mark.parametrize("kind", ["Q6_K", "Q5_0", "Q5_K"])
@pytest.mark.parametrize("simd", [True, False], ids=["avx2", "scalar"])
def test_widened_codes_are_the_8_bit_exports(cpu_library, kind, simd):
    rng = np.random.default_rng(len(kind) + simd)
    w = gguf_like(rng, kind, 37, 512)
    narrow, wide = pack(w), pack(w, narrow_codes=False)
    assert (narrow.bits, wide.bits, wide.zero_point) == ({"Q6_K": 6}.get(kind, 5), 8, 128)
    got = widen(cpu_library, narrow.codes, 37, 512, narrow.bits, narrow.zero_point, simd)
    np.testing.assert_array_equal(got, wide.codes.reshape(37, 512))


def test_wide_codes_is_said_only_for_narrow_codes():
    rng = np.random.default_rng(5)
    for kind, said in (("Q6_K", True), ("Q8_0", False), ("Q4_K", False)):
        w = gguf_like(rng, kind, 8, 256)
        assert ("wide_codes" in attributes(pack(w), w, True, wide_codes=True)) == said
        assert "wide_codes" not in attributes(pack(w), w, True)


@pytest.mark.parametrize("kind", ["Q6_K", "Q5_0"])
@pytest.mark.parametrize("force", PATHS)
@pytest.mark.parametrize("m", [1, 5, 40], ids=["decode", "tiles", "prompt"])
def test_a_widened_head_gives_the_8_bit_heads_bits(cpu_library, monkeypatch, kind, force, m):
    """The head as the exporter writes it (narrow codes, narrow scales, `wide_codes`), widened (as on VNNI) or
    read narrow (as on AVX2), against the head with 8-bit codes that exports made before: the same output bits,
    on every path, over a ragged last task of 64 rows."""
    rng = np.random.default_rng(m + len(kind))
    k = 512 if kind.endswith("_K") else 352
    w = gguf_like(rng, kind, 64 * 3 + 11, k)
    x = rng.standard_t(3, (1, m, k)).astype(np.float32)
    (want,) = session(cpu_library, w, force, True, narrow_widths=True, narrow_8bit_scales=True, narrow_codes=False).run(
        None, {"x": x}
    )
    for widened in ("1", "0"):
        monkeypatch.setenv("WICORE_MATMULQ_WIDEN", widened)  # read when the kernel is made
        s = session(cpu_library, w, force, True, narrow_widths=True, narrow_8bit_scales=True, wide_codes=True)
        for _ in range(2):  # the second call reads the kept codes
            np.testing.assert_array_equal(s.run(None, {"x": x})[0], want)
    if m == 1 or force != "fast" or not has_vnni(cpu_library):
        np.testing.assert_array_equal(want[0], reference(x[0], w, residual=True))
