"""Where a request ends in the engine: at the model's EOS, at a stop token, at max_tokens, or
where the context is full. What it generates up to there is HF transformers' greedy
continuation, and where HF's own generate stops at EOS the engine stops too."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_engine import tiny_config

from wicore.engine.engine import Completion, Engine
from wicore.engine.scheduler import SchedulerConfig
from wicore.errors import ContextLengthError
from wicore.types.sampling import SamplingParams

PROMPT = np.random.default_rng(0).integers(3, 512, 20).tolist()
NUM_NEW = 12


def hf_generate(model, prompt: list[int], num_tokens: int, stop_at_eos: bool = False) -> list[int]:
    """HF transformers' greedy continuation of `prompt`: up to `num_tokens`, stopping at the
    model's EOS (generation_config.eos_token_id) only if `stop_at_eos`."""
    import torch

    ids = torch.tensor([prompt])
    eos = {} if stop_at_eos else {"eos_token_id": None}
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=num_tokens, do_sample=False, **eos)
    return out[0, len(prompt) :].tolist()


def engine(model_dir, **scheduler) -> Engine:
    return Engine(tiny_config(model_dir, num_device_blocks=128, scheduler=SchedulerConfig(prefill_chunk=16, **scheduler)))


def generate(model_dir, params: SamplingParams, prompt: list[int] = PROMPT, **scheduler) -> Completion:
    with engine(model_dir, **scheduler) as eng:
        [done] = eng.generate([prompt], params)
    assert done.error is None and done.num_prompt_tokens == len(prompt)
    return done


@pytest.fixture(scope="module")
def tiny(tiny_export):
    return tiny_export(2)  # (exported folder, HF model); the model's EOS is 1


@pytest.fixture(scope="module")
def continuation(tiny) -> list[int]:
    tokens = hf_generate(tiny[1], PROMPT, NUM_NEW)
    assert len(tokens) == NUM_NEW and 1 not in tokens  # EOS (1) does not cut it short
    return tokens


def first_new_token_from(tokens: list[int], index: int) -> int:
    """Position of the first token at or after `index` that does not occur before it."""
    return next(i for i in range(index, len(tokens)) if tokens[i] not in tokens[:i])


def test_a_stop_token_ends_the_request_with_stop_and_is_returned(tiny, continuation):
    k = first_new_token_from(continuation, 3)
    assert k < NUM_NEW - 1
    done = generate(tiny[0], SamplingParams(max_tokens=NUM_NEW, ignore_eos=True, stop_token_ids=(continuation[k],)))
    assert (done.token_ids, done.finish_reason) == (continuation[: k + 1], "stop")


def test_the_earliest_of_several_stop_tokens_ends_the_request(tiny, continuation):
    early = first_new_token_from(continuation, 1)
    late = first_new_token_from(continuation, early + 1)
    params = SamplingParams(max_tokens=NUM_NEW, ignore_eos=True, stop_token_ids=(continuation[late], continuation[early]))
    done = generate(tiny[0], params)
    assert (done.token_ids, done.finish_reason) == (continuation[: early + 1], "stop")


def test_a_stop_token_that_never_comes_leaves_the_request_to_its_length(tiny, continuation):
    absent = next(t for t in range(3, 512) if t not in continuation)
    done = generate(tiny[0], SamplingParams(max_tokens=NUM_NEW, stop_token_ids=(absent,)))
    assert (done.token_ids, done.finish_reason) == (continuation, "length")


@pytest.fixture(scope="module")
def eos_model(tiny_export, continuation):
    """The same weights (same seed) with EOS set to a token the greedy continuation reaches at
    position k. The export has no tokenizer, so the engine takes EOS from the model config."""
    k = first_new_token_from(continuation, 3)
    folder, model = tiny_export(2, eos_token_id=continuation[k])
    return folder, model, k


def test_the_models_eos_ends_the_request_where_hf_stops(eos_model, continuation):
    folder, model, k = eos_model
    eos = continuation[k]
    assert hf_generate(model, PROMPT, NUM_NEW) == continuation  # the same weights
    hf_stopped = hf_generate(model, PROMPT, NUM_NEW, stop_at_eos=True)
    assert hf_stopped == continuation[: k + 1]  # HF stops at EOS and returns it
    with engine(folder) as eng:
        assert eng.eos_token_ids == (eos,)
        [done] = eng.generate([PROMPT], SamplingParams(max_tokens=NUM_NEW))
    assert (done.token_ids, done.finish_reason) == (hf_stopped, "stop")


def test_ignore_eos_runs_past_the_models_eos(eos_model, continuation):
    folder, _, k = eos_model
    done = generate(folder, SamplingParams(max_tokens=NUM_NEW, ignore_eos=True))
    assert continuation[k] in done.token_ids[: k + 1]
    assert (done.token_ids, done.finish_reason) == (continuation, "length")


def test_every_eos_id_of_an_hf_config_list_ends_the_request(tiny_export, continuation):
    """Gemma 3's HF configs list several EOS ids ([1, 106]); HF generate stops at any of them."""
    k = first_new_token_from(continuation, 3)
    folder, model = tiny_export(2, eos_token_id=[1, continuation[k]])
    assert hf_generate(model, PROMPT, NUM_NEW, stop_at_eos=True) == continuation[: k + 1]
    done = generate(folder, SamplingParams(max_tokens=NUM_NEW))
    assert (done.token_ids, done.finish_reason) == (continuation[: k + 1], "stop")


# -- the context ---------------------------------------------------------------------------
@pytest.mark.parametrize("max_tokens", [100, None])
def test_a_request_ends_with_length_exactly_where_the_configured_context_is_full(tiny, continuation, max_tokens):
    """max_context 30, a 20-token prompt: 10 tokens, whether it asked for more or for no limit."""
    done = generate(tiny[0], SamplingParams(max_tokens=max_tokens, ignore_eos=True), max_context=30)
    assert (done.token_ids, done.finish_reason) == (continuation[:10], "length")
    assert done.num_prompt_tokens + len(done.token_ids) == 30


def test_a_prompt_one_short_of_the_context_gets_one_token(tiny, continuation):
    done = generate(tiny[0], SamplingParams(max_tokens=5, ignore_eos=True), max_context=21)
    assert (done.token_ids, done.finish_reason) == (continuation[:1], "length")


@pytest.mark.parametrize("prompt_len", [20, 25])
def test_a_prompt_that_fills_the_context_is_refused(tiny, prompt_len):
    prompt = (PROMPT * 2)[:prompt_len]
    with engine(tiny[0], max_context=20) as eng:
        assert eng.max_context == 20
        with pytest.raises(ContextLengthError) as err:
            eng.add_request(prompt, SamplingParams(max_tokens=1), request_id="long")
        assert not eng.has_request("long") and eng.num_queued == 0
    assert str(err.value) == (
        f"the prompt has {prompt_len} tokens; max_context holds 20 tokens (prompt plus at least one generated token); "
        "the model takes up to 256"
    )


def test_without_max_tokens_a_request_generates_until_the_models_context_is_full(tiny):
    """No configured limit: the model's max_position_embeddings (256) bounds the sequence;
    a 250-token prompt gets the 6 tokens HF generates there."""
    model_dir, model = tiny
    prompt = np.random.default_rng(1).integers(3, 512, 250).tolist()
    with engine(model_dir) as eng:
        assert eng.max_context == 256
        [done] = eng.generate([prompt], SamplingParams(max_tokens=None, ignore_eos=True))
    assert (done.token_ids, done.finish_reason) == (hf_generate(model, prompt, 6), "length")
