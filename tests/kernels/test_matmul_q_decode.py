"""wicore.MatMulQ at one row (a decode step) on 4-bit codes: the AVX2 rows (matmul_q_avx2_rows4.inc: a group of 8
interleaved rows a pass), the VNNI ones and the scalar path give the NumPy model's bits, float32 and narrow scales
and offsets alike."""

from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.test_matmul_q import PATHS, gguf_like, random_weight, reference, session


@pytest.mark.parametrize(
    ("block_size", "offsets"), [(32, False), (32, True), (16, False), (16, True)], ids=["Q4_0", "Q4_1", "4bit-16", "4bit-16-off"]
)
@pytest.mark.parametrize("force", PATHS)
@pytest.mark.parametrize("residual", [False, True], ids=["int8", "residual"])
def test_a_4_bit_decode_row_is_its_arithmetic(cpu_library, block_size, offsets, force, residual):
    """203 rows (three tasks of 64 and a part group of 8), K of 11 blocks of 32; an all-zero x block."""
    rng = np.random.default_rng(block_size + 2 * offsets + 4 * residual)
    w = random_weight(rng, 203, 352, 4, block_size, offsets)
    x = rng.standard_t(3, (1, 1, 352)).astype(np.float32)
    x[0, 0, 64:96] = 0
    (y,) = session(cpu_library, w, force, residual).run(None, {"x": x})
    np.testing.assert_array_equal(y[0], reference(x[0], w, residual))


@pytest.mark.parametrize("kind", ["Q4_K", "Q4_1", "Q4_0"])
@pytest.mark.parametrize("force", PATHS)
def test_a_4_bit_decode_row_reads_narrow_scales_as_wide(cpu_library, kind, force):
    """The GGUF's narrow scales and offsets (float16, or a float16 a super-block times an int8), widened per task
    before the rows read them: the float32 forms' bits."""
    rng = np.random.default_rng(len(kind))
    k = 512 if kind.endswith("_K") else 352
    w = gguf_like(rng, kind, 141, k)
    x = rng.standard_t(3, (1, 1, k)).astype(np.float32)
    (y,) = session(cpu_library, w, force, True, narrow_widths=True).run(None, {"x": x})
    np.testing.assert_array_equal(y[0], reference(x[0], w, residual=True))
