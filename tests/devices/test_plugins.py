"""The plugin EP gate: an ONNX Runtime too old for WiCore's use of a plugin leaves it unregistered,
saying why (an H100 run found ONNX Runtime 1.30 silently placing every node on the CPU)."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest

from wicore.devices.plugins import _version, plugin_refusals, register_plugin_eps


def test_versions_read_as_major_minor() -> None:
    assert _version("1.32.0") == (1, 32)
    assert _version("1.31.1") == (1, 31)
    assert _version("1.33.0.dev20261101") == (1, 33)
    assert _version("2.0") == (2, 0)
    with pytest.raises(ValueError, match="not a version"):
        _version("nightly")


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime_ep_webgpu") is None, reason="needs onnxruntime-ep-webgpu")
def test_an_onnxruntime_too_old_for_webgpu_leaves_the_plugin_out_and_says_why() -> None:
    old = ModuleType("onnxruntime_1_30")
    old.__version__ = "1.30.0"  # type: ignore[attr-defined]

    def register(name: str, path: str) -> None:
        raise AssertionError("an ONNX Runtime too old for the plugin must not register it")

    old.register_execution_provider_library = register  # type: ignore[attr-defined]
    assert register_plugin_eps(old) == ()
    assert plugin_refusals.pop("webgpu") == (
        "onnxruntime_ep_webgpu is installed, but WiCore runs it with onnxruntime >= 1.32 (this is 1.30.0): "
        "pip install -U 'onnxruntime>=1.32'"
    )
