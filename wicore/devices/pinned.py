"""Page-locked host arrays for the CUDA EP: NumPy memory registered with the CUDA runtime.

ONNX Runtime copies a host input to a CUDA device with cudaMemcpy. From pageable memory the driver
stages the bytes through buffers of its own, a few GB/s; from memory registered with
cudaHostRegister it is one DMA at the bus's speed. The host KV tier, which an offloaded step copies
in at every step (wicore.kv.offload), is such an array when its pools are on CUDA.

No CUDA Python package is needed: the CUDA runtime library is the one ONNX Runtime's CUDA EP has
already loaded into the process (found in /proc/self/maps), else the one the loader finds by name.
Where there is none, or registration fails (a locked-memory limit), the array stays pageable:
slower copies, the same bytes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import weakref
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path

import numpy as np

from wicore.devices.providers import Device

log = logging.getLogger(__name__)

CUDA_HOST_REGISTER_PORTABLE = 1  # pinned for every CUDA context, not only the current one
SONAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")


def loaded_library(stem: str, maps: Path = Path("/proc/self/maps")) -> str | None:
    """The path of a shared library named `stem`* that this process has mapped, if any."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return None
    for fields in map(str.split, lines):
        if fields and Path(fields[-1]).name.startswith(stem) and ".so" in fields[-1]:
            return fields[-1]
    return None


@cache
def cuda_runtime() -> ctypes.CDLL | None:
    """The CUDA runtime library (the process's own copy first), or None where there is none."""
    candidates = [loaded_library("libcudart"), ctypes.util.find_library("cudart"), *SONAMES]
    for name in candidates:
        if name is None:
            continue
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        return lib
    return None


def pinned_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """np.zeros(shape, dtype), page-locked for CUDA copies where the runtime allows it; it is
    unregistered when the array (and every view of it) is gone."""
    array = np.zeros(shape, dtype)
    lib = cuda_runtime()
    if not array.nbytes or lib is None:
        if lib is None:
            log.info("no CUDA runtime library found: the host KV tier stays pageable")
        return array
    ptr = array.ctypes.data
    status = lib.cudaHostRegister(ptr, array.nbytes, CUDA_HOST_REGISTER_PORTABLE)
    if status != 0:
        log.warning(
            "cudaHostRegister of %.2f GiB failed (error %d): the host KV tier stays pageable", array.nbytes / 2**30, status
        )
        return array
    finalizer = weakref.finalize(array, lib.cudaHostUnregister, ptr)
    finalizer.atexit = False  # at exit the process's pages go anyway, and CUDA may be torn down first
    return array


def host_allocator(devices: Sequence[Device]) -> Callable[[tuple[int, ...], np.dtype], np.ndarray]:
    """How to allocate host KV arrays for pools on `devices`: page-locked if any is a CUDA device."""
    return pinned_zeros if any(d.ort_device[0] == "cuda" for d in devices) else np.zeros
