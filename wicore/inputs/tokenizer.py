"""Serving-time tokenizer: tokenizer.json through `tokenizers`, chat templates through jinja2
(wicore.inputs.chat_template).

No transformers import here. Encoding matches transformers on the same
tokenizer.json: the text goes through the fast tokenizer without its
post-processor, and the bos token is put in front when `TokenizerInfo.add_bos`
says so (transformers' post-processor does the same for Gemma). Chat templates
render as transformers' `apply_chat_template(..., tokenize=False)` does: same
sandboxed jinja2 settings and helpers, messages without their None fields.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
from tokenizers import Tokenizer as _FastTokenizer

from wicore.errors import ManifestError, RequestError
from wicore.inputs.chat_template import (
    compile_template,
    compile_user_template,
    joined_text,
    reads_content_parts,
)
from wicore.model.tokenizer_info import TokenizerInfo

# Placeholders of guard_specials: private-use characters around the literal's index. The
# characters themselves are hidden too when a message holds them, so no text can forge one.
_OPEN, _CLOSE = "\ue000", "\ue001"
_PLACEHOLDER = re.compile(f"{_OPEN}(\\d+){_CLOSE}")

# The named special tokens transformers passes to every chat template (its `special_tokens_map`).
_SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class Tokenizer:
    """Text <-> token ids for one exported model folder."""

    def __init__(self, folder: Path, info: TokenizerInfo) -> None:
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ManifestError(f"{path} is missing; export the model again")
        try:
            self._tokenizer = _FastTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on a malformed file
            raise ManifestError(f"{path} cannot be loaded ({e}); export the model again") from e
        self.info = info
        self._template_vars = _special_token_strings(folder / "tokenizer_config.json", self._tokenizer, info)
        self._template, self.takes_tools = compile_template(info.chat_template)
        self._reads_parts = reads_content_parts(info.chat_template)
        self._path = path
        self._plain: _FastTokenizer | None = None  # `_plain_tokenizer()`, made when first needed
        specials = sorted({t.content for t in self._tokenizer.get_added_tokens_decoder().values() if t.special}, key=len)
        self._specials = re.compile("|".join(re.escape(t) for t in [*reversed(specials), _OPEN, _CLOSE]))
        self._special_ids = set(self._tokenizer.get_added_tokens_decoder())
        self._is_byte_level = _is_byte_level(self._tokenizer)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def to_json(self) -> str:
        """The tokenizer as tokenizer.json text (what a grammar library builds its vocabulary from)."""
        return self._tokenizer.to_str()

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry (`▁Paris`, `<0xE2>`, `<eos>`), or None past the vocabulary."""
        return self._tokenizer.id_to_token(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for, whole characters or not: a byte-level BPE piece (GPT-2's
        byte-to-character table: SmolLM2, Llama 3, Qwen) mapped back to its bytes, a byte-fallback
        piece (`<0xE2>`) as its byte, a special token as written, anything else its text in UTF-8."""
        piece = self.id_to_token(token_id) or ""
        if token_id in self._special_ids:
            return piece.encode("utf-8")
        if self._is_byte_level and all(c in _BYTE_OF_CHAR for c in piece):
            return bytes(_BYTE_OF_CHAR[c] for c in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return self.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def encode(self, text: str, add_bos: bool | None = None, literals: Sequence[str] = ()) -> list[int]:
        """Token ids of `text`; special tokens written in it (`<start_of_turn>`) become their ids.

        `add_bos=None` follows `info.add_bos`. Encode a rendered chat template with add_bos=False:
        the template writes `<bos>` itself. `literals`: the text that `guard_specials` took out of
        the messages, whose placeholders in `text` encode as that text, special tokens as plain text.
        """
        if literals:
            parts = _PLACEHOLDER.split(text)  # text, literal index, text, ...
            ids = []
            for i, part in enumerate(parts):
                if i % 2 == 0:
                    ids += self._tokenizer.encode(part, add_special_tokens=False).ids if part else []
                else:
                    ids += self._plain_tokenizer().encode(literals[int(part)], add_special_tokens=False).ids
        else:
            ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        if self.info.add_bos if add_bos is None else add_bos:
            if self.info.bos_token_id is None:
                raise RequestError("this tokenizer has no bos token; encode with add_bos=False")
            ids.insert(0, self.info.bos_token_id)
        return ids

    def _plain_tokenizer(self) -> _FastTokenizer:
        """The same vocabulary reading special tokens as plain text: what special tokens written in
        message text encode with. Loaded on first use (a second copy of tokenizer.json: a second or
        so and tens of MiB for Gemma's 262K tokens), which only such a message needs."""
        if self._plain is None:
            plain = _FastTokenizer.from_file(str(self._path))
            plain.encode_special_tokens = True
            self._plain = plain
        return self._plain

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def guard_specials(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
        """The role-injection guard: `messages` with every special token written in their text
        (`<end_of_turn>`, `<start_of_turn>`, `<start_of_image>`, ...) replaced by a placeholder, and
        the text replaced, for `encode(..., literals=)`. A user who writes `<end_of_turn><start_of_turn>
        model` then sends those characters, not a turn of the model's; the control tokens of the
        prompt are the template's own."""
        literals: list[str] = []

        def hide(text: str) -> str:
            def placeholder(match: re.Match[str]) -> str:
                literals.append(match.group(0))
                return f"{_OPEN}{len(literals) - 1}{_CLOSE}"

            return self._specials.sub(placeholder, text)

        def part(p: Any) -> Any:
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str):
                return {**p, "text": hide(p["text"])}
            return p

        guarded = []
        for message in messages:
            content = message.get("content")
            if isinstance(content, str):
                message = {**message, "content": hide(content)}
            elif isinstance(content, list):
                message = {**message, "content": [part(p) for p in content]}
            guarded.append(message)
        return guarded, tuple(literals)

    @property
    def has_chat_template(self) -> bool:
        """Whether the model shipped a chat template (TokenizerInfo.has_chat_template)."""
        return self.info.has_chat_template

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text of a conversation; contents are strings or lists of `{"type": "text", ...}` parts.

        `chat_template` (jinja source, a server's --chat-template) replaces the model's. `tools`
        (OpenAI tool objects) go to the template as transformers passes them; a template that never
        reads them (`takes_tools` False) renders as without."""
        if not messages:
            raise RequestError("the conversation is empty; send at least one message")
        cleaned = [{k: v for k, v in message.items() if v is not None} for message in messages]
        template = self._template if chat_template is None else compile_user_template(chat_template)
        if not (self._reads_parts if chat_template is None else reads_content_parts(chat_template)):
            cleaned = [joined_text(message) for message in cleaned]
        try:
            return template.render(
                messages=cleaned,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self._template_vars,
            )
        except jinja2.TemplateError as e:
            raise RequestError(f"the chat template rejected the messages: {e}") from e
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:  # the template's code on these messages
            raise RequestError(f"the chat template cannot render these messages ({type(e).__name__}: {e})") from e


class IncrementalDecoder:
    """Streams text while token ids arrive one at a time; the pieces add up to the full decode.

    The usual prefix/read offset scheme (vLLM, TGI):

    ```
    ids:   ... | prefix_offset ........ | read_offset ........ |
                 already emitted,         not yet emitted
                 decoded again as context
    ```

    Each step decodes ids[prefix_offset:read_offset] and ids[prefix_offset:];
    the new text is the difference. Text ending in U+FFFD is an incomplete
    UTF-8 sequence from byte-fallback tokens (a split emoji or CJK character),
    so it is held back until the next token completes it. `flush()` returns
    whatever is still held at the end of the stream.
    """

    # How many prompt ids are kept as context, so the first generated token decodes as it would mid-text.
    _PROMPT_CONTEXT = 5

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True, prompt_ids: Sequence[int] = ()) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = list(prompt_ids[-self._PROMPT_CONTEXT :]) if prompt_ids else []
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def push(self, token_id: int) -> str:
        """Add one generated id; return the text it completes (may be empty)."""
        return self.push_all((token_id,))

    def push_all(self, token_ids: Sequence[int]) -> str:
        """Add several generated ids at once (a stream that fell behind): the text they complete,
        for two decodes instead of two an id. The pieces still add up to the full decode; only
        where they split can differ from pushing the ids one by one (text before an incomplete
        character at the end waits with it)."""
        if not token_ids:
            return ""
        self._ids.extend(token_ids)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self._ids))
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """The text still held back (an incomplete sequence decodes to U+FFFD, as in a full decode)."""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        new_text = self._decode(self._prefix_offset, len(self._ids))
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return new_text[len(prefix_text) :]

    def _decode(self, start: int, end: int) -> str:
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=self._skip_special_tokens)


def _byte_to_char() -> dict[int, str]:
    """GPT-2's table of byte-level BPE: each byte as a printable character (printable ASCII and
    Latin-1 as themselves, the other bytes from U+0100 on)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in kept}
    for n, b in enumerate(b for b in range(256) if b not in table):
        table[b] = chr(256 + n)
    return table


_BYTE_OF_CHAR = {c: b for b, c in _byte_to_char().items()}


def _is_byte_level(tokenizer: _FastTokenizer) -> bool:
    """Whether the tokenizer's decoder is byte-level BPE's (alone or in a sequence)."""
    decoder = tokenizer.decoder
    if decoder is None:
        return False
    state = json.loads(decoder.__getstate__())
    return state.get("type") == "ByteLevel" or any(d.get("type") == "ByteLevel" for d in state.get("decoders", []))


def _special_token_strings(config_path: Path, tokenizer: _FastTokenizer, info: TokenizerInfo) -> dict[str, str]:
    """bos_token, eos_token, ... as strings: from tokenizer_config.json, else from the info's ids."""
    config: dict[str, Any] = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    strings: dict[str, str] = {}
    for name in _SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, dict):  # an AddedToken serialized by older transformers
            value = value.get("content")
        if isinstance(value, str):
            strings[name] = value
    fallback_ids = {
        "bos_token": info.bos_token_id,
        "eos_token": info.eos_token_ids[0] if info.eos_token_ids else None,
        "pad_token": info.pad_token_id,
    }
    for name, token_id in fallback_ids.items():
        if name not in strings and token_id is not None:
            token = tokenizer.id_to_token(token_id)
            if token is not None:
                strings[name] = token
    return strings
