"""`wicore generate`'s output constraints, named as llama.cpp's CLI names them: a JSON schema
(`--json-schema` / `--json-schema-file`), a grammar (`--grammar` / `--grammar-file`: llguidance's
Lark, or llama.cpp's GBNF), a regular expression or a list of choices. The engine masks each step
as it does for the API's `response_format` / `structured_outputs` (wicore/structured)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from wicore.errors import UsageError
from wicore.structured.spec import StructuredKind, StructuredOutput


def add_constraint_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output constraint (one of these; the text always matches it)")
    one = g.add_mutually_exclusive_group()
    one.add_argument("--json-schema", metavar="SCHEMA", help="JSON the output must be, as a JSON schema ('{}': any JSON)")
    one.add_argument("--json-schema-file", type=Path, metavar="FILE", help="the JSON schema, from a file")
    one.add_argument("--grammar", help="a grammar: llguidance's Lark, or llama.cpp's GBNF (root ::= ...)")
    one.add_argument("--grammar-file", type=Path, metavar="FILE", help="the grammar, from a file (.lark, .gbnf)")
    one.add_argument("--regex", help="a regular expression the whole output matches (Rust regex syntax)")
    one.add_argument("--choice", action="append", metavar="TEXT", help="the output is exactly one of these; repeat")


def constraint_from_args(args: argparse.Namespace) -> StructuredOutput | None:
    """The flags' constraint; UsageError naming the flag where a file or a schema cannot be read.
    Whether a grammar or schema compiles is the engine's check, when the prompts are queued."""
    if args.json_schema is not None or args.json_schema_file is not None:
        flag = "--json-schema" if args.json_schema is not None else f"--json-schema-file {args.json_schema_file}"
        text = args.json_schema if args.json_schema is not None else _read(args.json_schema_file, flag)
        try:
            json.loads(text)
        except ValueError as exc:
            raise UsageError(f"{flag}: not JSON ({exc})") from None
        return StructuredOutput(StructuredKind.JSON, text, flag)
    if args.grammar is not None or args.grammar_file is not None:
        flag = "--grammar" if args.grammar is not None else f"--grammar-file {args.grammar_file}"
        text = args.grammar if args.grammar is not None else _read(args.grammar_file, flag)
        return StructuredOutput(StructuredKind.GRAMMAR, text, flag)
    if args.regex is not None:
        return StructuredOutput(StructuredKind.REGEX, args.regex, "--regex")
    if args.choice:
        return StructuredOutput(StructuredKind.CHOICE, json.dumps(args.choice), "--choice")
    return None


def _read(path: Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{flag}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
