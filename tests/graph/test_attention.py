"""graph/attention.py: the attention scale folded into q_proj exactly, GGUF blocks kept."""

from __future__ import annotations

import numpy as np
import pytest

from wicore.graph.attention import is_power_of_two, scaled_weight
from wicore.model.quant import BlockQuant, QuantizedTensor, quantize_symmetric


@pytest.mark.parametrize("value,expected", [(0.125, True), (1.0, True), (64**-0.5, True), (0.1, False), (256**-0.5, True)])
def test_is_power_of_two(value, expected):
    assert is_power_of_two(value) is expected
    assert not is_power_of_two(0.0) and not is_power_of_two(-0.5)


def test_scaled_weight_keeps_the_codes_and_scales_the_blocks_exactly():
    rng = np.random.default_rng(0)
    w = quantize_symmetric(rng.standard_normal((8, 64)).astype(np.float32), 4, 32)
    w = BlockQuant(w.codes, w.scales, rng.uniform(-0.1, 0.1, w.scales.shape).astype(np.float32), 4, 32)
    tensor = QuantizedTensor(w.dequantize(), lambda: w)
    scaled = scaled_weight(tensor, 0.125)
    assert isinstance(scaled, QuantizedTensor) and scaled.blocks is not None
    np.testing.assert_array_equal(scaled.blocks.codes, w.codes)
    np.testing.assert_array_equal(scaled.blocks.dequantize(), w.dequantize() * np.float32(0.125))
    np.testing.assert_array_equal(np.asarray(scaled), np.asarray(tensor) * np.float32(0.125))
    plain = scaled_weight(np.ones((2, 2), np.float32), 0.5)
    assert getattr(plain, "blocks", None) is None and (plain == 0.5).all()
