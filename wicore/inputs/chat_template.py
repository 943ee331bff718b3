"""Chat templates as transformers renders them (`apply_chat_template(..., tokenize=False)`): the
same sandboxed jinja2 environment (trimmed blocks, `{% generation %}`, loop controls), the same
helpers (`tojson` without HTML escaping, `raise_exception`, `strftime_now`, a `namespace` without
underscore names), and which templates take a message's content as a list of parts."""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from wicore.errors import ManifestError, RequestError


class _GenerationTag(jinja2.ext.Extension):
    """Accepts transformers' `{% generation %}...{% endgeneration %}` blocks and renders their body."""

    tags = {"generation"}  # noqa: RUF012  (jinja2 reads the tag names from the class)

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """jinja2's namespace() without underscore names, as transformers allows in templates."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore names ({name!r})")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # Unlike jinja2's own filter, no HTML escaping (transformers overrides it the same way).
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def check_chat_template(source: str, origin: str) -> None:
    """Raise RequestError, naming `origin`, unless `source` parses as a chat template."""
    try:
        compile_user_template(source)
    except ManifestError as e:
        raise RequestError(f"{origin}: {e.args[0].split(';')[0]}; fix the template's jinja syntax") from None


def joined_text(message: dict[str, Any]) -> dict[str, Any]:
    """A message whose content is a list of text parts, as one string (the parts joined by newlines,
    as vLLM passes them to a template that takes strings); any other message as it is."""
    content = message.get("content")
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return {**message, "content": "\n".join(str(p.get("text", "")) for p in content)}
    return message


@functools.lru_cache(maxsize=8)
def reads_content_parts(source: str) -> bool:
    """Whether a chat template takes a message's content as a list of parts: it loops over the
    content (directly or through a variable set from it) or tests whether it is a string. Templates that
    only print `message['content']` would print a list's Python form, so they get strings."""
    try:
        tree = jinja2.Environment(extensions=[_GenerationTag, jinja2.ext.loopcontrols]).parse(source)
    except jinja2.TemplateSyntaxError:
        return False

    def is_content(node: jinja2.nodes.Node, names: set[str]) -> bool:
        if isinstance(node, jinja2.nodes.Getattr):
            return node.attr == "content"
        if isinstance(node, jinja2.nodes.Getitem):
            return isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == "content"
        return isinstance(node, jinja2.nodes.Name) and node.name in names

    names: set[str] = set()
    for assign in tree.find_all(jinja2.nodes.Assign):
        if isinstance(assign.target, jinja2.nodes.Name) and is_content(assign.node, set()):
            names.add(assign.target.name)
    loops = any(is_content(loop.iter, names) for loop in tree.find_all(jinja2.nodes.For))
    type_tests = ("string", "iterable", "sequence", "mapping")  # not `is none` / `is defined`: those print it
    tests = any(t.name in type_tests and is_content(t.node, names) for t in tree.find_all(jinja2.nodes.Test))
    return loops or tests


@functools.lru_cache(maxsize=4)
def compile_user_template(source: str) -> jinja2.Template:
    return compile_template(source)[0]


def compile_template(source: str) -> tuple[jinja2.Template, bool]:
    """The template, in the environment transformers renders chat templates in (templates are
    untrusted: sandboxed), and whether it reads `tools`."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    try:
        return env.from_string(source), "tools" in jinja2.meta.find_undeclared_variables(env.parse(source))
    except jinja2.TemplateSyntaxError as e:
        raise ManifestError(f"the chat template does not parse ({e}); export the model again") from e
