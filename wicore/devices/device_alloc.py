"""Zero-filled buffers on a device, allocated where the device's sessions allocate.

`OrtValue.ortvalue_from_numpy` (or `ortvalue_from_shape_and_type`) with a CUDA device allocates from
an arena that ONNX Runtime's Python binding keeps for itself, apart from the sessions' (whose free
space they cannot use). KV pools made there cost the engine about twice their size on an H100:
2 full-attention layers of the 27B at 128K (2.2 GiB of pools) held 1.8 GiB more than the same
engine with its pools made here, and at full depth 38.5 -> 29.6 GiB (docs/PERFORMANCE.md, "the KV
pools' memory"). Which allocations the binding's arena adds was not isolated: pools alone in a bare
process cost their size either way (measured too). So the pools, the largest buffers WiCore makes,
come from a one-node graph (ConstantOfShape) run on the device with its output bound there:
ONNX Runtime allocates the output from the session's arena: the device's shared one on CUDA
(providers.shared_cuda_arena, grown by exactly what is asked), or with WICORE_CUDA_SHARED_ARENA=0
this session's own (grown the same way; the CUDA EP's option). Zeros come for free: masked-out
slots must hold finite values (kv_buffers.py). `by_graph` says where the old way stays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np

from wicore.devices.micrographs import zeros_graph
from wicore.devices.providers import Device, onnxruntime, session_options

# ConstantOfShape's CUDA kernel (cuda::Fill) counts elements in an int32: a larger tensor would be
# left partly unfilled, without an error (onnxruntime/core/providers/cuda/cu_inc/common.cuh, 1.31)
LARGEST_FILL = 2**31 - 1


def by_graph(device: Device, shape: Sequence[int]) -> bool:
    """Whether zeros() makes this buffer by a graph run: where the output lands in the memory the
    sessions allocate from (the CPU, the CUDA EP) and the fill kernel reaches every element.
    Otherwise (TensorRT, MIGraphX, CANN and DirectML with WICORE_DEVICE_POOLS, a tensor of more than
    LARGEST_FILL elements) it is made as before: zeros copied from the host through the binding's own
    allocator."""
    if math.prod(shape) > LARGEST_FILL:
        return False
    return device.ort_device[0] == "cpu" or device.capability.shares_cuda_arena


def zeros(device: Device, shape: Sequence[int], dtype: Any) -> Any:
    """A new OrtValue of `shape` and `dtype`, all zeros, in `device`'s memory (its ort_device)."""
    kind, index = device.ort_device
    if not by_graph(device, shape):
        vendor = device.capability.device_vendor  # MIGraphX's "gpu" names none (device_pools.py)
        extra = {} if vendor is None or kind == "cpu" else {"vendor_id": vendor}
        return onnxruntime().OrtValue.ortvalue_from_numpy(np.zeros(shape, dtype), kind, index, **extra)
    session = _session(device, np.dtype(dtype).str, len(shape))
    binding = session.io_binding()
    binding.bind_cpu_input("shape", np.array(shape, np.int64))
    binding.bind_output("zeros", kind, index)
    session.run_with_iobinding(binding)
    return binding.get_outputs()[0]


def buffer_pair(device: Device, shape: Sequence[int], dtype: Any) -> tuple[tuple[Any, Any], tuple[np.ndarray, np.ndarray] | None]:
    """Two zero-filled buffers (a key and a value) for `device`: their OrtValues, and their NumPy
    arrays where they live in host memory (bound zero-copy; None on an accelerator)."""
    if device.ort_device[0] == "cpu":
        ort = onnxruntime()
        key, value = np.zeros(shape, dtype), np.zeros(shape, dtype)
        return (ort.OrtValue.ortvalue_from_numpy(key), ort.OrtValue.ortvalue_from_numpy(value)), (key, value)
    return (zeros(device, shape, dtype), zeros(device, shape, dtype)), None


@cache
def _session(device: Device, dtype: str, rank: int) -> Any:
    ort = onnxruntime()
    return ort.InferenceSession(
        zeros_graph(np.dtype(dtype), rank).SerializeToString(),
        sess_options=session_options(1, devices=[device]),
        providers=device.providers(),
    )
