"""Command-line behaviour that needs no real model."""

from __future__ import annotations

import subprocess
import sys

BLOCK_ORT = "import sys; sys.modules['onnxruntime'] = None; from wicore.cli import main; sys.exit(main(sys.argv[1:]))"


def test_without_onnxruntime_wicore_names_the_extras(tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", BLOCK_ORT, "generate", "--model", str(tmp_path), "--prompt", "hi"],
        capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 2
    assert "no ONNX Runtime is installed: pip install 'wicore[cpu]'" in res.stderr
    assert "wicore[cuda]" in res.stderr and "wicore[openvino]" in res.stderr


def test_generate_on_a_folder_that_is_not_an_export(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "wicore.cli", "generate", "--model", str(tmp_path), "--prompt", "hi"],
        capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 2
    assert f"{tmp_path}: no exported model here (no wicore.json)" in res.stderr


def test_generate_needs_a_prompt(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "wicore.cli", "generate", "--model", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 2
    assert "give at least one --prompt or --prompt-file" in res.stderr
