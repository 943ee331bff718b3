"""Constrained decoding through the engine (wicore.executor.constrained) on a tiny random Gemma 3
with a real tokenizer: outputs match their constraint (checked by Python's json / re, and by HF
transformers' logits over the tokens a choice allows), batch with free requests, survive
preemption, and speculative decoding leaves constrained greedy text unchanged."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from tiny_engine import tiny_config

from wicore.engine.engine import Engine
from wicore.engine.scheduler import SchedulerConfig
from wicore.engine.speculative import SpeculativeConfig
from wicore.errors import StructuredOutputError
from wicore.structured.spec import StructuredKind, StructuredOutput
from wicore.types.sampling import SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["red", "blue"]}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
JSON = StructuredOutput(StructuredKind.JSON, json.dumps(SCHEMA), "guided_json")
REGEX = StructuredOutput(StructuredKind.REGEX, r"[a-z]{2,5}-[0-9]{1,3}", "guided_regex")
CHOICES = ["yes", "no", "maybe", "the weather"]
CHOICE = StructuredOutput(StructuredKind.CHOICE, json.dumps(CHOICES), "guided_choice")
PROMPTS = ['{"name": "Alice", "age": 31, "tags": ["red"]} and', "What is the weather in Paris?", "hello world", "0123"]


def engine(folder, **overrides) -> Engine:
    return Engine(tiny_config(folder, **{"verify_files": False, **overrides}))


def valid(spec: StructuredOutput, text: str) -> bool:
    if spec is JSON:
        import jsonschema

        try:
            jsonschema.validate(json.loads(text), SCHEMA)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    if spec is REGEX:
        return re.fullmatch(REGEX.value, text) is not None
    return text in CHOICES


def requests() -> list[tuple[str, SamplingParams]]:
    """Constrained requests (greedy and seeded, with top-k / top-p / penalties / logprobs) and free ones."""
    out = []
    for i, spec in enumerate([JSON, REGEX, CHOICE] * 2):
        sampling = [
            dict(),
            dict(temperature=1.0, seed=i),
            dict(temperature=0.8, top_k=20, seed=i),
            dict(temperature=1.0, top_p=0.9, frequency_penalty=0.5, seed=i),
        ][i % 4]
        out.append(
            (
                PROMPTS[i % len(PROMPTS)],
                SamplingParams(max_tokens=64, structured=spec, logprobs=2 if i == 4 else None, **sampling),
            )
        )
        out.append((PROMPTS[(i + 1) % len(PROMPTS)], SamplingParams(max_tokens=8, temperature=1.0, seed=i, ignore_eos=True)))
    return out


def test_constrained_and_free_requests_batch_and_every_constrained_output_is_valid(tiny_chat):
    folder, _ = tiny_chat
    with engine(folder) as e:
        reqs = requests()
        completions = e.generate([p for p, _ in reqs], [sp for _, sp in reqs])
        tok = e.tokenizer
        assert e.core.runner.masks.stats.num_steps > 0  # the mask thread ran
    for (_, params), c in zip(reqs, completions):
        if params.structured is None:
            assert c.finish_reason == "length" and len(c.token_ids) == 8
            continue
        text = tok.decode(c.token_ids)
        assert c.finish_reason == "stop", (params, text)
        assert valid(params.structured, text), (params.structured.kind, text)


def test_greedy_choice_is_hf_greedy_over_the_tokens_that_keep_a_choice_possible(tiny_chat):
    """The allowed tokens are worked out here from the vocabulary's texts: those that keep a choice
    possible, and where only one choice is left (its bytes are forced) the longest token of what
    remains, as llguidance forces the canonical token."""
    import torch
    from transformers import Gemma3ForCausalLM

    folder, hf = tiny_chat
    model = Gemma3ForCausalLM.from_pretrained(hf).eval()
    with engine(folder) as e:
        tok = e.tokenizer
        words = [tok.decode([i]) for i in range(e.manifest.config.vocab_size)]
        for prompt in PROMPTS:
            [c] = e.generate([prompt], SamplingParams(max_tokens=16, structured=CHOICE))
            ids, text, expected = tok.encode(prompt), "", []
            while text not in CHOICES or any(len(ch) > len(text) and ch.startswith(text) for ch in CHOICES):
                with torch.no_grad():
                    logits = model(torch.tensor([ids + expected])).logits[0, -1].numpy()
                ok = np.array([bool(w) and any(ch.startswith(text + w) for ch in CHOICES) for w in words])
                possible = [ch for ch in CHOICES if ch.startswith(text)]
                if len(possible) == 1:  # forced bytes: llguidance allows only their longest token (canonical)
                    rest = possible[0][len(text) :]
                    longest = max(len(w) for w, k in zip(words, ok) if k and rest.startswith(w))
                    ok &= np.array([len(w) == longest for w in words])
                if text in CHOICES:  # complete, and a longer choice still possible: the end is allowed too
                    ok[e.eos_token_ids[0]] = True
                token = int(np.argmax(np.where(ok, logits, -np.inf)))
                expected.append(token)
                if token in e.eos_token_ids:
                    break
                text += words[token]
            assert c.token_ids == expected, prompt
            assert c.finish_reason == "stop"


def test_max_tokens_inside_a_value_ends_with_length(tiny_chat):
    folder, _ = tiny_chat
    with engine(folder) as e:
        [c] = e.generate([PROMPTS[0]], SamplingParams(max_tokens=3, structured=JSON))
        assert c.finish_reason == "length" and len(c.token_ids) == 3
        assert e.tokenizer.decode(c.token_ids).startswith('{"')


def test_a_constraint_that_does_not_compile_is_refused_before_queuing(tiny_chat):
    folder, _ = tiny_chat
    with engine(folder) as e:
        bad = StructuredOutput(StructuredKind.JSON, '{"type": "strnig"}', "response_format.json_schema.schema")
        with pytest.raises(
            StructuredOutputError,
            match=r"^response_format.json_schema.schema: the JSON schema cannot be compiled: Invalid type: strnig",
        ):
            e.add_request(PROMPTS[0], SamplingParams(structured=bad))
        assert e.num_queued == 0


def test_a_model_without_a_tokenizer_refuses_a_constraint_naming_it(tiny_export):
    with engine(tiny_export(1)[0]) as e:
        with pytest.raises(StructuredOutputError, match=r"^guided_regex: structured output needs the model's tokenizer") as err:
            e.add_request([1, 2, 3], SamplingParams(structured=REGEX))
        assert err.value.field == "guided_regex" and e.num_queued == 0


def constrained_greedy(folder, **overrides) -> tuple[list[list[int]], dict]:
    params = [SamplingParams(max_tokens=48, structured=spec) for spec in (JSON, REGEX, CHOICE, JSON)]
    with engine(folder, **overrides) as e:
        out = e.generate(PROMPTS, params)
        return [c.token_ids for c in out], e.stats()


def test_constrained_greedy_is_the_same_with_ngram_speculation_and_under_preemption(tiny_chat):
    folder, _ = tiny_chat
    plain, _ = constrained_greedy(folder)
    spec, stats = constrained_greedy(folder, speculative=SpeculativeConfig("ngram", num_speculative_tokens=4))
    assert spec == plain
    assert stats.speculative.num_drafts > 0
    tight = dict(num_device_blocks=24, num_host_blocks=16)
    for preemption in ("swap", "recompute"):
        sched = SchedulerConfig(max_num_batched_tokens=32, prefill_chunk=8, preemption=preemption)
        out, stats = constrained_greedy(folder, scheduler=sched, **tight)
        assert out == plain
        assert stats.preempted_swap + stats.preempted_recompute > 0


@pytest.fixture(scope="module")
def with_sampling_head(tiny_chat, tmp_path_factory):
    """The tiny chat model exported with the sampling head (the graph draws tempered rows)."""
    from wicore.export.exporter import ExportConfig, export_model
    from wicore.export.sources import open_source

    out = tmp_path_factory.mktemp("tiny_chat_head") / "model"
    export_model(open_source(str(tiny_chat[1])), out, ExportConfig(sampling_head="on"), progress=lambda _: None)
    return out


def test_constrained_rows_draw_in_the_sampling_head_with_their_masks(tiny_chat, with_sampling_head):
    """With the head, free and constrained rows draw in the graph (a constrained row's mask bound
    beside its draw; penalties and logprobs still on the host): every output is what the export
    without the head gives, token for token."""
    reqs = requests()
    outputs = []
    for folder in (tiny_chat[0], with_sampling_head):
        with engine(folder) as e:
            assert e.core.runner.graphs.has_sampling_head == (folder == with_sampling_head)
            outputs.append([(c.token_ids, c.finish_reason) for c in e.generate([p for p, _ in reqs], [sp for _, sp in reqs])])
    assert outputs[0] == outputs[1]


@pytest.mark.slow  # ~3 s on the 2-core VM
def test_a_head_without_the_mask_input_leaves_constrained_rows_to_the_host(tiny_chat, with_sampling_head):
    """Greedy constrained requests draw in a head that takes masks (one run a step) and on the
    host with an older head (none): the same tokens either way."""
    from wicore.executor.sampling_head import SamplingHead

    params = [SamplingParams(max_tokens=24, structured=spec) for spec in (JSON, REGEX, CHOICE)]
    outputs, runs = [], []
    for token_bitmask in (True, False):
        with engine(with_sampling_head) as e:
            graphs = e.core.runner.graphs
            assert graphs.head is not None
            if not token_bitmask:
                graphs.head = SamplingHead(graphs.manifest.config.vocab_size, graphs.devices[-1], 1, token_bitmask=False)
            assert graphs.can_mask_in_head == token_bitmask
            outputs.append([c.token_ids for c in e.generate(PROMPTS[:3], params)])
            runs.append(graphs.head.num_runs)
    assert outputs[0] == outputs[1]
    assert runs[0] >= max(len(t) for t in outputs[0]) and runs[1] == 0
