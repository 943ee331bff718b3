"""tools/profile_weight_bytes.py on the tiny random Gemma 3's fp32 export: the bytes a decode token reads
are every linear layer's weight and the tied head, in float32; the embedding table only by its rows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # the tiny export (shared) and a subprocess that imports onnx: ~4 s
def test_an_fp32_export_reads_its_linear_weights_and_the_head_once(tiny_export):
    folder, model = tiny_export()
    linear = [p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embed" not in name]
    head = model.config.vocab_size * model.config.hidden_size  # tied: the embedding, transposed
    min_bytes = 4 * min(linear)
    command = [sys.executable, str(REPO / "tools" / "profile_weight_bytes.py"), "--model-dir", str(folder)]
    result = subprocess.run(
        [*command, "--min-bytes", str(min_bytes)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": ""},
    )
    total = re.search(r"\| \*\*total\*\* \| \*\*([\d.]+)\*\* \|", result.stdout)
    assert total is not None, result.stdout
    assert float(total.group(1)) == round(4 * (sum(linear) + head) / 1e6, 2)
