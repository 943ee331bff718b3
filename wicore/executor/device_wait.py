"""Wait for a CUDA device's work with the GIL released.

ONNX Runtime's replay of a captured CUDA graph returns once the graph is launched, not run; the
first host read after it (an OrtValue's `numpy()`, or the next step's input copy) then waits for the
device inside a call that holds the GIL. Under async scheduling that froze the engine thread for
the whole device step, so nothing overlapped it (an H200, 2026-11-28, docs/PERFORMANCE.md). The CUDA
runtime's `cudaDeviceSynchronize`, called through ctypes (whose foreign calls release the GIL), waits
while the engine thread runs: the library is the one ONNX Runtime's CUDA EP loaded in the process.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import cache

NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")


@cache
def cuda_runtime() -> ctypes.CDLL | None:
    """The CUDA runtime library loaded in this process (a path from /proc/self/maps first, then by
    soname), or None where there is none."""
    try:
        with open("/proc/self/maps") as maps:
            loaded = sorted({line.split()[-1] for line in maps if "libcudart.so" in line})
    except OSError:
        loaded = []
    for name in (*loaded, *NAMES):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def device_waiter(place: tuple[str, int]) -> Callable[[], None] | None:
    """A function that waits for every stream of the CUDA device `place` with the GIL released, or
    None: a host place, or no CUDA runtime found (the next host read then waits, holding the GIL)."""
    kind, index = place
    runtime = cuda_runtime() if kind == "cuda" else None
    if runtime is None:
        return None

    def wait() -> None:
        for call, args in ((runtime.cudaSetDevice, (index,)), (runtime.cudaDeviceSynchronize, ())):
            error = call(*args)
            if error:
                raise RuntimeError(f"{call.__name__}: CUDA error {error}")

    return wait
