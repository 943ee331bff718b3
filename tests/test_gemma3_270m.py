"""The real Gemma 3 270M (packaged GGUF) against HF transformers on the same weights.

The slow layer of the suite: two exports (1 and 3 partitions, fp32), an engine on each
and one HF reference model, shared by every test here.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from wicore.cli.verify import VERIFY_TEXT, compare_logits, hf_logits
from wicore.engine.engine import Engine, EngineConfig
from wicore.types.sampling import SamplingParams

pytestmark = pytest.mark.slow

LONG_TEXT = " ".join([VERIFY_TEXT] * 9)  # > 512 tokens: past the sliding window


@pytest.fixture(scope="module")
def engines(gemma_270m):
    """partitions -> engine (1 GB device KV pool, no host tier). No prefix cache: a prompt run
    again is computed again, so "alone" below does not reuse what the batch computed."""
    configs = [EngineConfig(model_dir=gemma_270m(n), num_threads=2, host_tier_gb=0, enable_prefix_cache=False) for n in (1, 3)]
    with Engine(configs[0]) as one, Engine(configs[1]) as three:
        yield {1: one, 3: three}


def token_ids(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    completions = engine.generate(prompts, params)
    assert [c.error for c in completions] == [None] * len(prompts)
    return [c.token_ids for c in completions]


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("partitions", [1, 3])
def test_logits_of_a_100_token_prompt_match_hf(engines, hf_gemma_270m, partitions, record_property):
    engine = engines[partitions]
    ids = engine.tokenizer.encode(LONG_TEXT)[:100]
    assert len(ids) == 100
    (completion,) = engine.generate([ids], SamplingParams(max_tokens=1, prompt_logits=True))
    assert completion.error is None and completion.prompt_logits.shape == (100, 262144)
    report = compare_logits(completion.prompt_logits, hf_logits(hf_gemma_270m, ids), ids)
    record_property("verify", report.summary())
    print(report.summary())
    assert report.argmax_agreement == 1.0
    assert report.max_abs_diff < 1e-3  # measured 7.5e-5 against logits up to ~30


def test_greedy_generation_matches_hf(engines, hf_gemma_270m):
    engine = engines[3]
    tok = engine.tokenizer
    prompts = [
        tok.encode("The capital of France is"),
        tok.encode(tok.apply_chat_template([{"role": "user", "content": "Name three colours of the rainbow."}]), add_bos=False),
        tok.encode(LONG_TEXT + " In summary,"),
    ]
    assert len(prompts[2]) > 600
    out = engine.generate(prompts, SamplingParams(max_tokens=64, ignore_eos=True))
    assert [c.finish_reason for c in out] == ["length"] * 3
    for ours, ids in zip(out, prompts):
        assert ours.token_ids == hf_greedy(hf_gemma_270m, ids, 64)
        assert ours.num_prompt_tokens == len(ids)
    assert tok.decode(out[0].token_ids).startswith(" the capital of the country of France.")


def test_greedy_generation_after_a_2k_token_prompt_matches_hf(engines, hf_gemma_270m):
    """2,047 prompt tokens, four times the 512-token sliding window: the engine prefills them in
    256-token chunks whose sliding layers read only their window (the blocks behind it released),
    HF in one pass over the whole prompt; the same 64 greedy tokens. (~30K tokens against HF:
    tools/check_long_context.py, docs/PERFORMANCE.md.)"""
    engine = engines[1]
    tok = engine.tokenizer
    notes = " ".join(f"Note {i}: {VERIFY_TEXT}" for i in range(30))
    ids = tok.encode(notes)[:2042] + tok.encode(" In summary, the notes", add_bos=False)
    assert len(ids) == 2047
    (ours,) = engine.generate([ids], SamplingParams(max_tokens=64, ignore_eos=True))
    assert ours.error is None and ours.finish_reason == "length"
    assert ours.token_ids == hf_greedy(hf_gemma_270m, ids, 64)


def test_batch_of_four_equals_each_alone(engines):
    engine = engines[1]
    tok = engine.tokenizer
    texts = ["Once upon a time", "def fibonacci(n):", LONG_TEXT[:900], "日本の首都は"]
    prompts = [tok.encode(t) for t in texts]
    assert len({len(p) for p in prompts}) == 4
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    together = token_ids(engine, prompts, params)
    assert together == [token_ids(engine, [p], params)[0] for p in prompts]
    assert all(len(t) == 24 for t in together)


def test_generate_cli_prints_the_greedy_continuation(gemma_270m):
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "wicore.cli",
            "generate",
            "--model",
            str(gemma_270m(3)),
            "--prompt",
            "The capital of France is",
            "--max-tokens",
            "12",
            "--threads",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == " the capital of the country of France. It is the largest\n"


def test_prompt_longer_than_the_context_is_refused(gemma_270m, tmp_path):
    prompt = tmp_path / "long.txt"
    prompt.write_text("hello " * 33000)  # BOS + 33000 x "hello" + the trailing space
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "wicore.cli",
            "generate",
            "--model",
            str(gemma_270m(1)),
            "--prompt-file",
            str(prompt),
            "--max-tokens",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2
    assert (
        "wicore: error: the prompt has 33002 tokens; the model's context holds 32768 tokens "
        "(prompt plus at least one generated token)\n"
    ) in res.stderr
