"""wicore.structured: the vocabulary bridge, compiling with its cache and limits, grammar states and
packed masks, on a real byte-level BPE tokenizer (tests/tiny_chat.py). The oracle of a mask is the
vocabulary itself: the tokens whose text can continue the output."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import tiny_chat

from wicore.errors import StructuredOutputError
from wicore.structured.bitmask import allowed_ids, apply_bitmask, num_words
from wicore.structured.compiler import GrammarCompiler, GrammarLimits, vocabulary
from wicore.structured.spec import StructuredKind, StructuredOutput

EOS = 1


@pytest.fixture(scope="module")
def bpe():
    return tiny_chat.train_tokenizer()


@pytest.fixture(scope="module")
def compiler(bpe) -> GrammarCompiler:
    return GrammarCompiler(vocabulary(bpe.to_str(), bpe.get_vocab_size(), [EOS]), bpe.get_vocab_size())


def texts(bpe) -> list[str]:
    """Each token's text ('' for the special tokens)."""
    return [bpe.decode([i], skip_special_tokens=True) for i in range(bpe.get_vocab_size())]


def regex(value: str) -> StructuredOutput:
    return StructuredOutput(StructuredKind.REGEX, value, "structured_outputs.regex")


def ids_of(mask: np.ndarray, bpe) -> set[int]:
    return set(allowed_ids(mask, bpe.get_vocab_size()).tolist())


def test_a_regex_mask_is_every_token_whose_text_can_continue_the_match(compiler, bpe):
    state = compiler.start(regex("[a-z]+"))
    words = texts(bpe)
    letters = {i for i, t in enumerate(words) if t and re.fullmatch("[a-z]+", t)}
    assert ids_of(state.masks()[0], bpe) == letters
    assert not state.is_accepting
    for token in bpe.encode("hello", add_special_tokens=False).ids:
        assert state.accept(token)
    assert state.is_accepting and not state.is_finished
    assert ids_of(state.masks()[0], bpe) == letters | {EOS}  # more letters, or the end
    assert not state.accept(bpe.token_to_id("!"))  # refused, and the state is unchanged
    assert ids_of(state.masks()[0], bpe) == letters | {EOS}


def test_a_choice_finishes_at_the_end_of_its_longest_string(compiler, bpe):
    words = texts(bpe)
    state = compiler.start(StructuredOutput(StructuredKind.CHOICE, json.dumps(["yes", "no", "maybe"]), "guided_choice"))
    first = {i for i, t in enumerate(words) if t and any(c.startswith(t) for c in ("yes", "no", "maybe"))}
    assert ids_of(state.masks()[0], bpe) == first
    for token in bpe.encode("maybe", add_special_tokens=False).ids:
        assert state.accept(token)
    assert state.is_finished
    assert ids_of(state.masks()[0], bpe) == {EOS}


def test_a_json_schema_is_followed_token_by_token(compiler, bpe):
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"], "additionalProperties": False}
    state = compiler.start(StructuredOutput(StructuredKind.JSON, json.dumps(schema)))
    text = '{"age": 31}'
    for token in bpe.encode(text, add_special_tokens=False).ids:
        assert token in ids_of(state.masks()[0], bpe)
        assert state.accept(token)
    assert state.is_finished
    compact = compiler.start(StructuredOutput(StructuredKind.JSON, json.dumps(schema)))
    assert compact.num_valid(bpe.encode('{"age":31}', add_special_tokens=False).ids) < len(
        bpe.encode('{"age":31}', add_special_tokens=False).ids
    )  # separators are json.dumps' (", " and ": "), no free whitespace


def test_the_grammar_of_a_schema_without_additional_properties_ends_the_object_after_its_keys(compiler, bpe):
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    state = compiler.start(StructuredOutput(StructuredKind.JSON, json.dumps(schema)))
    assert state.num_valid(bpe.encode('{"age": 31}', add_special_tokens=False).ids) == len(
        bpe.encode('{"age": 31}', add_special_tokens=False).ids
    )
    extra = bpe.encode('{"age": 31, "x": 1}', add_special_tokens=False).ids
    assert state.num_valid(extra) < len(extra)
    open_ = compiler.start(StructuredOutput(StructuredKind.JSON, json.dumps({**schema, "additionalProperties": True})))
    assert open_.num_valid(extra) == len(extra)


def test_draft_masks_are_the_masks_after_each_draft_prefix_and_leave_the_state_alone(compiler, bpe):
    state = compiler.start(regex("(ab|cd)+x"))
    draft = bpe.encode("abcdab", add_special_tokens=False).ids
    masks = state.masks(draft)
    assert state.num_tokens == 0
    assert masks.shape == (len(draft) + 1, num_words(bpe.get_vocab_size()))
    for i, token in enumerate(draft):
        assert ids_of(masks[i], bpe) == ids_of(state.masks()[0], bpe)
        assert state.accept(token)
    assert ids_of(masks[-1], bpe) == ids_of(state.masks()[0], bpe)
    state.rollback(len(draft))
    refused = bpe.encode("abzz", add_special_tokens=False).ids
    masks = state.masks(refused)
    assert state.num_valid(refused) == len(bpe.encode("ab", add_special_tokens=False).ids)
    cut = state.num_valid(refused)
    assert not masks[cut + 1 :].any()  # past the refused token: nothing
    assert state.num_tokens == 0 and ids_of(state.masks()[0], bpe) == ids_of(masks[0], bpe)


def test_rollback_returns_to_the_earlier_mask(compiler, bpe):
    state = compiler.start(regex("[0-9]{3}-[a-z]{2}"))
    before = state.masks()[0].copy()
    for token in bpe.encode("12", add_special_tokens=False).ids:
        assert state.accept(token)
    state.rollback(state.num_tokens)
    assert np.array_equal(state.masks()[0], before)
    with pytest.raises(ValueError, match="cannot roll back 1 tokens of 0"):
        state.rollback(1)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            StructuredOutput(StructuredKind.JSON, '{"type": "strnig"}', "response_format.json_schema.schema"),
            "Invalid type: strnig",
        ),
        (StructuredOutput(StructuredKind.JSON, "{not json", "guided_json"), "Expecting property name"),
        (StructuredOutput(StructuredKind.JSON, "[1, 2]", "guided_json"), "a JSON schema is an object"),
        (StructuredOutput(StructuredKind.JSON, '{"type": "string", "format": "zipcode"}', "guided_json"), "Unknown format"),
        (regex("(["), "unclosed character class"),
        (StructuredOutput(StructuredKind.CHOICE, "[]", "guided_choice"), "non-empty list of strings"),
        (StructuredOutput(StructuredKind.GRAMMAR, "start: undefined_rule", "guided_grammar"), "undefined_rule"),
    ],
)
def test_what_cannot_compile_is_refused_naming_the_field_and_the_reason(compiler, spec, message):
    with pytest.raises(StructuredOutputError, match=re.escape(message)) as err:
        compiler.start(spec)
    assert err.value.field == spec.field
    assert str(err.value).startswith(f"{spec.field}: ")


def test_limits_refuse_what_is_too_large(bpe):
    vocab = vocabulary(bpe.to_str(), bpe.get_vocab_size(), [EOS])
    small = GrammarCompiler(vocab, bpe.get_vocab_size(), GrammarLimits(max_spec_chars=10))
    with pytest.raises(StructuredOutputError, match="the regular expression has 11 characters; this server compiles at most 10"):
        small.start(regex("[a-z]{1,99}"))
    tight = GrammarCompiler(vocab, bpe.get_vocab_size(), GrammarLimits(max_grammar_size=20))
    big = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(50)}}
    with pytest.raises(StructuredOutputError, match="cannot be compiled: .*(grammar|size)"):
        tight.start(StructuredOutput(StructuredKind.JSON, json.dumps(big)))


def test_a_constraint_compiles_once_and_the_cache_keeps_the_latest(bpe):
    c = GrammarCompiler(vocabulary(bpe.to_str(), bpe.get_vocab_size(), [EOS]), bpe.get_vocab_size(), GrammarLimits(cache_size=2))
    a, b, d = regex("a+"), regex("b+"), regex("d+")
    first, second = c.start(a), c.start(a)
    assert c.num_compiled == 1
    assert first.accept(bpe.token_to_id("a")) and second.num_tokens == 0  # states are separate copies
    c.start(b)
    c.start(a)  # a is the most recent again
    c.start(d)  # evicts b
    assert c.num_compiled == 3
    c.start(a)
    assert c.num_compiled == 3
    c.start(b)
    assert c.num_compiled == 4


def test_apply_bitmask_keeps_the_allowed_logits_and_puts_the_rest_at_minus_infinity():
    rng = np.random.default_rng(0)
    vocab = 1000  # not a multiple of 32: the last word is partly used
    keep = rng.random(vocab) < 0.3
    mask = np.zeros(num_words(vocab), np.int32)
    for i in np.flatnonzero(keep):
        mask[i // 32] |= np.int32(1 << (i % 32)) if i % 32 < 31 else np.int32(-(2**31))
    logits = rng.normal(size=vocab).astype(np.float32)
    out = apply_bitmask(logits, mask)
    assert np.array_equal(out[keep], logits[keep])
    assert np.all(out[~keep] == -np.inf)
    assert np.array_equal(allowed_ids(mask, vocab), np.flatnonzero(keep))
    assert out is not logits and np.isfinite(logits).all()


def test_the_error_survives_pickling_with_its_field():
    import pickle

    err = pickle.loads(pickle.dumps(StructuredOutputError("guided_regex: bad", "guided_regex")))
    assert str(err) == "guided_regex: bad" and err.field == "guided_regex"
