"""SmolLM2-135M-Instruct (Llama family, real weights, the GGUF `wicore pull` fetches) against HF
transformers on the same GGUF: the chat prompt, its tokens and 64 greedy tokens."""

from __future__ import annotations

import pytest
from llama_cpp_peer import LLAMA_CPP_THREADS, open_llama

from wicore.engine.engine import Engine, EngineConfig
from wicore.graph.manifest import Manifest
from wicore.inputs.tokenizer import Tokenizer
from wicore.model.tokenizer_info import TokenizerInfo
from wicore.types.sampling import SamplingParams

CHATS = [
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Give me three tips for learning Python."},
    ],
]


@pytest.fixture(scope="module")
def prompts(smollm2, hf_tokenizer_smollm2) -> list[list[int]]:
    """The chats rendered with the GGUF's template by WiCore (jinja2) and encoded, checked against
    transformers' apply_chat_template on the tokenizer it builds from the same GGUF."""
    folder = smollm2()
    tokenizer = Tokenizer(folder, TokenizerInfo.from_dict(Manifest.read(folder).tokenizer))
    ids = []
    for chat in CHATS:
        text = tokenizer.apply_chat_template(chat)
        assert text == hf_tokenizer_smollm2.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        ids.append(tokenizer.encode(text, add_bos=False))
        assert ids[-1] == hf_tokenizer_smollm2(text, add_special_tokens=False)["input_ids"]
    return ids


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    """Up to `n` greedy tokens of HF's generate, the end-of-turn token included where it stops."""
    import torch

    torch.set_num_threads(1)  # 2 threads on a shared 2-core VM: 6x slower
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=2, pad_token_id=2)
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def hf_answers(hf_smollm2, prompts) -> list[list[int]]:
    """HF's up to 64 greedy tokens on each chat, computed once for the module's three tests (~25 s on
    the 2-core VM). A greedy run's first n tokens do not depend on how many follow, so a test that
    asks for fewer takes a prefix."""
    return [hf_greedy(hf_smollm2, ids, 64) for ids in prompts]


@pytest.mark.slow  # 23 s on the 2-core VM, loaded
def test_64_greedy_tokens_match_hf_on_three_chats(smollm2, hf_answers, prompts):
    """Up to 64 greedy tokens each, batched, equal to HF's (both stop at <|im_end|>); the
    instruction-tuned model answers the capital question and stops at its end-of-turn token."""
    folder = smollm2()
    with Engine(EngineConfig(model_dir=folder, num_threads=2, host_tier_gb=0)) as engine:
        completions = engine.generate(prompts, SamplingParams(max_tokens=64))
    for completion, expected in zip(completions, hf_answers, strict=True):
        assert completion.error is None
        assert completion.token_ids == expected
    assert [len(c.token_ids) for c in completions] == [64, 8, 64]  # the capital question ends at <|im_end|>
    assert [c.finish_reason for c in completions] == ["length", "stop", "length"]
    tokenizer = Tokenizer(folder, TokenizerInfo.from_dict(Manifest.read(folder).tokenizer))
    assert "Paris" in tokenizer.decode(completions[1].token_ids)


@pytest.mark.slow
def test_ort_quant_equals_hf_where_llama_cpp_does_not(smollm2, smollm2_gguf, hf_answers, prompts):
    """ort-quant (the GGUF's Q4_1 blocks on float activations, its Q8_0 head on int8 ones with the top
    logits refined in float; wicore/graph/quant.py) against HF and llama.cpp on the same GGUF.
    Measured: on an AVX-512 VNNI Xeon llama.cpp's greedy tokens equal HF's on the third chat only (on the
    other two its first token differs: its Q8_1 activations), on an AVX2-only EPYC on none; ort-quant's
    equal HF's on all three on both."""
    from test_gemma3_270m_quant import llama_greedy

    pytest.importorskip("llama_cpp")
    llm = open_llama(smollm2_gguf, n_ctx=512, n_threads=LLAMA_CPP_THREADS, logits_all=True, verbose=False)
    theirs = [llama_greedy(llm, ids, 64) for ids in prompts]
    with Engine(EngineConfig(model_dir=smollm2("ort-quant"), num_threads=2, host_tier_gb=0)) as engine:
        ours = [c.token_ids for c in engine.generate(prompts, SamplingParams(max_tokens=64))]
    assert ours == hf_answers
    # llama.cpp's kernels (and so which chats it gets right) depend on the CPU it was built for
    assert len([i for i in range(3) if theirs[i][: len(hf_answers[i])] == hf_answers[i]]) < 3


@pytest.mark.slow  # the session's export (tests/api/test_smollm2_chat.py serves it too) and HF's answers
def test_matmul_q_equals_hf_where_llama_cpp_does_not(smollm2, hf_answers, prompts, session_kernels, kernel_cache, monkeypatch):
    """`--op-flavour ort-quant --kernels wicore`: the linear layers on wicore.MatMulQ (int8 activations
    plus their rounding error rounded again). Measured: HF's 48 greedy tokens on all three chats, where
    llama.cpp's int8 activations alone change the first token of two (docs/PERFORMANCE.md, issue 37)."""
    monkeypatch.setenv("WICORE_CACHE", str(kernel_cache))  # the engine loads the session's kernel build
    folder = smollm2("ort-quant", "wicore")
    assert Manifest.read(folder).kernels == "wicore"
    with Engine(EngineConfig(model_dir=folder, num_threads=2, host_tier_gb=0)) as engine:
        ours = [c.token_ids for c in engine.generate(prompts, SamplingParams(max_tokens=48))]
    assert ours == [expected[:48] for expected in hf_answers]
