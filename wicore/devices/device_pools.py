"""KV pools (and every OrtValue WiCore allocates for a device) in the EP's own memory for MIGraphX,
CANN and DirectML: the mechanism the CUDA and WebGPU pools use, behind a switch that stays off until a
run on such hardware shows it works. Off, these EPs bind their pools through host memory as before.

    WICORE_DEVICE_POOLS=migraphx,cann,dml   (names from the capability table; any subset)

turns it on for the EPs named: their Device's ort_device becomes the capability's `device_memory`,
so the pools are allocated there (device_alloc.zeros: zeros copied in through ONNX Runtime's binding
allocator for that device), bound in place by the step graphs, and paged by the copy graphs
(wicore.kv.device_store) as on CUDA. How ONNX Runtime's Python API (1.32) names each EP's memory:

    EP         ort_device   OrtDevice it makes                     allocator the binding uses
    dml:N      ("dml", N)   GPU, default memory, vendor 0x1414      GetDmlAllocator (a DirectML build), "DML"
    cann:N     ("cann", N)  NPU, default memory, vendor 0x19E5      GetCannAllocator (a CANN build), "Cann"
    migraphx:N ("gpu", N)   GPU, default memory, no vendor; the     GetMIGraphXAllocator (a MIGraphX
                            pools' zeros ask for vendor 0x1002      build); IOBinding's bind_input /
                            (AMD, OrtValue.ortvalue_from_numpy's    bind_output take no vendor, so the
                            vendor_id)                              block copies bind ("gpu", N): the
                                                                    first run must show ORT matches it
"""

from __future__ import annotations

import os

from wicore.errors import WiCoreError

DEVICE_POOLS_ENV = "WICORE_DEVICE_POOLS"


class DevicePoolsError(WiCoreError):
    """WICORE_DEVICE_POOLS names an EP WiCore cannot keep pools on."""


def requested(known: dict[str, str | None]) -> frozenset[str]:
    """The capability names WICORE_DEVICE_POOLS turns on, checked against `known` (capability name ->
    its device_memory): an unknown name, or an EP without device memory, is an error that says which."""
    names = frozenset(n.strip().lower() for n in os.environ.get(DEVICE_POOLS_ENV, "").split(",") if n.strip())
    for name in sorted(names):
        if name not in known:
            raise DevicePoolsError(
                f"{DEVICE_POOLS_ENV}={os.environ[DEVICE_POOLS_ENV]}: no EP named {name!r}; known: {', '.join(known)}"
            )
        if known[name] is None:
            can = ", ".join(n for n, memory in known.items() if memory is not None)
            raise DevicePoolsError(
                f"{DEVICE_POOLS_ENV}: {name} is not switched this way (the switch is for {can}; cuda, tensorrt and "
                "webgpu keep their pools on the device already, openvino and cpu in host memory)"
            )
    return names
