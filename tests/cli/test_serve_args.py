"""What `wicore serve` and `wicore generate` take: the default model, a GGUF or HF folder served
directly, --chat-template, the defaults their help shows, --version."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from serve_process import spawn_serve

import wicore
from wicore.api.server import free_port
from wicore.cli.main import main, parse_command_line, served_name
from wicore.cli.models import resolve_model


def test_serve_defaults_to_a_chat_model_and_help_shows_the_defaults(capsys):
    assert parse_command_line(["serve"]).model == "smollm2-135m-instruct"
    assert parse_command_line(["serve", "x.gguf", "--port", "9000"]).model_arg == "x.gguf"  # `wicore serve x.gguf`
    with pytest.raises(SystemExit):
        parse_command_line(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--model", "--port", "--max-num-seqs", "--grace-seconds"):
        assert f"{flag} " in text
    for default in ("(default: smollm2-135m-instruct)", "(default: 8000)", "(default: 64)", "(default: 30.0)"):
        assert default in text, default
    assert "on SIGTERM or Ctrl-C (SIGINT)" in text and "a second Ctrl-C quits at once" in text
    assert "(default: what one sequence of the model's whole context needs, at least 1)" in text


def test_generate_sampling_flags_have_help(capsys):
    with pytest.raises(SystemExit):
        parse_command_line(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for phrase in (
        "0 is greedy (default: 0.0)",
        "0 keeps all (default: 0)",
        "1 keeps all (default: 1.0)",
        "--min-p",
        "--repetition-penalty",
    ):
        assert phrase in text, phrase


def test_version():
    res = subprocess.run([sys.executable, "-m", "wicore.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert (res.returncode, res.stdout) == (0, f"wicore {wicore.__version__}\n")


def test_served_names():
    assert served_name("smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert served_name("/x/models/Qwen2.5-0.5B.Q4_K_M.gguf") == "Qwen2.5-0.5B.Q4_K_M"
    assert served_name("/x/models/my-folder") == "my-folder"


def test_an_hf_folder_is_exported_once_into_the_cache(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("WICORE_CACHE", str(tmp_path))
    folder, _ = tiny_model()
    first = resolve_model(str(folder), "cpu")
    assert first.parent == tmp_path / "models" and first.name.startswith(f"{folder.name}-")
    manifest = first / "wicore.json"
    written = manifest.stat().st_mtime_ns
    assert resolve_model(str(folder), "cpu") == first and manifest.stat().st_mtime_ns == written  # reused


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "nowhere.gguf"], "wicore: error: nowhere.gguf: no such GGUF file\n"),
        (["nowhere.gguf"], "wicore: error: nowhere.gguf: no such GGUF file\n"),
        (["--chat-template", "absent.jinja"], "wicore: error: --chat-template absent.jinja: cannot read it (No such file"),
    ],
)
def test_bad_models_and_templates_are_one_line_errors(args, message, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--port", str(free_port()), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "99999"], "wicore: error: --port 99999: a TCP port is 0-65535\n"),
        (["--port", "-1"], "wicore: error: --port -1: a TCP port is 0-65535\n"),
        (["--kv-pool-gb", "-1"], "wicore: error: --kv-pool-gb -1: a tier's size is >= 0 GiB\n"),
        (["--nvme-tier-gb", "-0.5"], "wicore: error: --nvme-tier-gb -0.5: a tier's size is >= 0 GiB\n"),
    ],
)
def test_a_port_or_tier_size_out_of_range_is_one_line(args, message, capsys):
    assert main(["serve", "--model", "gemma3-270m", "--api-key", "k", *args]) == 2
    assert capsys.readouterr().err == message


def test_a_chat_template_that_does_not_parse_is_refused(capsys, tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}", encoding="utf-8")
    assert main(["serve", "--port", str(free_port()), "--chat-template", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"wicore: error: --chat-template {bad}: the chat template does not parse (") and err.count("\n") == 1


def serve_process(cache: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """`wicore serve ARGS` with WICORE_CACHE=cache, on a free port, once /health answers (first use pulls and exports)."""
    return spawn_serve(list(args), {"WICORE_CACHE": str(cache)}, timeout=600)


def ask(url: str, question: str) -> str:
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": 32, "temperature": 0}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).json()["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def serve_cache(tmp_path_factory, with_session_kernels) -> Path:
    """WICORE_CACHE for these servers: the test cache (its gguf/ holds the pulled SmolLM2, its kernels/
    the session's kernel build, conftest's kernel_cache), else a fresh one linked to that build."""
    base = os.environ.get("WICORE_TEST_CACHE")
    return Path(base) if base else with_session_kernels(tmp_path_factory.mktemp("wicore-cache"))


@pytest.mark.slow
def test_plain_wicore_serve_answers_the_readme_questions(serve_cache, smollm2_gguf):
    """README's first command: no --model, the chat model; the English and the Chinese quick start's curl."""
    proc, url = serve_process(serve_cache)
    try:
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "smollm2-135m-instruct"
        assert httpx.get(f"{url}/web/config.json").json()["chat"] is True
        assert ask(url, "What is the capital of France?") == "The capital of France is Paris."
        assert ask(url, "What is the capital of China?") == "The capital of China is Beijing."
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.mark.slow
def test_wicore_serve_a_gguf_path(export_cached, with_session_kernels, tmp_path):
    """`wicore serve x.gguf`: the packaged Gemma 3 270M's file, served from the cache folder its path
    names (ort-quant, as a GGUF on a CPU is); a base model, so completions answer and chat says there
    is no chat template. The export put there is the session's (tests/export/test_hub.py's): the same
    export_model call in wicore.cli.models.resolve_model exports a Hub id there and a packaged name in
    test_plain_wicore_serve_answers_the_readme_questions, so one 270M export fewer is built here."""
    from wicore.cli.models import cpu_kernels, export_folder_name, source_key
    from wicore.export.sources import packaged_gguf

    gguf = packaged_gguf("gemma3-270m")
    kernels = cpu_kernels("ort-quant")  # on MatMulQ where it pays
    models = with_session_kernels(tmp_path / "wicore") / "models"
    models.mkdir()
    export = models / export_folder_name(f"{gguf.stem}-{source_key(gguf)}", "fp32", "ort-quant", "portable", kernels)
    session_export = export_folder_name("gemma3-270m", "fp32", "ort-quant", "portable", kernels)
    export.symlink_to(export_cached(session_export, "gemma3-270m", op_flavour="ort-quant", kernels=kernels))
    before = (export / "wicore.json").stat().st_mtime_ns
    proc, url = serve_process(tmp_path / "wicore", str(gguf))
    try:
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == gguf.stem
        body = {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
        done = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()
        assert done["usage"]["completion_tokens"] == 4 and done["choices"][0]["text"].strip()  # it continues the text
        chat = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]}, timeout=60)
        assert (chat.status_code, chat.json()["error"]["code"]) == (400, "no_chat_template")
        assert httpx.get(f"{url}/web/config.json").json()["chat"] is False
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    # the path's ort-quant folder was the one served: nothing else exported, that one not again
    assert [p.name for p in models.iterdir()] == [export.name]
    assert export.is_symlink() and (export / "wicore.json").stat().st_mtime_ns == before


@pytest.mark.slow
def test_the_default_pool_holds_the_models_whole_context(gemma_270m):
    """1 GiB capped the 270M at 29,136 of its 32,768 tokens; the default is sized for one whole sequence."""
    from wicore.cli.engine_args import engine_config
    from wicore.engine.engine import Engine

    folder = gemma_270m(1)
    config = engine_config(parse_command_line(["serve", "--model", str(folder), "--threads", "2"]), folder)
    assert config.kv_pool_gb == 1.13
    with Engine(config) as engine:
        assert engine.max_sequence_tokens == 32768 == engine.manifest.config.max_position_embeddings


def test_gil_switch_ms_is_taken_in_ms_and_must_be_positive(capsys):
    assert parse_command_line(["serve", "--gil-switch-ms", "0.5"]).gil_switch_ms == 0.5
    assert parse_command_line(["serve"]).gil_switch_ms is None  # Python's own 5 ms
    assert main(["serve", "--gil-switch-ms", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "wicore: error: --gil-switch-ms 0: give a positive number of milliseconds (Python's is 5)"
