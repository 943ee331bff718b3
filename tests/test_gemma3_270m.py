"""The real Gemma 3 270M (packaged GGUF) against HF transformers on the same weights.

The slow layer of the suite: two exports (1 and 3 partitions, fp32) and one HF
reference model, shared by every test here.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from wicore.cli.verify import VERIFY_TEXT, compare_logits, hf_logits
from wicore.runtime.generator import Generator
from wicore.runtime.sampler import SamplingParams

pytestmark = pytest.mark.slow

LONG_TEXT = " ".join([VERIFY_TEXT] * 9)  # > 512 tokens: past the sliding window


@pytest.fixture(scope="module")
def generators(gemma_270m):
    return {n: Generator.load(gemma_270m(n), num_threads=2) for n in (1, 3)}


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("partitions", [1, 3])
def test_logits_of_a_100_token_prompt_match_hf(generators, hf_gemma_270m, partitions, record_property):
    gen = generators[partitions]
    ids = gen.tokenizer.encode(LONG_TEXT)[:100]
    assert len(ids) == 100
    report = compare_logits(gen.prompt_logits(ids), hf_logits(hf_gemma_270m, ids))
    record_property("verify", report.summary())
    print(report.summary())
    assert report.argmax_agreement == 1.0
    assert report.max_abs_diff < 1e-3  # measured 7.5e-5 against logits up to ~30


def test_greedy_generation_matches_hf(generators, hf_gemma_270m):
    gen = generators[3]
    tok = gen.tokenizer
    prompts = [
        tok.encode("The capital of France is"),
        tok.encode(tok.apply_chat_template([{"role": "user", "content": "Name three colours of the rainbow."}]), add_bos=False),
        tok.encode(LONG_TEXT + " In summary,"),
    ]
    assert len(prompts[2]) > 600
    out = gen.generate(prompts, SamplingParams(max_tokens=64, ignore_eos=True))
    for ours, ids in zip(out.token_ids, prompts):
        assert ours == hf_greedy(hf_gemma_270m, ids, 64)
    assert tok.decode(out.token_ids[0]).startswith(" the capital of the country of France.")


def test_batch_of_four_equals_each_alone(generators):
    gen = generators[1]
    tok = gen.tokenizer
    texts = ["Once upon a time", "def fibonacci(n):", LONG_TEXT[:900], "日本の首都は"]
    prompts = [tok.encode(t) for t in texts]
    assert len({len(p) for p in prompts}) == 4
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    together = gen.generate(prompts, params).token_ids
    assert together == [gen.generate([p], params).token_ids[0] for p in prompts]


def test_generate_cli_prints_the_greedy_continuation(gemma_270m):
    res = subprocess.run(
        [sys.executable, "-m", "wicore.cli", "generate", "--model", str(gemma_270m(3)),
         "--prompt", "The capital of France is", "--max-tokens", "12", "--threads", "2"],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == " the capital of the country of France. It is the largest\n"


def test_prompt_longer_than_the_context_is_refused(gemma_270m, tmp_path):
    prompt = tmp_path / "long.txt"
    prompt.write_text("hello " * 33000)  # BOS + 33000 x "hello" + the trailing space
    res = subprocess.run(
        [sys.executable, "-m", "wicore.cli", "generate", "--model", str(gemma_270m(1)),
         "--prompt-file", str(prompt), "--max-tokens", "4"],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 2
    assert "the prompt has 33002 tokens; the model's context is 32768" in res.stderr
