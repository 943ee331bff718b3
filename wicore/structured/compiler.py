"""StructuredOutput -> a grammar the model's vocabulary can follow, compiled once per distinct value.

    StructuredOutput ──► grammar text (llguidance's JSON / Lark form) ──► LLMatcher (the template)
                                                          cache: LRU by StructuredOutput
    GrammarCompiler.start(spec) ──► template.deep_copy() ──► GrammarState (one per request)

The library is llguidance (docs/PERFORMANCE.md, "Structured output": it compiles a JSON schema in
milliseconds and computes a 262K-token mask in well under one, where xgrammar and outlines take
seconds to minutes for the vocabulary). Its tokenizer is built from the model's tokenizer.json,
once per compiler (~1 s for Gemma 3's 262,144 tokens).

Limits: the constraint's text is at most `max_spec_chars`; the grammar it compiles to at most
`max_grammar_size` symbols; building its lexer at most `lexer_fuel` units of work (llguidance's
fuel: ~50,000 a millisecond, so the default bounds a compile to ~1 s). Past any of them, or when the
library cannot compile the constraint, `start` raises StructuredOutputError naming the field.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import llguidance
from llguidance import LLMatcher, LLParserLimits, LLTokenizer

from wicore.errors import StructuredOutputError
from wicore.structured.schema import JSON_OBJECT, generation_schema
from wicore.structured.spec import StructuredKind, StructuredOutput
from wicore.structured.state import GrammarState

# JSON as models write it (json.dumps' separators), no free whitespace between tokens: a flexible
# run of whitespace lets a small model pad a value with newlines until max_tokens. A schema may
# override these with llguidance's "x-guidance" key.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT = json.dumps(generation_schema(JSON_OBJECT))  # JSON mode: any object, its numbers bounded (schema.py)


@dataclass(frozen=True)
class GrammarLimits:
    max_spec_chars: int = 256 * 1024  # the schema / regex / grammar text
    max_grammar_size: int = 500_000  # symbols in the compiled grammar's productions
    lexer_fuel: int = 50_000_000  # work building the lexer (~1 s)
    max_compile_seconds: float = 10.0  # a compile that took longer is refused (and not cached)
    cache_size: int = 256  # distinct constraints kept compiled

    def __post_init__(self) -> None:
        if min(self.max_spec_chars, self.max_grammar_size, self.lexer_fuel, self.cache_size) < 1 or self.max_compile_seconds <= 0:
            raise ValueError("grammar limits must be positive")


def vocabulary(tokenizer_json: str, vocab_size: int, eos_token_ids: Sequence[int]) -> LLTokenizer:
    """llguidance's view of a model's vocabulary: the tokenizer.json text (a `tokenizers` model),
    `vocab_size` mask bits (the logits' width, which may exceed the tokenizer's), and the tokens a
    finished grammar allows (the model's end-of-sequence tokens)."""
    return LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids))


def grammar_text(spec: StructuredOutput) -> str:
    """The constraint in llguidance's grammar form; StructuredOutputError when it does not parse."""
    where = f"{spec.field}: "
    try:
        if spec.kind is StructuredKind.JSON:
            schema = json.loads(spec.value)
            if not isinstance(schema, (dict, bool)):
                raise StructuredOutputError(f"{where}a JSON schema is an object, got {type(schema).__name__}", spec.field)
            closed = json.dumps(generation_schema(schema), ensure_ascii=False)  # closed, bounded (schema.py)
            return LLMatcher.grammar_from_json_schema(closed, defaults=JSON_OPTIONS)  # type: ignore[arg-type]
        if spec.kind is StructuredKind.JSON_OBJECT:
            return LLMatcher.grammar_from_json_schema(ANY_OBJECT, defaults=JSON_OPTIONS)  # type: ignore[arg-type]
        if spec.kind is StructuredKind.REGEX:
            return LLMatcher.grammar_from_regex(spec.value)
        if spec.kind is StructuredKind.CHOICE:
            choices = json.loads(spec.value)
            if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
                raise StructuredOutputError(f"{where}expected a non-empty list of strings", spec.field)
            return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
        return llguidance.grammar_from("grammar", spec.value)  # Lark, or GBNF (llama.cpp) converted to Lark
    except StructuredOutputError:
        raise
    except ValueError as exc:  # json.JSONDecodeError included
        raise StructuredOutputError(f"{where}{exc}", spec.field) from exc


class GrammarCompiler:
    """Compiles constraints against one vocabulary and starts per-request states; thread-safe
    (requests are admitted from the API's threads while the engine steps)."""

    def __init__(self, vocab: LLTokenizer, vocab_size: int, limits: GrammarLimits | None = None) -> None:
        self.vocab = vocab
        self.vocab_size = vocab_size
        self.limits = limits or GrammarLimits()
        self._parser_limits = LLParserLimits(
            max_grammar_size=self.limits.max_grammar_size, initial_lexer_fuel=self.limits.lexer_fuel, verbose_errors=False
        )
        self._templates: OrderedDict[StructuredOutput, LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self.num_compiled = 0  # compiles run (cache misses)

    def start(self, spec: StructuredOutput) -> GrammarState:
        """A fresh state of `spec`'s grammar, compiled now unless it is cached."""
        with self._lock:
            template = self._templates.get(spec)
            if template is not None:
                self._templates.move_to_end(spec)
                return GrammarState(template.deep_copy(), self.vocab_size)
        template = self._compile(spec)  # outside the lock: llguidance drops the GIL while it compiles
        with self._lock:
            self._templates[spec] = template
            self._templates.move_to_end(spec)
            while len(self._templates) > self.limits.cache_size:
                self._templates.popitem(last=False)
            return GrammarState(template.deep_copy(), self.vocab_size)

    def _compile(self, spec: StructuredOutput) -> LLMatcher:
        limits = self.limits
        what = {StructuredKind.JSON: "JSON schema", StructuredKind.REGEX: "regular expression", StructuredKind.CHOICE: "choice"}
        name = what.get(spec.kind, "grammar")
        if len(spec.value) > limits.max_spec_chars:
            raise StructuredOutputError(
                f"{spec.field}: the {name} has {len(spec.value)} characters; this server compiles at most {limits.max_spec_chars}",
                spec.field,
            )
        text = grammar_text(spec)
        started = time.monotonic()
        matcher = LLMatcher(self.vocab, text, limits=self._parser_limits, log_level=0)
        seconds = time.monotonic() - started
        self.num_compiled += 1
        if matcher.is_error():
            raise StructuredOutputError(
                f"{spec.field}: the {name} cannot be compiled: {_one_line(matcher.get_error())}", spec.field
            )
        if seconds > limits.max_compile_seconds:
            raise StructuredOutputError(
                f"{spec.field}: the {name} took {seconds:.1f} s to compile; this server allows {limits.max_compile_seconds:g} s",
                spec.field,
            )
        return matcher


def _one_line(error: str) -> str:
    """llguidance's error (several lines, with carets under the place) as one line."""
    text = " ".join(line.strip() for line in error.strip().splitlines() if line.strip())
    return (text[:400] + " ...") if len(text) > 400 else text or "unknown error"
