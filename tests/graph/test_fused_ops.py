"""graph/fused_ops.py, the webgpu op flavour, on every dense family: prompt logits against HF transformers
on the CPU EP (the tiny models of test_families.py: sliding windows, LongRoPE, biases, post-norms only)."""

from __future__ import annotations

import numpy as np
import pytest
from test_families import CONFIGS, PREFILL_CHUNK, PROMPTS, build
from test_gemma3 import engine

from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.types.sampling import SamplingParams


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_webgpu_flavour_gives_hf_logits(tmp_path, reference_logits, name):
    _, model = build(tmp_path, name)
    folder = tmp_path / "webgpu"
    export_model(open_source(str(tmp_path / "hf")), folder, ExportConfig(op_flavour="webgpu"), progress=lambda _: None)
    with engine(folder, prefill_chunk=PREFILL_CHUNK.get(name, 16)) as eng:
        completions = eng.generate(PROMPTS, SamplingParams(max_tokens=1, prompt_logits=True))
    for prompt, completion in zip(PROMPTS, completions, strict=True):
        assert completion.error is None
        ref = reference_logits(model, prompt)
        np.testing.assert_allclose(completion.prompt_logits, ref, atol=1e-4, rtol=0)
        assert (completion.prompt_logits.argmax(-1) == ref.argmax(-1)).all()
