"""The paged graphs with every layer on WiCore's BlockAttention (`--block-attention all`, float32,
graph/paged_block.py) of the families whose attention differs, on the CPU's kernel against HF float32.
BlockAttentionQKV's own prologue: Gemma 2's soft-cap and q × scale (no q/k norm), Qwen 3's per-head
norms, Mistral's window on every layer; the graph-op prologue before BlockAttention: OLMo 2's
whole-projection norms, LongRoPE rotated from one cos / sin row a token.
(tests/kernels/test_paged_block.py: the Gemma 3 graphs, and the float16 ones the GPU runs.)"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from paged_reference import PagedRunner
from test_families import PROMPTS, build

from wicore.export.exporter import ExportConfig
from wicore.graph import paged_block

BLOCK = ExportConfig(dtype="fp32", attention="paged", block_attention="all", sampling_head="off")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma2", "olmo2", "qwen3", "phi3-longrope", "mistral-sliding"])
def test_block_attention_graphs_match_hf(tmp_path, reference_logits, cpu_library, name):
    """Each prompt prefilled alone, then a decode step of all rows batched: logits within 1e-4 of HF's."""
    folder, model = build(tmp_path, name, BLOCK)
    runner = PagedRunner(folder, max_rows=len(PROMPTS), max_tokens=max(map(len, PROMPTS)) + 1, library=cpu_library)
    last = []
    for prompt in PROMPTS:
        logits = runner.prefill(prompt)
        np.testing.assert_allclose(logits, reference_logits(model, prompt), atol=1e-4, rtol=0)
        last.append(int(logits[-1].argmax()))
    step = runner.step(list(range(len(PROMPTS))), [[t] for t in last])[:, -1]
    for row, prompt in enumerate(PROMPTS):
        np.testing.assert_allclose(step[row], reference_logits(model, [*prompt, last[row]])[-1], atol=1e-4, rtol=0)


# LongRoPE at a head dim of the CUDA kernel's (64), a window on every layer (full layers with the op's window)
LONGROPE_64 = dict(
    hidden_size=256,
    head_dim=64,
    sliding_window=8,
    rope_scaling={
        "type": "longrope",
        "short_factor": [1.0 + 0.05 * i for i in range(32)],
        "long_factor": [1.0 + 0.5 * i for i in range(32)],
    },
)


def test_auto_keeps_layers_without_the_fused_prologue_on_orts_op(tmp_path, monkeypatch):
    """LongRoPE's layers take the graph-op prologue before BlockAttention (its factors picked per step),
    which measured 0.5x ORT's op: `auto` leaves them on PagedAttention whichever layer kinds it takes
    (here every kind), `all` puts them on BlockAttention."""
    monkeypatch.setattr(paged_block, "AUTO_KINDS", frozenset({True, False}))
    ops = {}
    for mode in ("auto", "all"):
        config = ExportConfig(dtype="fp16", attention="paged", kernels="wicore", block_attention=mode)
        folder, _ = build(tmp_path / mode, "phi3-longrope", config, **LONGROPE_64)
        (part,) = folder.glob("part-*.onnx")
        ops[mode] = collections.Counter(n.op_type for n in onnx.load(part, load_external_data=False).graph.node)
    attention = {mode: (c["PagedAttention"], c["BlockAttention"], c["BlockAttentionQKV"]) for mode, c in ops.items()}
    assert attention == {"auto": (3, 0, 0), "all": (0, 3, 0)}
