"""WICORE_DEVICE_POOLS: MIGraphX, CANN and DirectML keep their OrtValues (the KV pools first) in host
memory unless it names them; then in their own memory, as ONNX Runtime's Python API names it."""

from __future__ import annotations

import numpy as np
import pytest

from wicore.devices.device_alloc import buffer_pair
from wicore.devices.device_pools import DEVICE_POOLS_ENV, DevicePoolsError
from wicore.devices.providers import CAPABILITIES, DeviceError, parse_device


@pytest.fixture(autouse=True)
def no_switch(monkeypatch):
    monkeypatch.delenv(DEVICE_POOLS_ENV, raising=False)


def test_off_the_three_eps_bind_their_pools_through_host_memory():
    for spec in ("migraphx:1", "cann:0", "dml:2"):
        assert parse_device(spec, is_installed=False).ort_device == ("cpu", 0)
    assert [c.name for c in CAPABILITIES.values() if c.device_memory] == ["migraphx", "cann", "dml"]


def test_on_each_named_ep_allocates_in_its_own_memory(monkeypatch):
    monkeypatch.setenv(DEVICE_POOLS_ENV, "cann, DML")
    assert parse_device("cann:1", is_installed=False).ort_device == ("cann", 1)
    assert parse_device("dml:0", is_installed=False).ort_device == ("dml", 0)
    assert parse_device("migraphx:0", is_installed=False).ort_device == ("cpu", 0)  # not named: as before
    monkeypatch.setenv(DEVICE_POOLS_ENV, "migraphx")
    device = parse_device("migraphx:3", is_installed=False)
    assert device.ort_device == ("gpu", 3) and device.capability.device_vendor == 0x1002
    assert parse_device("cuda:1", is_installed=False).ort_device == ("cuda", 1)  # unchanged
    assert parse_device("cpu").ort_device == ("cpu", 0)


def test_the_cpu_keeps_its_numpy_pools_whatever_the_switch(monkeypatch):
    monkeypatch.setenv(DEVICE_POOLS_ENV, "migraphx,cann,dml")
    (key, _value), arrays = buffer_pair(parse_device("cpu"), (3, 2, 4), np.float32)
    assert arrays is not None and key.device_name() == "cpu" and arrays[0].shape == (3, 2, 4)


def test_on_for_an_ep_that_is_not_installed_says_so(monkeypatch):
    monkeypatch.setenv(DEVICE_POOLS_ENV, "dml")
    with pytest.raises(DeviceError, match=r"^dml: DmlExecutionProvider is not in this ONNX Runtime build"):
        parse_device("dml")


def test_a_name_the_switch_does_not_take_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(DEVICE_POOLS_ENV, "dml,tpu")
    with pytest.raises(DevicePoolsError, match=r"^WICORE_DEVICE_POOLS=dml,tpu: no EP named 'tpu'; known: cpu, cuda, "):
        parse_device("cpu")
    monkeypatch.setenv(DEVICE_POOLS_ENV, "openvino")
    with pytest.raises(DevicePoolsError, match=r"openvino is not switched this way \(the switch is for migraphx, cann, dml;"):
        parse_device("openvino:CPU", is_installed=False)
