"""Command-line behaviour that needs no real model."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from wicore.cli.main import apply_config_file, main, parse_command_line

BLOCK_ORT = "import sys; sys.modules['onnxruntime'] = None; from wicore.cli.main import main; sys.exit(main(sys.argv[1:]))"


def test_without_onnxruntime_wicore_names_the_extras(tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", BLOCK_ORT, "generate", "--model", str(tmp_path), "--prompt", "hi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert "no ONNX Runtime is installed: in the WiCore checkout, pip install '.[cpu]'" in res.stderr
    assert "'.[cuda]' for NVIDIA" in res.stderr and "'.[openvino]' for Intel" in res.stderr


def wicore(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """(exit code, stderr) of `wicore ARGV`, in this process: the entry point's exit code is main's
    return (tests/cli/test_serve_args.py::test_version runs the entry point as a process)."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().err


def test_generate_on_a_folder_that_is_not_an_export(tmp_path, capsys):
    code, err = wicore(capsys, "generate", "--model", str(tmp_path), "--prompt", "hi")
    assert code == 2
    assert f"{tmp_path}: no exported model here (no wicore.json)" in err


def test_generate_needs_a_prompt(tmp_path, capsys):
    code, err = wicore(capsys, "generate", "--model", str(tmp_path))
    assert code == 2
    assert "give at least one --prompt or --prompt-file" in err


def test_flags_on_the_command_line_win_over_the_config_file_even_at_their_default(tmp_path):
    config = tmp_path / "serve.json"
    config.write_text(
        json.dumps(
            {
                "port": 9000,
                "kv_pool_gb": 3,
                "policy": "lru",
                "no_prefix_cache": True,
                "api_key": "from-file",
                "host_tier_gb": 0.5,
                "max_num_seqs": 8,
                "nvme_dir": "/tmp/x",
            }
        )
    )
    args = parse_command_line(
        [
            "serve",
            "--config",
            str(config),
            "--port",
            "8000",
            "--kv-pool-gb",
            "1.0",
            "--policy",
            "a2cr",
            "--api-key",
            "from-flag",
            "--max-num-seqs",
            "16",
        ]
    )
    apply_config_file(args)
    # Given, at the default (port, kv pool, policy) or not (keys, max_num_seqs): the flag wins.
    assert (args.port, args.kv_pool_gb, args.policy, args.api_key, args.max_num_seqs) == (8000, 1.0, "a2cr", ["from-flag"], 16)
    # Not given: the file's value.
    assert (args.no_prefix_cache, args.host_tier_gb, args.nvme_dir) == (True, 0.5, Path("/tmp/x"))


def test_config_file_alone_fills_the_settings(tmp_path):
    config = tmp_path / "serve.json"
    config.write_text(json.dumps({"server_port": 9001, "api_key": "k"}))
    args = parse_command_line(["serve", "--config", str(config)])
    apply_config_file(args)
    assert (args.port, args.api_key, args.host) == (9001, ["k"], "127.0.0.1")


def test_engine_flags_reach_the_engine_config_and_bad_ones_are_named(tmp_path):
    from wicore.cli.main import engine_config
    from wicore.errors import UsageError

    args = parse_command_line(
        [
            "generate",
            "--prompt",
            "hi",
            "--a2cr-weights",
            "0.2,0.5,0.3",
            "--a2cr-decay",
            "0.1",
            "--max-batched-tokens",
            "1024",
            "--prefill-with-decodes",
            "128",
            "--prefill-chunk",
            "64",
            "--kv-offload-tokens",
            "4096",
            "--kv-pool-gb",
            "2",
        ]
    )
    config = engine_config(args, tmp_path)
    assert config.kv_pool_gb == 2
    assert (config.a2cr.w_attention, config.a2cr.w_frequency, config.a2cr.w_recency, config.a2cr.decay) == (0.2, 0.5, 0.3, 0.1)
    assert config.kv_offload_tokens == 4096
    sched = config.scheduler
    assert (sched.max_num_batched_tokens, sched.prefill_with_decodes, sched.prefill_chunk) == (1024, 128, 64)
    for flags, message in [
        (["--a2cr-weights", "1,2"], "give three numbers"),
        (["--a2cr-decay", "-1"], "A2CR decay must be >= 0"),
        (["--prefill-with-decodes", "0"], "prefill_with_decodes"),
        (["--kv-offload-tokens", "-1"], "kv_offload_tokens must be >= 0"),
    ]:
        with pytest.raises(UsageError, match=message):
            engine_config(parse_command_line(["serve", *flags]), tmp_path)


def serve(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`wicore serve` on an empty folder: whatever it refuses first, it refuses before loading one."""
    return wicore(capsys, "serve", *args)


@pytest.mark.parametrize(
    ("make_args", "message"),
    [
        (lambda tmp: ["--api-key", ""], "--api-key is empty (an unset shell variable?)"),
        (lambda tmp: ["--api-key", "  "], "--api-key is empty"),
        (lambda tmp: ["--api-key-file", str(write(tmp / "k.txt", "# keys\n\n"))], "holds no key"),
        (lambda tmp: ["--api-key-file", str(write(tmp / "k.txt", ""))], "holds no key"),
    ],
)
def test_asking_for_auth_and_giving_no_key_refuses_to_start(tmp_path, make_args, message, capsys):
    code, err = serve(capsys, "--model", str(tmp_path), *make_args(tmp_path))
    assert code == 2 and message in err
    assert "no exported model" not in err  # refused before the model was looked at


def test_a_port_in_use_is_refused_in_one_line_before_the_model_loads(tmp_path, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = serve(capsys, "--model", str(tmp_path), "--port", str(port))
    assert code == 2
    assert err.strip() == f"wicore: error: cannot listen on 127.0.0.1:{port}: Address already in use"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_export_onto_an_existing_folder_is_refused_before_the_source_is_read(tmp_path):
    """The source here does not exist: had it been opened first, the error would name it."""
    out = tmp_path / "model"
    out.mkdir()
    res = subprocess.run(
        [sys.executable, "-m", "wicore.cli.export", "--model", str(tmp_path / "missing.gguf"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode != 0
    assert res.stderr.strip() == f"wicore-export: error: {out} already exists; pass --force to replace it"


@pytest.mark.slow  # 2 s on the 2-core VM, loaded
def test_generate_with_an_image_prints_hf_greedy_text(tiny_multimodal, tmp_path, capsys):
    import torch
    from multimodal import png, user

    from wicore.cli.main import main

    image = tmp_path / "cat.png"
    image.write_bytes(png(11))
    folder = str(tiny_multimodal.export())
    argv = ["generate", "--model", folder, "--chat", "--prompt", "Describe", "--image", str(image), "--max-tokens", "6"]
    assert main([*argv, "--threads", "1"]) == 0
    inputs = tiny_multimodal.inputs(user(image.read_bytes(), "Describe"), [image.read_bytes()])
    with torch.no_grad():
        out = tiny_multimodal.model.generate(**inputs, max_new_tokens=6, do_sample=False)[0, inputs["input_ids"].shape[1] :]
    assert capsys.readouterr().out == tiny_multimodal.processor.tokenizer.decode(out, skip_special_tokens=True) + "\n"
    assert main(["plan", "--model", folder, "--devices", "cpu", "--vision-device", "cpu"]) == 0
    assert "vision.onnx   images    cpu" in capsys.readouterr().out


def test_the_old_kv_stream_tokens_flag_still_sets_the_offload_and_says_it_is_deprecated(capsys):
    args = parse_command_line(["serve", "--kv-stream-tokens", "2048"])
    assert args.kv_offload_tokens == 2048
    assert capsys.readouterr().err == "wicore: --kv-stream-tokens is deprecated, use --kv-offload-tokens\n"
    assert parse_command_line(["serve"]).kv_offload_tokens == 0
    assert capsys.readouterr().err == ""


def test_the_old_kv_stream_tokens_flag_is_hidden_from_help(capsys):
    with pytest.raises(SystemExit):
        parse_command_line(["serve", "--help"])
    out = capsys.readouterr().out
    assert "--kv-offload-tokens" in out and "--kv-stream-tokens" not in out


def test_the_deprecated_flag_beside_a_config_file_is_noticed_once(tmp_path, capsys):
    config = tmp_path / "serve.json"
    config.write_text(json.dumps({"kv_offload_tokens": 512}))
    args = parse_command_line(["serve", "--config", str(config), "--kv-stream-tokens", "2048"])
    apply_config_file(args)
    assert args.kv_offload_tokens == 2048  # the flag wins over the file
    assert capsys.readouterr().err == "wicore: --kv-stream-tokens is deprecated, use --kv-offload-tokens\n"


def test_a_config_file_with_the_old_kv_stream_tokens_key_sets_the_offload(tmp_path):
    config = tmp_path / "serve.json"
    config.write_text(json.dumps({"kv_stream_tokens": 512}))
    args = parse_command_line(["serve", "--config", str(config)])
    apply_config_file(args)
    assert args.kv_offload_tokens == 512


@pytest.mark.parametrize(
    ("flags", "matches"),
    [
        (["--regex", "[0-9]{3}"], r"[0-9]{3}"),
        (["--choice", "yes", "--choice", "no"], r"yes|no"),
        (["--grammar", 'root ::= "a" ("b" | "c")'], r"a[bc]"),
        (
            [
                "--json-schema",
                '{"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]}',
            ],
            r'\{"n": [0-9]\}',
        ),
    ],
)
def test_generate_follows_an_output_constraint(tiny_chat, capsys, flags, matches):
    """The tiny chat model's random weights would print anything: each constraint makes it match."""
    assert main(["generate", "--model", str(tiny_chat[0]), "--prompt", "hi", "--max-tokens", "12", "--threads", "1", *flags]) == 0
    out = capsys.readouterr().out
    assert re.fullmatch(matches, out.rstrip("\n")), out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--json-schema", "{bad"], "wicore: error: --json-schema: not JSON (Expecting property name enclosed in double quotes"),
        (
            ["--json-schema", '{"type": "objekt"}'],
            "wicore: error: --json-schema: the JSON schema cannot be compiled: Invalid type: objekt",
        ),
        (
            ["--grammar-file", "/nonexistent.gbnf"],
            "wicore: error: --grammar-file /nonexistent.gbnf: cannot read it (No such file",
        ),
    ],
)
def test_a_bad_constraint_is_one_line_naming_its_flag(tiny_chat, capsys, flags, message):
    assert main(["generate", "--model", str(tiny_chat[0]), "--prompt", "hi", "--threads", "1", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err
