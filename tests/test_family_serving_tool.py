"""tools/family_serving.py's HF side across Phi-3 LongRoPE's switch: the greedy text that
`check_families_gpu.py --serve` holds `wicore serve`'s to must be HF's forward over the sequence
so far at every token, whatever transformers' generate does with its cache there.

transformers 5.17 (the GPU machine's image) drops Phi-3's cache at the switch to run the whole
sequence with the long factors, but still feeds generate's forward only the newest token: every
token past the switch then comes from the token before it alone. The H200 records of 2026-11-28
took that text for HF's (docs/FAMILIES.md). The test puts 5.17's step into the installed
transformers (`stale_phi3_step`) and checks that the reference text does not follow it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from family_serving import hf_greedy_text, write_id_tokenizer

SWITCH = 32  # original_max_position_embeddings
VOCAB = 128
PROMPT = [(7 * i + 3) % VOCAB for i in range(28)]
NUM_TOKENS = 12  # the 6th is the first from a sequence past the switch (33 tokens)


def tiny_phi3_longrope():  # type: ignore[no-untyped-def]
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Phi3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        original_max_position_embeddings=SWITCH,
        rope_scaling={
            "type": "longrope",
            "short_factor": [1.0 + 0.1 * i for i in range(8)],
            "long_factor": [1.0 + 2.0 * i for i in range(8)],
        },
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=1,
        initializer_range=0.2,  # logits far enough apart that the tokens are no near-ties
    )
    return transformers.Phi3ForCausalLM(cfg).eval()


def stale_phi3_step(model):  # type: ignore[no-untyped-def]
    """transformers 5.17's Phi3ForCausalLM.prepare_inputs_for_generation: past the switch with a cache
    of the short factors, the cache goes, but generate's next_sequence_length (1) still cuts the input
    to the newest token."""
    from transformers import GenerationMixin

    def prepare(input_ids, **kwargs):  # type: ignore[no-untyped-def]
        key = "cache" if "cache" in kwargs else "past_key_values"
        cache = kwargs.get(key)
        if cache is not None and input_ids.shape[1] >= SWITCH + 1 and cache.get_seq_length() <= SWITCH:
            kwargs[key] = None
        return GenerationMixin.prepare_inputs_for_generation(model, input_ids, **kwargs)

    return prepare


def forward_greedy(model, prompt: list[int], num_tokens: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Each token the argmax of HF's forward over the whole sequence so far (no cache)."""
    import torch

    seq = list(prompt)
    with torch.no_grad():
        for _ in range(num_tokens):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt) :]


def lone_chain(model, token: int, num_tokens: int) -> list[int]:  # type: ignore[no-untyped-def]
    """Each token the argmax of HF's forward over the token before it alone."""
    import torch

    out = []
    with torch.no_grad():
        for _ in range(num_tokens):
            token = int(model(torch.tensor([[token]])).logits[0, -1].argmax())
            out.append(token)
    return out


@pytest.mark.slow  # builds a tiny model and runs ~40 forwards: ~3 s
def test_the_reference_text_is_hfs_forward_across_the_longrope_switch(tmp_path, monkeypatch):
    import torch

    model = tiny_phi3_longrope()
    tokenizer = write_id_tokenizer(tmp_path, VOCAB)
    expected = forward_greedy(model, PROMPT, NUM_TOKENS)
    monkeypatch.setattr(model, "prepare_inputs_for_generation", stale_phi3_step(model))
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        cached = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=NUM_TOKENS, do_sample=False, eos_token_id=None
        )
    stale = cached[0, len(PROMPT) :].tolist()
    crossing = SWITCH + 1 - len(PROMPT)  # the first token generated from a sequence past the switch
    # 5.17's step as the GPU machine ran it: HF's tokens up to the switch, then each from its lone predecessor
    assert stale[:crossing] == expected[:crossing]
    alone = lone_chain(model, stale[crossing - 1], NUM_TOKENS - crossing)
    assert stale[crossing:] == alone != expected[crossing:]
    assert hf_greedy_text(model, tokenizer, [PROMPT], NUM_TOKENS) == [tokenizer.decode(expected)]
