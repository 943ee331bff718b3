"""Mixture-of-experts GGUFs, written by gguf-py's GGUFWriter as llama.cpp's converter lays them
out (stacked experts [E, rows, cols]): the family from the architecture and the expert count, the
config from the header, each expert's weights (and Q8_0 blocks) split out of the stacks.
tests/export/test_gguf_moe.py runs llama.cpp's own converter on transformers' models (slow)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from wicore.errors import UnsupportedModelError
from wicore.export.gguf import GGUFSource
from wicore.model.families import family_of_gguf

HIDDEN, WIDTH, NUM_EXPERTS, TOP_K, HEADS, HEAD_DIM = 64, 32, 4, 2, 2, 32


def test_the_family_follows_the_architecture_and_the_expert_count():
    assert family_of_gguf("llama").name == "llama"
    assert family_of_gguf("llama", 8).name == "mixtral"
    assert family_of_gguf("qwen3moe", 128).name == "qwen3_moe"
    assert family_of_gguf("qwen3", 0).name == "qwen3"
    assert family_of_gguf("gpt-oss", 32).name == "gpt_oss"
    with pytest.raises(UnsupportedModelError, match=r"GGUF architecture 'deepseek2' is not supported; .*GGUF gpt-oss"):
        family_of_gguf("deepseek2", 64)


def write_moe_gguf(
    path: Path, arch: str, experts_type: gguf.GGMLQuantizationType, per_expert: bool = False, **header: object
) -> dict[str, np.ndarray]:
    """A one-layer MoE GGUF; returns its stacked expert tensors in HF's order [E, rows, cols].
    `per_expert`: one tensor an expert (`blk.0.ffn_gate.E.weight`), as Mixtral GGUFs were written
    before llama.cpp stacked them."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(4 * WIDTH)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_expert_count(NUM_EXPERTS)
    writer.add_expert_used_count(TOP_K)
    for key, value in header.items():
        writer.add_uint32(f"{arch}.{key}", value) if isinstance(value, int) else writer.add_bool(f"{arch}.{key}", value)

    def f32(name: str, *shape: int) -> None:
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))

    f32("token_embd.weight", 100, HIDDEN)
    f32("output_norm.weight", HIDDEN)
    for name, shape in {"attn_q": (HEADS * HEAD_DIM, HIDDEN), "attn_k": (HEADS * HEAD_DIM, HIDDEN)}.items():
        f32(f"blk.0.{name}.weight", *shape)
    f32("blk.0.attn_v.weight", HEADS * HEAD_DIM, HIDDEN)
    f32("blk.0.attn_output.weight", HIDDEN, HEADS * HEAD_DIM)
    for name in ("attn_norm", "ffn_norm"):
        f32(f"blk.0.{name}.weight", HIDDEN)
    if arch == "qwen3moe":
        f32("blk.0.attn_q_norm.weight", HEAD_DIM)
        f32("blk.0.attn_k_norm.weight", HEAD_DIM)
    f32("blk.0.ffn_gate_inp.weight", NUM_EXPERTS, HIDDEN)
    stacks = {}
    for name, shape in {
        "ffn_gate_exps": (WIDTH, HIDDEN),
        "ffn_up_exps": (WIDTH, HIDDEN),
        "ffn_down_exps": (HIDDEN, WIDTH),
    }.items():
        values = rng.standard_normal((NUM_EXPERTS, *shape)).astype(np.float32)
        if experts_type != gguf.GGMLQuantizationType.F32:
            raw = gguf.quants.quantize(values, experts_type)
            values = gguf.quants.dequantize(raw, experts_type).reshape(values.shape)
        parts = [(f"blk.0.{name.removesuffix('_exps')}.{e}.weight", e) for e in range(NUM_EXPERTS)] if per_expert else []
        for tensor_name, rows in parts or [(f"blk.0.{name}.weight", slice(None))]:
            if experts_type == gguf.GGMLQuantizationType.F32:
                writer.add_tensor(tensor_name, np.ascontiguousarray(values[rows]))
            else:
                writer.add_tensor(tensor_name, raw[rows], raw_dtype=experts_type)
        stacks[name] = values
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stacks


@pytest.mark.parametrize(("arch", "per_expert"), [("qwen3moe", False), ("llama", False), ("llama", True)])
@pytest.mark.parametrize("experts_type", [gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.Q8_0])
def test_stacked_experts_are_split_per_expert(tmp_path, arch, per_expert, experts_type):
    """Stacked experts, or (old Mixtral GGUFs) one tensor an expert: each expert's weights and blocks."""
    stacks = write_moe_gguf(tmp_path / "moe.gguf", arch, experts_type, per_expert, expert_feed_forward_length=WIDTH)
    names = {t.name for t in gguf.GGUFReader(tmp_path / "moe.gguf").tensors}
    assert (f"blk.0.ffn_gate.{NUM_EXPERTS - 1}.weight" in names, "blk.0.ffn_gate_exps.weight" in names) == (
        per_expert,
        not per_expert,
    )
    source = GGUFSource(tmp_path / "moe.gguf")
    cfg = source.config
    assert source.family.name == {"qwen3moe": "qwen3_moe", "llama": "mixtral"}[arch]
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.norm_topk_prob) == (
        NUM_EXPERTS,
        TOP_K,
        WIDTH,
        True,
    )
    layer = source.layer(0)
    assert layer["mlp.router"].shape == (NUM_EXPERTS, HIDDEN)
    for gguf_name, projection in (("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"), ("ffn_down_exps", "down_proj")):
        for e in range(NUM_EXPERTS):
            weight = layer[f"mlp.experts.{e}.{projection}"]
            np.testing.assert_array_equal(weight, stacks[gguf_name][e])
            blocks = getattr(weight, "blocks", None)
            if experts_type == gguf.GGMLQuantizationType.Q8_0:  # its own Q8_0 blocks, for the ort-quant flavour
                assert (blocks.bits, blocks.block_size, blocks.offsets) == (8, 32, None)
                np.testing.assert_array_equal(blocks.dequantize(), stacks[gguf_name][e])
            else:
                assert blocks is None


def test_the_header_says_whether_the_top_k_is_renormalised(tmp_path):
    """llama.cpp renormalises every qwen3moe; a header's expert_weights_norm overrides."""
    write_moe_gguf(tmp_path / "moe.gguf", "qwen3moe", gguf.GGMLQuantizationType.F32, expert_weights_norm=False)
    assert GGUFSource(tmp_path / "moe.gguf").config.norm_topk_prob is False


def test_mixtral_without_an_expert_width_takes_the_feed_forward_length(tmp_path):
    """llama.cpp writes Mixtral's expert width as feed_forward_length."""
    write_moe_gguf(tmp_path / "moe.gguf", "llama", gguf.GGMLQuantizationType.F32)
    assert GGUFSource(tmp_path / "moe.gguf").config.moe_intermediate_size == 4 * WIDTH
