"""Model sources and export: configs, weight conventions, and bad input that must fail cleanly."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from wicore.errors import ModelSourceError, UnsupportedModelError, WiCoreError
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.hf import HFSource
from wicore.export.sources import open_source
from wicore.model.config import FULL, SLIDING, DecoderConfig, RopeConfig


def run_cli(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300)


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


# -- configs -----------------------------------------------------------------------------
def test_hf_config_transformers4_style_with_linear_rope_scaling():
    cfg = DecoderConfig.from_hf(
        {
            "model_type": "gemma3",
            "text_config": {
                "model_type": "gemma3_text",
                "vocab_size": 262208,
                "hidden_size": 2560,
                "intermediate_size": 10240,
                "num_hidden_layers": 34,
                "num_attention_heads": 8,
                "num_key_value_heads": 4,
                "head_dim": 256,
                "sliding_window": 1024,
                "rope_theta": 1000000.0,
                "rope_local_base_freq": 10000.0,
                "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                "query_pre_attn_scalar": 256,
            },
            "eos_token_id": [1, 106],
        }
    )
    assert cfg.rope_global == RopeConfig(1_000_000.0, 8.0)
    assert cfg.rope_local == RopeConfig(10_000.0, 1.0)
    assert cfg.layer_types[:6] == (SLIDING,) * 5 + (FULL,)
    assert cfg.layer_types.count(FULL) == 5
    assert cfg.eos_token_id == 1
    assert DecoderConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


ROPE_FORMS = {
    "4.x rope_type": {"rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
    "4.x no scaling": {"rope_theta": 2e6, "rope_local_base_freq": 2e4, "rope_scaling": None},
    "nothing": {},
    "5.x": {
        "rope_parameters": {
            FULL: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            SLIDING: {"rope_type": "default", "rope_theta": 1e4},
        }
    },
    "5.x thetas outside": {
        "rope_theta": 3e6,
        "rope_local_base_freq": 3e4,
        "rope_parameters": {FULL: {"rope_type": "linear", "factor": 4.0}, SLIDING: {"rope_type": "default"}},
    },
    "5.x full only": {"rope_parameters": {FULL: {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}}},
    "5.x and 4.x": {"rope_scaling": {"rope_type": "linear", "factor": 8.0}, "rope_parameters": {FULL: {"rope_theta": 1e6}}},
}
SMALL_TEXT_CONFIG = dict(
    model_type="gemma3_text",
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=131072,
)


@pytest.mark.parametrize("form", list(ROPE_FORMS))
def test_hf_config_rope_forms_read_as_transformers_reads_them(form):
    """Every way a Gemma 3 config writes its RoPE gives what transformers' own Gemma3TextConfig
    makes of it: (theta, linear factor) of the global and of the sliding layers."""
    from transformers import Gemma3TextConfig

    raw = {**SMALL_TEXT_CONFIG, **ROPE_FORMS[form]}
    hf = Gemma3TextConfig(**copy.deepcopy(raw)).rope_parameters
    expected = [
        RopeConfig(hf[kind]["rope_theta"], hf[kind].get("factor", 1.0) if hf[kind]["rope_type"] == "linear" else 1.0)
        for kind in (FULL, SLIDING)
    ]
    cfg = DecoderConfig.from_hf(raw)
    assert [cfg.rope_global, cfg.rope_local] == expected


def test_hf_config_legacy_type_key_reads_as_transformers_4_reads_it():
    """`rope_scaling: {"type": "linear"}` (the older key) is linear scaling, as transformers 4.x
    reads it; transformers 5.24 keeps the `rope_type: default` it fills in first and drops the factor."""
    cfg = DecoderConfig.from_hf({**SMALL_TEXT_CONFIG, "rope_scaling": {"type": "linear", "factor": 8.0}})
    assert (cfg.rope_global, cfg.rope_local) == (RopeConfig(1_000_000.0, 8.0), RopeConfig(10_000.0))


@pytest.mark.parametrize(
    ("rope", "message"),
    [
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 8.0}},
            "full_attention layers: yarn rope scaling needs original_max_position_embeddings",
        ),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope scaling 'dynamic' is not supported"),
        (
            {"rope_parameters": {FULL: {"rope_type": "llama3", "factor": 8.0}}},
            "llama3 rope scaling needs factor, low_freq_factor",
        ),
        (
            {"rope_parameters": {SLIDING: {"rope_type": "longrope"}}},
            "sliding_attention layers: longrope scaling needs short_factor",
        ),
        ({"rope_scaling": {"rope_type": "linear"}}, "linear rope scaling without a factor"),
        ({"rope_parameters": {FULL: {"partial_rotary_factor": 0.5}}}, "partial rotary embeddings are not supported"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 8.0}}, "key them by layer type"),
    ],
    ids=["yarn", "dynamic", "llama3", "longrope-sliding", "no-factor", "partial", "flat-parameters"],
)
def test_hf_config_refuses_rope_it_does_not_implement(rope, message):
    with pytest.raises(UnsupportedModelError, match=message):
        DecoderConfig.from_hf({**SMALL_TEXT_CONFIG, **rope})


def write_gemma3_gguf_header(path: Path, scaling: str | None) -> None:
    """A Gemma 3 GGUF holding the header fields llama.cpp's converter writes for a 128K model (and
    the token table, whose shape gives the vocabulary), with rope scaling `scaling`, factor 8."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_block_count(6)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_key_length(32)
    writer.add_sliding_window(8)
    writer.add_context_length(131072)
    writer.add_rope_freq_base(1_000_000.0)
    if scaling is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType(scaling))
        writer.add_rope_scaling_factor(8.0)
    writer.add_tensor("token_embd.weight", np.zeros((512, 64), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_config_with_linear_rope_scaling(tmp_path):
    path = tmp_path / "long.gguf"
    write_gemma3_gguf_header(path, "linear")
    cfg = open_source(str(path)).config
    assert (cfg.rope_global, cfg.rope_local, cfg.max_position_embeddings) == (
        RopeConfig(1_000_000.0, 8.0),
        RopeConfig(10_000.0),
        131072,
    )
    write_gemma3_gguf_header(path, "yarn")
    with pytest.raises(UnsupportedModelError, match="long.gguf: rope scaling 'yarn' is not supported"):
        open_source(str(path))


def test_hf_config_rejects_other_architectures():
    with pytest.raises(UnsupportedModelError, match="'falcon' is not supported; WiCore compiles gemma3 .* llama .* qwen2"):
        DecoderConfig.from_hf({"model_type": "falcon", "num_hidden_layers": 2})


@pytest.mark.slow  # 4 s on the 2-core VM, loaded
def test_gguf_config_of_the_packaged_270m():
    src = open_source("gemma3-270m")
    cfg = src.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (18, 640, 4, 1, 256)
    assert (cfg.vocab_size, cfg.sliding_window, cfg.query_pre_attn_scalar) == (262144, 512, 256.0)
    assert cfg.rope_global == RopeConfig(1_000_000.0) and cfg.rope_local == RopeConfig(10_000.0)
    assert [i for i, t in enumerate(cfg.layer_types) if t == FULL] == [5, 11, 17]
    # Norm weights come back in HF's convention (GGUF stores 1 + w) and every quant type dequantizes.
    layer = src.layer(0)
    assert layer["self_attn.q_proj"].shape == (1024, 640) and layer["mlp.down_proj"].shape == (640, 2048)
    assert layer["input_layernorm"].dtype == np.float32
    assert src.embedding().shape == (262144, 640)
    # Gemma's image tokens by name (what an mmproj vision tower needs); the 270M has no soft token.
    tokens = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")
    assert src.token_ids(tokens) == {"<start_of_image>": 255999, "<end_of_image>": 256000}


def test_hf_source_reads_bf16_exactly(tiny_model, tmp_path):
    import torch

    _, model = tiny_model()
    bf16 = tmp_path / "bf16"
    half = copy.deepcopy(model).to(torch.bfloat16)  # the fixture's model is shared: leave it fp32
    half.save_pretrained(bf16)
    src = HFSource(bf16)
    expected = half.model.layers[1].mlp.up_proj.weight.detach().float().numpy()
    np.testing.assert_array_equal(src.layer(1)["mlp.up_proj"], expected)


# -- bad input ---------------------------------------------------------------------------
def test_missing_gguf_fails_with_exit_code_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    res = run_cli("wicore.cli.export", "--model", str(tmp_path / "nope.gguf"), "--out", str(out))
    assert res.returncode == 2
    assert "GGUF file not found" in res.stderr and str(tmp_path / "nope.gguf") in res.stderr
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("fraction", [0.003, 0.5, 0.999])
@pytest.mark.slow  # 6 s on the 2-core VM, loaded
def test_truncated_gguf_is_refused(tmp_path, fraction):
    from wicore.export.sources import packaged_gguf

    data = packaged_gguf("gemma3-270m").read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(ModelSourceError, match="truncated or corrupt"):
        open_source(str(path))


def test_gguf_of_another_architecture_is_refused(tmp_path):
    import gguf

    path = tmp_path / "phi3.gguf"
    writer = gguf.GGUFWriter(str(path), "phi3")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    res = run_cli("wicore.cli.export", "--model", str(path), "--out", str(tmp_path / "out"))
    assert res.returncode == 2
    assert "phi3.gguf: GGUF architecture 'phi3' is not supported; WiCore compiles gemma3 " in res.stderr
    assert "qwen3 (config.json model_type qwen3, GGUF qwen3)" in res.stderr
    assert not (tmp_path / "out").exists()


def test_unknown_model_name(tmp_path):
    with pytest.raises(ModelSourceError, match="gemma3-270m"):
        open_source("gemma3-999b")


def test_failed_export_leaves_no_half_written_model(tiny_model, tmp_path):
    """A tensor missing in layer 2 fails the export after layers 0-1 were written."""
    from safetensors.numpy import load_file, save_file

    folder, _ = tiny_model()
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (path,) = broken.glob("*.safetensors")
    tensors = {k: v for k, v in load_file(path).items() if "layers.2.mlp.down_proj" not in k}
    save_file(tensors, path)
    parent = tmp_path / "models"
    parent.mkdir()
    with pytest.raises(ModelSourceError, match="layers.2.mlp.down_proj.weight is missing"):
        export_model(open_source(str(broken)), parent / "tiny", ExportConfig(num_partitions=2), progress=lambda _: None)
    assert leftovers(parent) == []


def test_existing_output_is_kept_unless_forced(tiny_model, tmp_path):
    folder, _ = tiny_model()
    out = tmp_path / "m"
    export_model(open_source(str(folder)), out, ExportConfig(), progress=lambda _: None)
    with pytest.raises(WiCoreError, match="--force"):
        export_model(open_source(str(folder)), out, ExportConfig(), progress=lambda _: None)
    export_model(open_source(str(folder)), out, ExportConfig(num_partitions=2, overwrite=True), progress=lambda _: None)
    assert sorted(p.name for p in out.iterdir()) == [
        "embed_tokens.data",
        "part-00.onnx",
        "part-00.onnx.data",
        "part-01.onnx",
        "part-01.onnx.data",
        "wicore.json",
    ]
    assert leftovers(tmp_path) == ["m"]


@pytest.mark.parametrize("partitions", [0, 5])
def test_partition_count_out_of_range(tiny_model, tmp_path, partitions):
    folder, _ = tiny_model()
    res = run_cli("wicore.cli.export", "--model", str(folder), "--out", str(tmp_path / "m"), "--partitions", str(partitions))
    assert res.returncode == 2
    assert "--partitions must be" in res.stderr
    assert not (tmp_path / "m").exists()


def test_the_packaged_gguf_says_it_is_being_checked_before_the_long_hash():
    """The package hashes its chunks and the assembled file on every call (10-40 s): the export's
    progress line says so first, instead of a silent wait before "layer 1/18"."""
    from wicore.export.sources import packaged_gguf

    said: list[str] = []
    path = packaged_gguf("gemma3-270m", progress=said.append)
    assert said == ["checking the packaged gemma3-270m GGUF (sha256 of its chunks; assembled on first use)"]
    assert path.suffix == ".gguf" and path.is_file()
