"""A captured decode step's inputs: typed views into one host buffer, copied to the device in one transfer.

A CUDA graph replays reading its inputs at the addresses it was captured with (wicore.executor.cuda_graphs),
so each batch-size bucket keeps one device buffer per card and a host buffer of the same layout: a step
writes the batch into the host views, then one copy a card moves the whole buffer, where each input was
its own copy (and its own padded array) before: nothing is allocated on the way.

A WebGPU buffer is a handle, not an address a binding can offset into, and ONNX Runtime's WebGPU capture
takes only whole device OrtValues: there (`separate`) each input is an OrtValue of its own on the
device, and `sync` copies each input's view to it, one transfer an input.

The host buffer has two sides (`flip`): under async scheduling the engine thread writes step N+1's
inputs while step N, which wrote the other side, may not have copied its own yet (its copy runs on
the worker, just before its graphs: wicore.engine.lookahead). A side is written again two writes
later, when the step that used it has long returned.
"""

from __future__ import annotations

import numpy as np

Place = tuple[str, int]  # (OrtValue device type, id)


class StepInputs:
    """Inputs of fixed shapes, each a typed view into one host buffer whose bytes one transfer a
    device copies to a buffer of the same layout on each of `devices` (`sync`); `bind` binds each
    input to its place on one of them."""

    ALIGN = 64

    def __init__(self, shapes: dict[str, tuple[tuple[int, ...], type]], *devices: Place, separate: bool = False) -> None:
        from wicore.devices.providers import onnxruntime

        self.offsets: dict[str, int] = {}
        self.shapes = shapes
        size = 0
        for name, (shape, dtype) in shapes.items():
            size = -(-size // self.ALIGN) * self.ALIGN
            self.offsets[name] = size
            size += int(np.prod(shape)) * np.dtype(dtype).itemsize
        self._sides = [np.zeros(max(size, 1), np.uint8) for _ in range(2)]
        self._side = 0
        self._side_views = [self._views(host) for host in self._sides]
        self.host, self.views = self._sides[0], self._side_views[0]
        if not devices:
            raise ValueError("step inputs need a device to copy to")
        self.devices = list(dict.fromkeys(devices))
        ort = onnxruntime()
        self.separate = separate
        self.buffers: dict[Place, object] = {}
        self.values: dict[Place, dict[str, object]] = {}  # separate: each input's own OrtValue on each device
        for d in self.devices:
            if separate:
                self.values[d] = {
                    n: ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, *d) for n, (shape, dtype) in shapes.items()
                }
            else:
                self.buffers[d] = ort.OrtValue.ortvalue_from_shape_and_type([self.host.size], np.uint8, *d)

    def _views(self, host: np.ndarray) -> dict[str, np.ndarray]:
        def view(offset: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
            return host[offset : offset + int(np.prod(shape)) * dtype.itemsize].view(dtype).reshape(shape)

        return {name: view(self.offsets[name], shape, np.dtype(dtype)) for name, (shape, dtype) in self.shapes.items()}

    def flip(self) -> None:
        """Write the other side of the host buffer from now on (`host`, `views`, `put`)."""
        self._side = 1 - self._side
        self.host, self.views = self._sides[self._side], self._side_views[self._side]

    def put(self, name: str, array: np.ndarray, fill: float) -> None:
        """Write `array` into the leading rows / columns of input `name`, `fill` elsewhere; an input
        not held here (one the graphs do not take: an older or newer export's) is skipped."""
        view = self.views.get(name)
        if view is None:
            return
        view.fill(fill)
        view[tuple(slice(0, n) for n in array.shape)] = array

    def fix(self, name: str, array: np.ndarray, fill: float) -> None:
        """`put` into both sides: an input that no step changes."""
        for _ in range(2):
            self.put(name, array, fill)
            self.flip()

    def sync(self, host: np.ndarray | None = None) -> None:
        """Copy `host` (a side's buffer; the side written now by default) to every device's buffer (separate:
        each input's view to its value)."""
        host = self.host if host is None else host
        if not self.separate:
            for buffer in self.buffers.values():
                buffer.update_inplace(host)  # type: ignore[attr-defined]
            return
        views = self._side_views[next(i for i, side in enumerate(self._sides) if side is host)]
        for values in self.values.values():
            for name, value in values.items():
                value.update_inplace(views[name])  # type: ignore[attr-defined]

    def bind(self, binding: object, names: set[str], device: Place | None = None) -> None:
        """Bind the inputs in `names` that are held here at their places on `device` (the first by default)."""
        device = device or self.devices[0]
        if self.separate:
            for name in names & self.offsets.keys():
                binding.bind_ortvalue_input(name, self.values[device][name])  # type: ignore[attr-defined]
            return
        base = self.buffers[device].data_ptr()  # type: ignore[attr-defined]
        for name in names & self.offsets.keys():
            shape, dtype = self.shapes[name]
            binding.bind_input(name, *device, dtype, list(shape), base + self.offsets[name])  # type: ignore[attr-defined]
