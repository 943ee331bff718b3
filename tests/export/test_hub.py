"""Models named by their Hugging Face Hub id, resolved offline against a hub-layout cache built here.

The cache is what huggingface_hub writes (models--org--name/refs/main -> snapshots/<commit>/...);
HF_HUB_OFFLINE=1 makes every lookup a cache lookup, so no test touches the network.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hub_cache import WORDS, snapshot, tiny_llama_repo

from wicore.errors import ModelSourceError
from wicore.export.hub import HubId, hub_path, parse_hub_id

ROOT = Path(__file__).parents[2]


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    """HF_HOME in tmp, offline; returns the hub cache folder."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WICORE_CACHE", str(tmp_path / "wicore"))
    return tmp_path / "hf" / "hub"


def wicore(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "wicore.cli", *args], capture_output=True, text=True, timeout=300, env=env)


def test_hub_ids_and_local_paths(tmp_path, monkeypatch):
    assert parse_hub_id("Qwen/Qwen3-30B-A3B") == HubId("Qwen/Qwen3-30B-A3B")
    assert parse_hub_id("unsloth/Qwen3-8B-GGUF:Q4_K_M") == HubId("unsloth/Qwen3-8B-GGUF", "Q4_K_M")
    assert parse_hub_id("hf.co/bartowski/Llama-3.2-1B-GGUF:q8_0") == HubId("bartowski/Llama-3.2-1B-GGUF", "q8_0")
    assert parse_hub_id("https://huggingface.co/org/name") == HubId("org/name")
    assert HubId("org/name", "Q4_K_M").cache_name == "org--name--Q4_K_M"
    for local in ("gemma3-270m", "/abs/path", "models/m.gguf", "a/b/c", "./x"):
        assert parse_hub_id(local) is None, local
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name").mkdir()
    monkeypatch.chdir(tmp_path)  # an existing folder of the same shape is that folder
    assert parse_hub_id("org/name") is None


def test_a_safetensors_repository_resolves_to_its_snapshot(hub):
    folder = snapshot(hub, "org/model")
    (folder / "config.json").write_text("{}")
    assert hub_path(HubId("org/model")) == folder


def test_a_gguf_repository_resolves_the_file_of_its_quant_tag(hub):
    folder = snapshot(hub, "org/model-GGUF")
    for quant in ("Q4_K_M", "Q8_0"):
        (folder / f"model-{quant}.gguf").write_bytes(b"GGUF")
    assert hub_path(HubId("org/model-GGUF", "q4_k_m")) == folder / "model-Q4_K_M.gguf"
    with pytest.raises(
        ModelSourceError,
        match=r"^org/model-GGUF has no GGUF file of quantization Q6_K \(it has model-Q4_K_M.gguf, model-Q8_0.gguf\)$",
    ):
        hub_path(HubId("org/model-GGUF", "Q6_K"))
    with pytest.raises(
        ModelSourceError, match=r"is a GGUF repository: name a quantization, e.g. org/model-GGUF:Q4_K_M \(it has Q4_K_M, Q8_0\)"
    ):
        hub_path(HubId("org/model-GGUF"))


@pytest.mark.slow  # 2 s on the 2-core VM, loaded
def test_pull_and_its_errors_through_the_cli(hub):
    folder = snapshot(hub, "org/model")
    (folder / "config.json").write_text("{}")
    res = wicore("pull", "org/model")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(folder)
    res = wicore("pull", "org/missing")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1] == (
        f"wicore: error: org/missing is not in the Hugging Face cache {hub} and HF_HUB_OFFLINE is set "
        "(nor is it a local file or folder): run `wicore pull org/missing` online first"
    )
    res = wicore("generate", "--model", "org/missing", "--prompt", "hello")
    assert res.returncode == 2 and "org/missing is not in the Hugging Face cache" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_generate_by_hub_id_exports_once_and_gives_hf_greedy_text(hub, tmp_path, reference_greedy):
    model = tiny_llama_repo(hub, "tiny-org/tiny-llama")
    prompt = "hello there the capital of"
    expected = reference_greedy(model, [WORDS.index(w) for w in prompt.split()], 6)
    expected = expected[: expected.index(2)] if 2 in expected else expected
    assert len(expected) >= 3  # a text to compare, not an immediate end  # to the end of sequence
    args = ("generate", "--model", "tiny-org/tiny-llama", "--prompt", prompt, "--max-tokens", "6")
    res = wicore(*args)
    assert res.returncode == 0, res.stderr
    export = tmp_path / "wicore" / "models" / "hub" / "tiny-org--tiny-llama"
    assert (export / "wicore.json").is_file()
    assert res.stdout.split() == [WORDS[i] for i in expected]
    before = (export / "wicore.json").stat().st_mtime_ns
    assert wicore(*args).returncode == 0
    assert (export / "wicore.json").stat().st_mtime_ns == before  # exported once


@pytest.mark.slow
def test_a_gguf_repository_by_quant_tag_generates_as_the_same_file_does(hub, tmp_path, export_cached, with_session_kernels):
    """The packaged Gemma 3 270M GGUF cached as a GGUF repository's Q4_K_M file: exported with its
    quantized blocks (ort-quant, as a GGUF on a CPU is) and greedy text equal to the packaged name's.
    The packaged name's export is the session's (the one tests/test_gemma3_270m_quant.py checks),
    put where `wicore generate --model gemma3-270m` looks for it, so only the Hub id is exported here;
    WiCore's kernel library is the session's build (the CLI would compile it into its fresh cache)."""
    from wicore.cli.models import cpu_kernels, export_folder_name
    from wicore.export.sources import packaged_gguf

    models = with_session_kernels(tmp_path / "wicore") / "models"  # the hub fixture's WICORE_CACHE
    models.mkdir()
    kernels = cpu_kernels("ort-quant")  # WiCore's MatMulQ where this CPU runs it (wicore.cli.models)
    name = export_folder_name("gemma3-270m", "fp32", "ort-quant", "portable", kernels)
    packaged_export = models / name
    packaged_export.symlink_to(export_cached(name, "gemma3-270m", op_flavour="ort-quant", kernels=kernels))
    before = (packaged_export / "wicore.json").stat().st_mtime_ns
    folder = snapshot(hub, "google/gemma-3-270m-GGUF")
    (folder / "gemma-3-270m-Q4_K_M.gguf").symlink_to(packaged_gguf("gemma3-270m"))  # the Hub cache links blobs too
    (folder / "README.md").write_text("a GGUF repository")
    prompt = ("--prompt", "The capital of France is", "--max-tokens", "8")
    res = wicore("generate", "--model", "google/gemma-3-270m-GGUF:Q4_K_M", *prompt)
    assert res.returncode == 0, res.stderr
    hub_name = export_folder_name("google--gemma-3-270m-GGUF--Q4_K_M", "fp32", "ort-quant", "portable", kernels)
    assert (models / "hub" / hub_name / "wicore.json").is_file()
    packaged = wicore("generate", "--model", "gemma3-270m", *prompt)
    assert packaged.returncode == 0, packaged.stderr
    assert packaged_export.is_symlink() and (packaged_export / "wicore.json").stat().st_mtime_ns == before  # not exported again
    assert res.stdout == packaged.stdout and res.stdout.strip()
