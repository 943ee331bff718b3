"""The paged graphs (`--attention paged --dtype fp16`, CUDA) of every dense family, run on the CPU.

ONNX Runtime runs PagedAttention on CUDA only; here onnx.reference runs the exported graphs with
NumPy versions of its contrib ops (tests/paged_reference.py), so what is checked is the graph around
the op: what reaches it (Gemma 2's soft-capping, windows on every layer, OLMo 2's whole-projection
q/k norms before it, LongRoPE rotated before it), against HF transformers in float32 on the tiny
models of test_families.py. tools/check_families_gpu.py runs the same families on ONNX Runtime's kernels.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from paged_reference import PagedRunner
from test_families import PROMPTS, build

from wicore.errors import UnsupportedModelError
from wicore.export.exporter import ExportConfig

PAGED = ExportConfig(dtype="fp16", attention="paged")
DECODE_STEPS = 4
# float16 weights and activations against HF float32: measured 9.5e-3-1.5e-2 (Gemma 2), 2.6e-3-3.5e-3
# (the others; Granite 3e-4), logits spread over 0.6-5.3
ATOL = 2.5e-2


def op_attributes(folder) -> list[dict[str, object]]:
    (part,) = folder.glob("part-*.onnx")
    graph = onnx.load(part, load_external_data=False).graph
    nodes = [n for n in graph.node if n.op_type == "PagedAttention"]
    return [{a.name: helper.get_attribute_value(a) for a in n.attribute} for n in nodes]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma2", "mistral-sliding", "phi3", "phi3-longrope", "olmo2", "llama", "qwen3", "granite"])
def test_paged_graphs_match_hf(tmp_path, reference_logits, name):
    """Prompt logits of three prompts (each prefilled alone) within float16's noise (ATOL) of HF
    float32's; then greedy decode steps of the three rows batched (each at its own length, reading
    its cached K/V): their logits within ATOL of HF's on the same tokens, and each token HF's argmax
    there (or, at a near-tie, within 2 ATOL of it)."""
    folder, model = build(tmp_path, name, PAGED)  # weights of std test_families.INIT
    runner = PagedRunner(folder, max_rows=len(PROMPTS), max_tokens=max(map(len, PROMPTS)) + DECODE_STEPS)
    tokens = []
    for prompt in PROMPTS:
        logits, ref = runner.prefill(prompt), reference_logits(model, prompt)
        np.testing.assert_allclose(logits, ref, atol=ATOL, rtol=0)
        tokens.append([int(logits[-1].argmax())])
    rows = list(range(len(PROMPTS)))
    decoded = []
    for _ in range(DECODE_STEPS):
        step = runner.step(rows, [t[-1:] for t in tokens])[:, -1]
        decoded.append(step)
        for row, logits in enumerate(step):
            tokens[row].append(int(logits.argmax()))
    for row, prompt in enumerate(PROMPTS):
        ref = reference_logits(model, prompt + tokens[row][:-1])  # HF on the same tokens
        assert ref.shape[0] == len(prompt) + DECODE_STEPS
        ours = np.stack([step[row] for step in decoded])
        np.testing.assert_allclose(ours, ref[len(prompt) :], atol=ATOL, rtol=0)
        picked = ref[len(prompt) - 1 :][np.arange(DECODE_STEPS + 1), tokens[row]]
        assert (picked >= ref[len(prompt) - 1 :].max(-1) - 2 * ATOL).all()
        exact = picked == ref[len(prompt) - 1 :].max(-1)
        assert exact.mean() >= 0.8  # near-ties are rare: most tokens are HF's argmax itself


def test_the_op_gets_each_familys_window_softcap_and_scale(tmp_path):
    """Gemma 2: the soft-cap and query_pre_attn_scalar's scale on every layer, the window on the
    sliding ones; Mistral: the window on every layer; OLMo 2: scale 1 (in its q norm's weight);
    Phi-3 with LongRoPE: q and k rotated before the op (RotaryEmbedding on per-token cos / sin)."""
    gemma2, _ = build(tmp_path / "gemma2", "gemma2", PAGED)
    assert op_attributes(gemma2) == [
        {
            "num_heads": 4,
            "kv_num_heads": 2,
            "scale": pytest.approx(24**-0.5),
            "softcap": 2.0,
            "do_rotary": 1,
            "local_window_size": w,
        }
        for w in (6, -1, 6)
    ]
    mistral, _ = build(tmp_path / "mistral", "mistral-sliding", PAGED)
    assert [a["local_window_size"] for a in op_attributes(mistral)] == [6, 6, 6]
    olmo2, _ = build(tmp_path / "olmo2", "olmo2", PAGED)
    assert {(a["scale"], a["do_rotary"]) for a in op_attributes(olmo2)} == {(1.0, 1)}
    phi3, _ = build(tmp_path / "phi3", "phi3-longrope", PAGED)
    assert {(a["do_rotary"], a["local_window_size"]) for a in op_attributes(phi3)} == {(0, -1)}
    (part,) = phi3.glob("part-*.onnx")
    ops = [n.op_type for n in onnx.load(part, load_external_data=False).graph.node]
    assert ops.count("RotaryEmbedding") == 2 * 3 and not [n for n in ops if "cos_cache" in n]


def test_wicore_kernels_refuse_a_family_without_pre_norms(tmp_path):
    """OLMo 2 normalises after each block only: WiCore's fused kernels add a block's output into
    the next pre-norm, so it stays on ONNX Runtime's ops in the paged graphs."""
    with pytest.raises(UnsupportedModelError, match="olmo2 has no pre-norms: export it with ONNX Runtime's ops"):
        build(tmp_path, "olmo2", ExportConfig(dtype="fp16", attention="paged", kernels="wicore"))


@pytest.mark.slow
def test_paged_longrope_across_the_switch_follows_hf_generate(tmp_path, reference_logits):
    """The engine's steps around LongRoPE's switch, on the paged graph: three prompts prefilled,
    then decoded batched; the 23-token row that reaches past original_max_position_embeddings (32)
    leaves the batch and its whole sequence is prefilled again in a new row, in one chunk (Scheduler:
    the recompute), which then decodes beside the others. Each token's logits are within float16's
    noise of HF's forward over the sequence so far (what generate computes: short factors up to
    the switch, then the whole sequence with the long ones), and each token is HF's argmax there
    or, at a near-tie, within 2 ATOL of it; keeping the row's short-factor keys misses by ~0.1."""
    folder, model = build(tmp_path, "phi3-longrope", PAGED)
    num_tokens, switch = 12, 32
    runner = PagedRunner(folder, max_rows=len(PROMPTS) + 1, max_tokens=max(map(len, PROMPTS)) + num_tokens)
    seqs = [list(prompt) for prompt in PROMPTS]
    logits_of: list[list[np.ndarray]] = [[] for _ in PROMPTS]  # each generated token's

    def take(i: int, logits: np.ndarray) -> None:  # greedy: the row's next token
        logits_of[i].append(logits)
        seqs[i].append(int(logits.argmax()))

    for i, seq in enumerate(seqs):
        take(i, runner.prefill(seq)[-1])
    row_of = list(range(len(PROMPTS)))  # sequence -> its row in the runner
    recomputed = []
    while min(map(len, logits_of)) < num_tokens:
        decoding = []
        for i, seq in enumerate(seqs):  # past the switch with short-factor keys cached: a new row, whole
            if len(seq) > switch and len(PROMPTS[i]) <= switch and i not in recomputed:
                recomputed.append(i)
                row_of[i] = len(runner.lengths)
                take(i, runner.prefill(seq)[-1])
            else:
                decoding.append(i)
        step = runner.step([row_of[i] for i in decoding], [seqs[i][-1:] for i in decoding])[:, -1]
        for i, logits in zip(decoding, step, strict=True):
            take(i, logits)
    assert recomputed == [0]
    for seq, prompt, logits in zip(seqs, PROMPTS, logits_of, strict=True):
        for k, ours in enumerate(logits[:num_tokens]):
            ref = reference_logits(model, seq[: len(prompt) + k])[-1]
            np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)
            assert ref[seq[len(prompt) + k]] >= ref.max() - 2 * ATOL
