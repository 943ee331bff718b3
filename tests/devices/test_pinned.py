"""Page-locked host arrays (wicore.devices.pinned): which CUDA runtime is used, what is registered
and unregistered, and the pageable fallback. This machine has no CUDA runtime: the registration
calls go to a recording stand-in for libcudart (the CUDA copy speed-up itself is measured by
tools/bench_stage_copy.py on a GPU)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from wicore.devices import pinned
from wicore.devices.providers import CAPABILITIES, Device


class FakeCudart:
    """Records cudaHostRegister / cudaHostUnregister as the C functions would be called."""

    def __init__(self, status: int = 0) -> None:
        self.status = status
        self.registered: list[tuple[int, int, int]] = []
        self.unregistered: list[int] = []

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        self.registered.append((ptr, size, flags))
        return self.status

    def cudaHostUnregister(self, ptr: int) -> int:
        self.unregistered.append(ptr)
        return 0


@pytest.fixture
def cudart(monkeypatch):
    def use(lib):
        monkeypatch.setattr(pinned, "cuda_runtime", lambda: lib)
        return lib

    return use


def test_the_loaded_cuda_runtime_is_found_in_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 11 /usr/lib/libc.so.6\n"
        "7f02-7f03 rw-p 00000000 00:00 0 \n"
        "7f04-7f05 r-xp 00000000 08:01 12 /opt/venv/nvidia/cu13/lib/libcudart.so.13\n"
    )
    assert pinned.loaded_library("libcudart", maps) == "/opt/venv/nvidia/cu13/lib/libcudart.so.13"
    assert pinned.loaded_library("libcublas", maps) is None
    assert pinned.loaded_library("libcudart", tmp_path / "absent") is None


def test_a_registered_array_is_zeros_of_its_shape_and_is_unregistered_when_the_last_view_goes(cudart):
    lib = cudart(FakeCudart())
    array = pinned.pinned_zeros((3, 4, 8), np.dtype(np.float16))
    assert array.shape == (3, 4, 8) and array.dtype == np.float16 and not array.any()
    ptr = array.ctypes.data
    assert lib.registered == [(ptr, 3 * 4 * 8 * 2, pinned.CUDA_HOST_REGISTER_PORTABLE)]
    view = array[1]
    del array
    gc.collect()
    assert lib.unregistered == []  # a view keeps the memory, and so its registration
    del view
    gc.collect()
    assert lib.unregistered == [ptr]


def test_without_a_runtime_or_when_registration_fails_the_array_stays_pageable(cudart):
    cudart(None)
    assert pinned.pinned_zeros((2, 2), np.dtype(np.float32)).tolist() == [[0.0, 0.0], [0.0, 0.0]]
    lib = cudart(FakeCudart(status=2))  # cudaErrorMemoryAllocation
    array = pinned.pinned_zeros((5,), np.dtype(np.float32))
    del array
    gc.collect()
    assert len(lib.registered) == 1 and lib.unregistered == []  # nothing to unregister
    empty = pinned.pinned_zeros((0, 4), np.dtype(np.float32))
    assert empty.shape == (0, 4) and len(lib.registered) == 1  # an empty tier registers nothing


def test_host_kv_arrays_are_page_locked_only_for_pools_on_cuda():
    cpu, cuda = Device(CAPABILITIES["cpu"], "0"), Device(CAPABILITIES["cuda"], "1")
    assert pinned.host_allocator([cpu]) is np.zeros
    assert pinned.host_allocator([cpu, cuda]) is pinned.pinned_zeros
