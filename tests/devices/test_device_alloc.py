"""device_alloc.zeros: buffers made by a graph run on the device, zero-filled, of the asked shape and type."""

import numpy as np
import pytest

from wicore.devices.device_alloc import LARGEST_FILL, by_graph, zeros
from wicore.devices.micrographs import zeros_graph
from wicore.devices.providers import CAPABILITIES, Device, parse_device


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int8])
def test_zeros_have_the_shape_and_type_asked_and_hold_zeros(dtype):
    value = zeros(parse_device("cpu"), (3, 16, 2, 5), dtype)
    array = value.numpy()
    assert array.shape == (3, 16, 2, 5)
    assert array.dtype == np.dtype(dtype)
    assert not array.any()


def test_each_call_is_a_buffer_of_its_own():
    device = parse_device("cpu")
    a, b = zeros(device, (4, 8), np.float16), zeros(device, (4, 8), np.float16)
    assert a.data_ptr() != b.data_ptr()


def test_the_graph_is_one_constant_of_shape_of_the_dtype():
    import onnx

    model = zeros_graph(np.dtype(np.float16), 4)
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["ConstantOfShape"]
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16


def test_the_graph_makes_what_lands_in_the_sessions_memory_and_its_fill_reaches():
    cuda, tensorrt, cpu = (Device(CAPABILITIES[name], "0") for name in ("cuda", "tensorrt", "cpu"))
    pool = (8186, 16, 16, 128)  # a full-attention layer's K of the 27B at 128K: 268 M elements
    assert by_graph(cuda, pool) and by_graph(cpu, pool)
    assert not by_graph(tensorrt, pool)  # its session would not be the CUDA EP's
    assert by_graph(cuda, (LARGEST_FILL,)) and not by_graph(cuda, (LARGEST_FILL + 1,))
    assert not by_graph(cuda, (2**16, 2**16))  # 2**32 elements: cuda::Fill's int32 count would wrap
