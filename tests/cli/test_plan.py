"""`wicore plan` for long contexts: from a checkpoint's config.json alone (Gemma-3-27B's shape, the
numbers worked by hand in tests/kv/test_capacity.py), from an export, and bad input."""

from __future__ import annotations

import json

import pytest
from shapes import GEMMA3_27B_IT, QWEN3_30B_A3B, SIGLIP_27B

from wicore.cli.main import main
from wicore.kv.capacity import RUNTIME_NOTE


@pytest.fixture
def gemma3_27b(tmp_path):
    folder = tmp_path / "gemma-3-27b-it"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GEMMA3_27B_IT))
    return folder


def plan(capsys, *args: str) -> tuple[int, list[str], str]:
    code = main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_the_27b_at_128k_on_an_80_gib_card_in_fp16(gemma3_27b, capsys):
    code, lines, _ = plan(capsys, "--model", str(gemma3_27b), "--dtype", "fp16", "--attention", "paged", "--budget-gb", "80")
    assert code == 0
    assert lines == [
        f"{gemma3_27b / 'config.json'}: 62 layers (10 full attention), 16 KV heads x 128, window 1024, context 131072; "
        "as exported with --dtype fp16 --attention paged: weights 50.31G (estimated from the shape)",
        "memory budget 80.00G: weights 50.31G, KV pool and activations (an estimate: wicore/kv/capacity.py) in the rest",
        "one sequence: up to 131072 tokens, limited by the model's maximum (the memory holds 380032); "
        "KV pool 10.62G, activations 0.08G",
        "sequences of 131072 tokens: 2 at once; KV pool 21.18G, activations 0.16G "
        "(serve with --kv-pool-gb 21.18 --max-num-seqs 2)",
        RUNTIME_NOTE,
    ]


def test_a_hub_id_is_planned_from_its_config_alone(tmp_path, capsys, monkeypatch):
    from hub_cache import snapshot

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    folder = snapshot(tmp_path / "hub", "Qwen/Qwen3-30B-A3B")  # no weights in the cache: config.json only
    (folder / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
    code, lines, _ = plan(capsys, "--model", "Qwen/Qwen3-30B-A3B", "--dtype", "fp16", "--budget-gb", "80", "--context", "32768")
    assert code == 0
    assert lines[0].startswith(f"{folder / 'config.json'}: 48 layers") and "128 experts x 768 a layer" in lines[0]
    code, _, err = plan(capsys, "--model", "Qwen/Qwen3-235B-A22B", "--budget-gb", "80")
    assert code == 2 and "Qwen/Qwen3-235B-A22B is not in the Hugging Face cache" in err


def test_a_portable_export_holds_the_vision_tower(gemma3_27b, capsys):
    """The multimodal config exported without --attention paged keeps SigLIP: 0.79 GiB more."""
    (gemma3_27b / "config.json").write_text(json.dumps({**GEMMA3_27B_IT, "vision_config": SIGLIP_27B}))
    code, lines, _ = plan(capsys, "--model", str(gemma3_27b), "--dtype", "fp16", "--budget-gb", "80")
    assert code == 0
    assert lines[0].endswith("--attention portable: weights 51.10G (estimated from the shape; the vision tower's 0.79G included)")
    code, lines, _ = plan(capsys, "--model", str(gemma3_27b), "--dtype", "fp16", "--attention", "paged", "--budget-gb", "80")
    assert lines[0].endswith("--attention paged: weights 50.31G (estimated from the shape)")


def test_the_27b_in_4_bits_on_a_24_gib_card(gemma3_27b, capsys):
    code, lines, _ = plan(
        capsys, "--model", str(gemma3_27b / "config.json"), "--dtype", "fp16", "--weight-bits", "4", "--attention", "paged",
        "--budget-gb", "24", "--context", "65536",
    )  # fmt: skip
    assert code == 0
    assert lines[0].endswith(
        "--dtype fp16 --op-flavour ort-quant --weight-bits 4 --attention paged: weights 16.78G (estimated from the shape)"
    )
    # 85,504 tokens: 669 blocks of 128 and the window's 12 (7.14 GiB); 65,536: 513 and 12 (5.62 GiB), two: 12 GiB.
    assert lines[2:] == [
        "one sequence: up to 85504 tokens, limited by the memory (the model takes 131072); KV pool 7.14G, activations 0.08G",
        "sequences of 65536 tokens: 1 at once; KV pool 5.62G, activations 0.08G (serve with --kv-pool-gb 5.62 --max-num-seqs 1)",
        RUNTIME_NOTE,
    ]


def test_quantized_embedding_rows_take_2_5_gib_off_the_27b_in_4_bits(gemma3_27b, capsys):
    """--quantize-embedding: the table's 2.62 GiB of fp16 rows become the head's codes (shared) and
    0.08 GiB of scales: 14.23 GiB, and one sequence of 118,784 tokens on 24 GiB (not 128K)."""
    code, lines, _ = plan(
        capsys, "--model", str(gemma3_27b / "config.json"), "--dtype", "fp16", "--weight-bits", "4", "--quantize-embedding",
        "--attention", "paged", "--budget-gb", "24", "--context", "131072",
    )  # fmt: skip
    assert code == 0
    assert lines[0].endswith("--weight-bits 4 --quantize-embedding --attention paged: weights 14.23G (estimated from the shape)")
    assert lines[2:] == [
        "one sequence: up to 118784 tokens, limited by the memory (the model takes 131072); KV pool 9.68G, activations 0.08G",
        "sequences of 131072 tokens: none fits",
        RUNTIME_NOTE,
    ]
    code, _, err = plan(capsys, "--model", str(gemma3_27b), "--dtype", "fp16", "--quantize-embedding", "--budget-gb", "24")
    assert code == 2 and "--quantize-embedding needs quantized weights: add --weight-bits 4 or 8" in err


def test_int8_kv_blocks_hold_more_of_one_sequence(gemma3_27b, capsys):
    """The 27B in 4 bits, portable attention, on 24 GiB: 40,848 tokens with float16 KV, 56,656 with
    int8 KV (42,240 bytes a token in the 10 full layers instead of 81,920; the portable attention's
    float32 gather of the blocks grows with the context and takes much of what the KV saves)."""
    args = ["--model", str(gemma3_27b), "--dtype", "fp16", "--weight-bits", "4", "--budget-gb", "24", "--context", "65536"]
    code, lines, _ = plan(capsys, *args)
    assert code == 0 and lines[2].startswith("one sequence: up to 40848 tokens, limited by the memory")
    code, lines, _ = plan(capsys, *args, "--kv-cache-dtype", "int8")
    assert code == 0 and lines[0].endswith(
        "--attention portable --kv-cache-dtype int8: weights 16.78G (estimated from the shape)"
    )
    assert lines[2] == (
        "one sequence: up to 56656 tokens, limited by the memory (the model takes 131072); KV pool 2.50G, activations 4.72G"
    )


def test_an_export_is_planned_from_its_graphs(tiny_export, capsys):
    folder, _ = tiny_export(1)
    code, lines, _ = plan(capsys, "--model", str(folder), "--devices", "cpu", "--budget-gb", "1", "--block-size", "4")
    assert code == 0
    assert lines[0].split() == ["partition", "layers", "device", "weights", "kv", "pool"]
    assert lines[-3].startswith("one sequence: up to 256 tokens, limited by the model's maximum")
    assert lines[-2].startswith("sequences of 256 tokens: ")
    assert lines[-1] == RUNTIME_NOTE


@pytest.mark.parametrize(
    ("args", "config", "message"),
    [
        (["--context", "200000"], None, "--context 200000: the model takes 1 to 131072 tokens"),
        (["--context", "0"], None, "--context 0: the model takes 1 to 131072 tokens"),
        ([], {**GEMMA3_27B_IT["text_config"], "layer_types": ["sliding_attention"] * 62}, "at least one full-attention layer"),
        (["--attention", "paged"], None, "--attention paged needs --dtype fp16"),
        (["--dtype", "fp16", "--attention", "paged", "--kv-cache-dtype", "int8"], None, "int8 needs the portable attention"),
        (["--budget-gb", "0"], None, "--budget-gb 0.0: give a positive size"),
        ([], {"model_type": "falcon", "num_hidden_layers": 2}, "model_type 'falcon' is not supported"),
        ([], {"model_type": "gemma3_text"}, "is not a model config WiCore reads: it has no 'num_hidden_layers'"),
        (
            [],
            {**GEMMA3_27B_IT["text_config"], "rope_scaling": {"rope_type": "yarn", "factor": 8.0}},
            "yarn rope scaling needs original_max_position_embeddings",
        ),
    ],
    ids=["context", "context-0", "all-sliding", "paged-fp32", "paged-int8-kv", "budget", "falcon", "missing-key", "yarn"],
)
def test_bad_input_is_refused_with_exit_2(gemma3_27b, capsys, args, config, message):
    if config is not None:
        (gemma3_27b / "config.json").write_text(json.dumps(config))
    code, _, err = plan(capsys, "--model", str(gemma3_27b), "--budget-gb", "80", *args)
    assert code == 2
    assert message in err and err.startswith("wicore: error: ")


def test_plan_for_a_gpu_on_a_cpu_only_install(tiny_export, capsys):
    """plan loads nothing: a device this ONNX Runtime build lacks is planned too (its memory from --budget-gb)."""
    from wicore.devices.providers import installed_providers

    if "CUDAExecutionProvider" in installed_providers():
        pytest.skip("this ONNX Runtime has the CUDA EP")
    folder, _ = tiny_export(1)
    code, lines, err = plan(capsys, "--model", str(folder), "--devices", "cuda:0", "--budget-gb", "1", "--block-size", "4")
    assert code == 0, err
    assert lines[1].split()[2] == "cuda:0"


def test_a_missing_model_says_plan_also_takes_a_config_json(tmp_path, capsys):
    code, _, err = plan(capsys, "--model", str(tmp_path / "nowhere"), "--budget-gb", "1")
    assert code == 2
    assert err == (
        f"wicore: error: --model {tmp_path / 'nowhere'}: no such file or folder; wicore plan takes an exported model, "
        "a named one, a .gguf file, a checkpoint's config.json alone (the file, or the Hugging Face folder holding it) or a Hub id\n"
    )


GPT_OSS_20B = {
    "model_type": "gpt_oss",
    "num_hidden_layers": 24,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "vocab_size": 201088,
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "head_dim": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "attention_bias": True,
    "tie_word_embeddings": False,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    },
}


@pytest.mark.parametrize(
    ("config", "summary"),
    [
        # Qwen3-30B-A3B: 30.5B weights (tests/runtime/test_capacity.py), 56.87 GiB in fp16; 4 KV heads.
        (
            QWEN3_30B_A3B,
            "48 layers (48 full attention), 4 KV heads x 128, window 4096, context 40960, "
            "128 experts x 768 a layer (8 a token); as exported with --dtype fp16 --attention portable: "
            "weights 56.87G (estimated from the shape)",
        ),
        # gpt-oss-20b: 20.9B weights (its model card's count), 38.94 GiB in fp16; half its layers slide.
        (
            GPT_OSS_20B,
            "24 layers (12 full attention), 8 KV heads x 64, window 128, context 131072, "
            "32 experts x 2880 a layer (4 a token); as exported with --dtype fp16 --attention portable: "
            "weights 38.94G (estimated from the shape)",
        ),
    ],
    ids=["qwen3-moe", "gpt-oss"],
)
def test_a_mixture_of_experts_counts_every_expert(tmp_path, capsys, config, summary):
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, lines, _ = plan(capsys, "--model", str(tmp_path), "--dtype", "fp16", "--budget-gb", "80", "--context", "32768")
    assert code == 0
    assert lines[0] == f"{tmp_path / 'config.json'}: {summary}"


@pytest.mark.parametrize(
    ("bits", "weights"),
    [
        # every linear weight in 8-bit codes plus an fp16 scale a 32 (30.53B of them), float embedding rows
        (["--weight-bits", "8"], "30.79G"),
        # the experts' 28.99B in 4 bits (half the codes' bytes), attention and LM head still in 8
        (["--weight-bits", "8", "--expert-bits", "4"], "17.29G"),
    ],
    ids=["8-bit", "experts-4-bit"],
)
def test_experts_are_planned_in_their_own_bits(tmp_path, capsys, bits, weights):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
    code, lines, _ = plan(capsys, "--model", str(tmp_path), "--dtype", "fp16", "--budget-gb", "80", *bits)
    assert code == 0
    assert lines[0].endswith(
        f"as exported with --dtype fp16 --op-flavour ort-quant {' '.join(bits)} --attention portable: "
        f"weights {weights} (estimated from the shape)"
    )


def test_expert_bits_on_a_dense_model_are_refused(gemma3_27b, capsys):
    code, _, err = plan(capsys, "--model", str(gemma3_27b), "--budget-gb", "80", "--weight-bits", "4", "--expert-bits", "4")
    assert code == 2
    assert err == (
        f"wicore: error: --expert-bits: {gemma3_27b / 'config.json'} has no experts (an option for mixtures of experts); drop it\n"
    )


# Phi-3-mini-128k-instruct's shape (its factors simplified: the plan reads only their count)
PHI3_MINI_128K = {
    "model_type": "phi3",
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32064,
    "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "sliding_window": 262144,
    "tie_word_embeddings": False,
    "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [4.0] * 48},
}


def test_a_longrope_model_is_planned_with_its_switch_chunk(tmp_path, capsys):
    """The engine runs a LongRoPE sequence's first switch + 1 tokens in one chunk (4,097 here,
    SchedulerConfig.with_long_rope): in the portable attention that chunk's float32 scores against
    the context take most of the memory (with serve's 256-token chunks the plan said 131072 tokens)."""
    (tmp_path / "config.json").write_text(json.dumps(PHI3_MINI_128K))
    code, lines, _ = plan(capsys, "--model", str(tmp_path), "--dtype", "fp16", "--budget-gb", "80", "--context", "32768")
    assert code == 0
    assert lines[1:4] == [
        "LongRoPE: a sequence past 4096 tokens runs its first 4097 in one prefill chunk, so steps take up to 4161 "
        "tokens (as wicore serve raises them)",
        "memory budget 80.00G: weights 7.12G, KV pool and activations (an estimate: wicore/kv/capacity.py) in the rest",
        "one sequence: up to 51952 tokens, limited by the memory (the model takes 131072); KV pool 19.03G, activations 53.84G",
    ]
