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


def test_plan_takes_the_packaged_name_that_serve_takes(gemma_270m, tmp_path, monkeypatch, capsys):
    """`wicore plan --model gemma3-270m` plans the export serve would use (here already cached)."""
    from wicore.cli.main import main

    monkeypatch.setenv("WICORE_CACHE", str(tmp_path))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "gemma3-270m-ort-quant").symlink_to(gemma_270m(1))  # the name of the CPU export
    assert main(["plan", "--model", "gemma3-270m", "--devices", "cpu"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    table = [row[:3] for row in rows if row and row[0].endswith(".onnx") and row[1] != "also"]  # not the notes under it
    assert table == [["part-00.onnx", "0-17", "cpu"]]
