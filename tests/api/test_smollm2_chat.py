"""A chat model that answers: SmolLM2-135M-Instruct served and asked through the `openai` client."""

from __future__ import annotations

import os
from pathlib import Path

import openai
import pytest
from test_smollm2 import CHATS, hf_greedy

from wicore.api.app import ServerSettings, create_app
from wicore.api.server import ServerThread
from wicore.cli.models import cpu_kernels, export_folder_name
from wicore.engine.engine import Engine, EngineConfig


@pytest.mark.slow  # 50 s on the 2-core VM, loaded
def test_chat_answer_equals_hf_greedy_on_the_models_template(smollm2, hf_smollm2, hf_tokenizer_smollm2):
    """fp32 export: the answer is HF's greedy continuation of the same rendered template, up to <|im_end|>."""
    engine = Engine(EngineConfig(model_dir=smollm2(), num_threads=2, host_tier_gb=0)).start()
    server = ServerThread(create_app(engine, ServerSettings(model_name="smollm2"))).start()
    try:
        api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        reply = api.chat.completions.create(model="smollm2", messages=CHATS[1], max_tokens=64, temperature=0)
        through = api.chat.completions.create(
            model="smollm2", messages=CHATS[1], max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
        )
    finally:
        server.stop()
        engine.stop()
    # vLLM's ignore_eos: the same answer, then on past <|im_end|> to max_tokens
    assert through.choices[0].finish_reason == "length" and through.usage.completion_tokens == 12
    assert through.choices[0].message.content.startswith("The capital of France is Paris.")
    assert len(through.choices[0].message.content) > len("The capital of France is Paris.")
    choice = reply.choices[0]
    ids = hf_tokenizer_smollm2.apply_chat_template(CHATS[1], add_generation_prompt=True, return_dict=False)
    expected = hf_greedy(hf_smollm2, list(ids), 64)
    assert expected[-1] == 2  # <|im_end|>
    assert choice.finish_reason == "stop"
    assert choice.message.content == hf_tokenizer_smollm2.decode(expected[:-1])
    assert choice.message.content == "The capital of France is Paris."


@pytest.mark.slow
def test_wicore_serve_by_name_runs_its_cpu_export_and_answers(smollm2_gguf, smollm2, tmp_path, launch, with_session_kernels):
    """`wicore serve --model smollm2-135m-instruct` serves the flavour the name gets on a CPU
    (ort-quant: the GGUF's 4-bit blocks, on WiCore's MatMulQ where the CPU has AVX-512 VNNI and a
    compiler) and answers a chat. The session's ort-quant export (the one
    tests/test_smollm2.py checks against HF) is put where the name's export goes; the export on first
    use is tests/cli/test_serve_args.py::test_plain_wicore_serve_answers_the_readme_questions's."""
    (tmp_path / "gguf").symlink_to(Path(smollm2_gguf).parent)
    (with_session_kernels(tmp_path) / "models").mkdir()  # its kernel library the session's build, not compiled again
    kernels = cpu_kernels("ort-quant")  # WiCore's MatMulQ where this CPU runs it fast and can build it
    export = tmp_path / "models" / export_folder_name("smollm2-135m-instruct", "fp32", "ort-quant", "portable", kernels)
    export.symlink_to(smollm2("ort-quant", kernels))
    before = (export / "wicore.json").stat().st_mtime_ns
    os.environ["WICORE_CACHE"] = str(tmp_path)
    try:
        proc, url = launch("smollm2-135m-instruct")
    finally:
        del os.environ["WICORE_CACHE"]
    try:
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        reply = api.chat.completions.create(model="smollm2-135m-instruct", messages=CHATS[1], max_tokens=64, temperature=0)
    finally:
        proc.terminate()
        proc.wait(30)
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == "The capital of France is Paris."
    assert export.is_symlink() and (export / "wicore.json").stat().st_mtime_ns == before  # the name found that export
