"""Which export of a packaged model `wicore serve` / `wicore generate` make for the devices asked."""

from __future__ import annotations

import pytest

from wicore.cli.models import packaged_export, resolve_model
from wicore.runtime.providers import DeviceError, available_devices


def test_cpu_gets_the_gguf_quantized_graphs():
    assert packaged_export("cpu") == ("fp32", "ort-quant", "portable")


def test_auto_follows_the_installed_runtime():
    accelerators = [d for d in available_devices() if d.capability.device_kind != "cpu"]
    expected = ("fp32", "ort-quant", "portable")
    if accelerators and "fp16" in accelerators[0].capability.dtypes:
        expected = ("fp16", "portable", "paged" if "paged" in accelerators[0].capability.attentions else "portable")
    assert packaged_export("auto") == expected


def test_an_unknown_device_is_refused_before_any_export(tmp_path, monkeypatch):
    monkeypatch.setenv("WICORE_CACHE", str(tmp_path))
    with pytest.raises(DeviceError, match="unknown device 'tpu:0'"):
        resolve_model("gemma3-270m", "tpu:0")
    assert not any(tmp_path.iterdir())
