"""The grammars that enforce tool_choice required / a named function, checked with llguidance
itself: every call the format writes (and its parser reads back) is a sentence of the grammar;
calls the request does not allow are not."""

from __future__ import annotations

import pytest
from scripted import HARMONY_SPECIALS, byte_tokenizer
from streamed import NAMES, TIME, WEATHER

from wicore.api.tools.formats import FORMATS
from wicore.api.tools.request import Function
from wicore.api.tools.scan import Call
from wicore.structured.schema import MAX_INTEGER

llguidance = pytest.importorskip("llguidance")

PARIS = Call("get_weather", {"city": "Paris", "unit": "c"})
NOON = Call("get_time", {"zone": "CET"})
NESTED = Function(
    "book",
    {
        "type": "object",
        "properties": {"who": {"$ref": "#/$defs/person"}, "seats": {"type": "integer", "minimum": 1}},
        "required": ["who", "seats"],
        "$defs": {"person": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
    },
)


@pytest.fixture(scope="module")
def lltok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    # harmony's markers are special tokens too, its <|call|> an end token (as gpt-oss's own vocabulary has them)
    tok = byte_tokenizer(folder, specials=("<|im_start|>", "<|im_end|>", *HARMONY_SPECIALS), eos=("<|im_end|>", "<|call|>"))
    return llguidance.LLTokenizer((folder / "tokenizer.json").read_text(), eos_token=list(tok.info.eos_token_ids))


def accepts(lltok, lark: str, text: str) -> bool:
    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    assert llguidance.LLMatcher.validate_grammar(grammar, lltok) == ""
    matcher = llguidance.LLMatcher(lltok, grammar, log_level=0)
    return matcher.consume_tokens(lltok.tokenize_str(text)) and matcher.is_accepting()


@pytest.mark.parametrize("name", list(FORMATS))
def test_the_calls_a_format_writes_are_its_grammars_sentences(lltok, name):
    fmt = FORMATS[name]
    functions = (WEATHER, TIME, NESTED)
    booking = Call("book", {"who": {"name": "Ada"}, "seats": 2})
    for calls in ([PARIS], [NOON, booking], [booking, PARIS, NOON]):
        written = fmt.render_calls(calls)
        assert fmt.parse(written, NAMES | {"book"}) == ("", calls)
        one_a_turn = name == "harmony"  # its <|call|> ends the model's turn
        assert accepts(lltok, fmt.grammar(functions, parallel=True), written) is (len(calls) == 1 or not one_a_turn)
        assert accepts(lltok, fmt.grammar(functions, parallel=False), written) is (len(calls) == 1)


@pytest.mark.parametrize("name", list(FORMATS))
def test_the_grammar_refuses_what_the_request_does_not_allow(lltok, name):
    fmt = FORMATS[name]
    named = fmt.grammar((TIME,), parallel=False)  # tool_choice naming get_time
    assert accepts(lltok, named, fmt.render_calls([NOON]))
    assert not accepts(lltok, named, fmt.render_calls([PARIS]))  # another function
    required = fmt.grammar((WEATHER, TIME), parallel=True)
    assert not accepts(lltok, required, fmt.render_calls([Call("get_weather", {"unit": "c"})]))  # city is required
    assert not accepts(lltok, required, fmt.render_calls([Call("get_weather", {"city": "Paris", "unit": "k"})]))  # enum
    assert not accepts(lltok, required, "The weather is fine.")  # text is no call
    assert not accepts(lltok, required, "")  # at least one call
    written = fmt.render_calls([PARIS])
    if '": ' in written:  # JSON in the calls: written one way, as json.dumps writes it
        assert not accepts(lltok, required, written.replace('": ', '":'))
    assert not accepts(lltok, fmt.grammar((NESTED,), True), fmt.render_calls([Call("book", {"who": {}, "seats": 0})]))


@pytest.mark.parametrize("name", list(FORMATS))
def test_an_unbounded_number_argument_has_at_most_16_digits(lltok, name):
    """A small model must not write digits until max_tokens (wicore/structured/schema.py)."""
    fmt = FORMATS[name]
    grammar = fmt.grammar((NESTED,), parallel=False)
    booking = {"who": {"name": "Ada"}}
    assert accepts(lltok, grammar, fmt.render_calls([Call("book", {**booking, "seats": MAX_INTEGER})]))
    assert not accepts(lltok, grammar, fmt.render_calls([Call("book", {**booking, "seats": 10**16})]))


def test_harmony_lets_an_analysis_message_come_before_the_forced_call(lltok):
    """gpt-oss reasons before it calls: one analysis message (any text, newlines too) may open the
    answer, then the call must come; a second analysis, an empty one or a final answer may not."""
    fmt = FORMATS["harmony"]
    grammar = fmt.grammar((WEATHER,), parallel=False)
    call = fmt.render_calls([PARIS])
    think = "<|channel|>analysis<|message|>The user wants Paris.\nCall get_weather.<|end|><|start|>assistant"
    assert accepts(lltok, grammar, think + call)
    assert accepts(lltok, grammar, call)
    assert not accepts(lltok, grammar, think + think + call)
    assert not accepts(lltok, grammar, "<|channel|>analysis<|message|><|end|><|start|>assistant" + call)
    assert not accepts(lltok, grammar, think)  # no call
    assert not accepts(lltok, grammar, think + "<|channel|>final<|message|>Sunny.")
