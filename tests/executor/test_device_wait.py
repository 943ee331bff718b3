"""device_wait (wicore.executor.device_wait): the wait after a replayed CUDA graph goes through the CUDA
runtime (a ctypes call, which releases the GIL), on the replaying device, and fails loudly on a CUDA
error; a host place waits for nothing."""

from __future__ import annotations

import pytest

from wicore.executor import device_wait


class _Runtime:
    def __init__(self, sync_error: int = 0) -> None:
        self.calls: list[tuple[str, tuple[int, ...]]] = []
        self.sync_error = sync_error

    def __getattr__(self, name: str):
        def call(*args: int) -> int:
            self.calls.append((name, args))
            return self.sync_error if name == "cudaDeviceSynchronize" else 0

        call.__name__ = name
        return call


def test_a_host_place_waits_for_nothing():
    assert device_wait.device_waiter(("cpu", 0)) is None


def test_a_cuda_place_sets_its_device_then_synchronizes(monkeypatch):
    runtime = _Runtime()
    monkeypatch.setattr(device_wait, "cuda_runtime", lambda: runtime)
    wait = device_wait.device_waiter(("cuda", 1))
    assert wait is not None
    wait()
    wait()
    assert runtime.calls == [("cudaSetDevice", (1,)), ("cudaDeviceSynchronize", ())] * 2


def test_a_cuda_error_raises(monkeypatch):
    monkeypatch.setattr(device_wait, "cuda_runtime", lambda: _Runtime(sync_error=700))
    wait = device_wait.device_waiter(("cuda", 0))
    assert wait is not None
    with pytest.raises(RuntimeError, match="cudaDeviceSynchronize: CUDA error 700"):
        wait()


def test_no_cuda_runtime_means_no_wait(monkeypatch):
    monkeypatch.setattr(device_wait, "cuda_runtime", lambda: None)
    assert device_wait.device_waiter(("cuda", 0)) is None
