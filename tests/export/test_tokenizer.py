"""Tokenizer export (wicore.export.tokenizer) and serving (wicore.inputs.tokenizer) on the real Gemma 3 270M.

The tokenizer under test is the one the session's export of the packaged 270M wrote beside its graphs
(export_tokenizer_from_gguf through the GGUF source, its TokenizerInfo from the manifest), against
transformers' own tokenizer of the GGUF: both are tests/export/conftest.py's fixtures, shared with the
chat-template tests (test_chat_template.py). Tests that read the real vocabulary are marked slow.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from wicore.errors import ModelSourceError, RequestError, UnsupportedModelError
from wicore.export.tokenizer import GEMMA3_CHAT_TEMPLATE, check_whole_words, export_tokenizer_from_gguf, export_tokenizer_from_hf
from wicore.graph.manifest import Manifest
from wicore.inputs.tokenizer import IncrementalDecoder, Tokenizer
from wicore.model.tokenizer_info import TokenizerInfo

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "  two leading spaces, three   inside,    four before end    ",
    "tabs\there\t\tand\nnewlines\n\n\nand\r\ncrlf",
    "日本語のテキストと中文文本，한국어 텍스트",
    "emoji 😀🎉👍🏽 and a family 👨‍👩‍👧 and a rare one 🫨",
    "mixed: Ωmega ñ café русский العربية हिन्दी 龘 x²",
    "<start_of_turn>user\nhi<end_of_turn>",
    "<bos>text after a written bos<eos>",
    "",
    " ",
    "\n",
]


# --- export ------------------------------------------------------------------


@pytest.mark.slow
def test_export_writes_files_and_info(exported: tuple[Path, TokenizerInfo], hf: Any) -> None:
    folder, info = exported
    vocab = hf.get_vocab()
    assert info.files == ("tokenizer.json", "tokenizer_config.json")
    assert all((folder / name).is_file() for name in info.files)
    assert info.bos_token_id == vocab["<bos>"] == 2
    assert info.eos_token_ids == (vocab["<eos>"], vocab["<end_of_turn>"]) == (1, 106)
    assert info.pad_token_id == vocab["<pad>"] == 0
    assert info.add_bos is True
    assert info.chat_template == GEMMA3_CHAT_TEMPLATE  # the GGUF has none: Gemma's is shipped
    assert info.has_chat_template is False  # ... as a stand-in: a server treats it as a base model
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["chat_template"] == GEMMA3_CHAT_TEMPLATE
    assert config["add_bos_token"] is True
    assert (config["bos_token"], config["eos_token"], config["pad_token"]) == ("<bos>", "<eos>", "<pad>")


@pytest.mark.slow
def test_exported_tokenizer_json_equals_transformers(exported: tuple[Path, TokenizerInfo], hf: Any) -> None:
    ours = json.loads((exported[0] / "tokenizer.json").read_text(encoding="utf-8"))
    assert ours == json.loads(hf.backend_tokenizer.to_str())


@pytest.mark.slow
def test_info_dict_round_trip(info: TokenizerInfo) -> None:
    data = json.loads(json.dumps(info.to_dict()))
    assert TokenizerInfo.from_dict(data) == info


def test_manifests_written_before_the_flag_keep_chat() -> None:
    old = {"files": ["tokenizer.json"], "bos_token_id": 2, "eos_token_ids": [1], "pad_token_id": 0, "add_bos": True}
    assert TokenizerInfo.from_dict({**old, "chat_template": "x"}).has_chat_template is True


def test_missing_gguf_raises(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="GGUF file not found"):
        export_tokenizer_from_gguf(tmp_path / "absent.gguf", tmp_path / "out")


def test_non_gguf_file_raises(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"not a gguf file at all, just text" * 4)
    with pytest.raises(ModelSourceError, match="not a GGUF file"):
        export_tokenizer_from_gguf(bogus, tmp_path / "out")


def _hf_folder(exported: tuple[Path, TokenizerInfo], dest: Path, chat_template: str | None) -> Path:
    """A Hugging Face style folder holding the exported tokenizer, with or without a chat template."""
    dest.mkdir()
    shutil.copy(exported[0] / "tokenizer.json", dest / "tokenizer.json")
    config = json.loads((exported[0] / "tokenizer_config.json").read_text(encoding="utf-8"))
    del config["chat_template"]
    (dest / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (dest / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 106]}), encoding="utf-8")
    if chat_template is not None:
        (dest / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
    return dest


@pytest.mark.slow
def test_export_from_hf_folder_falls_back_to_gemma_template(exported: tuple[Path, TokenizerInfo], tmp_path: Path) -> None:
    folder = _hf_folder(exported, tmp_path / "hf", chat_template=None)
    info = export_tokenizer_from_hf(folder, tmp_path / "out")
    assert info == exported[1]
    assert json.loads((tmp_path / "out" / "tokenizer.json").read_text(encoding="utf-8")) == json.loads(
        (exported[0] / "tokenizer.json").read_text(encoding="utf-8")
    )


def test_export_from_hf_folder_uses_its_template(tiny_chat: tuple[Path, Path], tmp_path: Path) -> None:
    """On the tiny chat model's byte-level BPE: which template is kept reads no vocabulary (loading the
    270M's cost 13 s here), and the 270M's HF route is test_export_from_hf_folder_falls_back_to_gemma_template's."""
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    folder = tmp_path / "hf"
    folder.mkdir()
    shutil.copy(tiny_chat[1] / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((tiny_chat[1] / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.pop("chat_template", None)  # the folder's own template is the .jinja file alone
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    info = export_tokenizer_from_hf(folder, tmp_path / "out")
    assert info is not None and info.chat_template == template and info.has_chat_template is True
    tok = Tokenizer(tmp_path / "out", info)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert tok.apply_chat_template(messages) == "[user] hi\n[assistant] yo\n"
    other = "{% for m in messages %}<{{ m['role'] }}>{% endfor %}"  # a server's --chat-template replaces it
    assert tok.apply_chat_template(messages, chat_template=other) == "<user><assistant>"
    # A template that prints the content takes text parts as one string (joined by newlines, as vLLM does).
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert tok.apply_chat_template(parts) == "[user] a\nb\n"
    looping = "{% for m in messages %}{% for p in m['content'] %}({{ p['text'] }}){% endfor %}{% endfor %}"
    assert tok.apply_chat_template(parts, chat_template=looping) == "(a)(b)"
    # The template's own code failing on these messages is the request's error, not the server's.
    with pytest.raises(RequestError, match=r"cannot render these messages \(TypeError: "):
        tok.apply_chat_template(messages, chat_template="{{ messages[0]['content'] + 1 }}")


def test_export_from_hf_folder_without_tokenizer_is_none(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    assert export_tokenizer_from_hf(tmp_path, tmp_path / "out") is None


# --- runtime: load, encode, decode --------------------------------------------


@pytest.mark.slow
def test_load_time_and_vocab(exported: tuple[Path, TokenizerInfo], capsys: pytest.CaptureFixture[str]) -> None:
    start = time.perf_counter()
    tok = Tokenizer(*exported)
    elapsed = time.perf_counter() - start
    with capsys.disabled():
        print(f"\n[tokenizer] runtime Tokenizer load (tokenizer.json, 262k vocab): {elapsed:.2f} s")
    assert tok.vocab_size == 262144
    assert (tok.info.bos_token_id, tok.info.eos_token_ids, tok.info.pad_token_id) == (2, (1, 106), 0)


def test_runtime_imports_neither_transformers_nor_torch(tiny_chat: tuple[Path, Path]) -> None:
    """On the tiny chat model's export: the same Tokenizer code without loading 262k tokens in a subprocess."""
    folder = tiny_chat[0]
    tokenizer = Manifest.read(folder).tokenizer
    assert tokenizer is not None
    info = TokenizerInfo.from_dict(tokenizer)
    script = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from wicore.export.tokenizer import TokenizerInfo\n"
        "from wicore.inputs.tokenizer import Tokenizer\n"
        f"info = TokenizerInfo.from_dict(json.loads({json.dumps(json.dumps(info.to_dict()))}))\n"
        f"tok = Tokenizer(Path({str(folder)!r}), info)\n"
        "tok.encode(tok.apply_chat_template([{'role': 'user', 'content': 'hi'}]), add_bos=False)\n"
        "print(sorted(m for m in ('transformers', 'torch') if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(tok: Tokenizer, hf: Any, text: str) -> None:
    assert tok.encode(text) == hf(text)["input_ids"]
    assert tok.encode(text, add_bos=False) == hf(text, add_special_tokens=False)["input_ids"]


@pytest.mark.slow
def test_encode_exact_ids(tok: Tokenizer) -> None:
    assert tok.encode("") == [2]
    assert tok.encode("", add_bos=False) == []
    assert tok.encode("Hello world") == [2, 9259, 1902]
    assert tok.encode("<start_of_turn>user\nhi<end_of_turn>") == [2, 105, 2364, 107, 2202, 106]
    assert tok.encode("🫨", add_bos=False) == [478, 397, 409, 406]  # byte fallback <0xF0><0x9F><0xAB><0xA8>


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
def test_decode_matches_transformers(tok: Tokenizer, hf: Any, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert tok.decode(ids, skip_special_tokens=False) == hf.decode(ids, skip_special_tokens=False)


@pytest.mark.slow
@pytest.mark.parametrize("text", [t for t in TEXTS if "<" not in t])
def test_decode_round_trips(tok: Tokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.slow
def test_decode_special_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("<start_of_turn>user\nhi<end_of_turn>")
    assert tok.decode(ids) == "user\nhi"
    assert tok.decode(ids, skip_special_tokens=False) == "<bos><start_of_turn>user\nhi<end_of_turn>"


# --- runtime: incremental decoding --------------------------------------------


@pytest.mark.slow
def test_incremental_decoder_matches_full_decode(tok: Tokenizer) -> None:
    text = "Hi 🫨 there 龘 日本語のテキスト 😀👨‍👩‍👧!\n\tend"
    ids = tok.encode(text, add_bos=False)
    decoder = IncrementalDecoder(tok)
    pieces = [decoder.push(i) for i in ids]
    pieces.append(decoder.flush())
    assert "".join(pieces) == tok.decode(ids) == text
    assert all("\ufffd" not in piece for piece in pieces)
    # 🫨 is four byte-fallback tokens: nothing comes out until the last one.
    start = ids.index(478)
    assert pieces[start : start + 4] == ["", "", "", "🫨"]


@pytest.mark.slow
@pytest.mark.parametrize("group", [2, 3, 5, 100])
def test_incremental_decoder_takes_ids_in_groups_and_still_adds_up_to_the_full_decode(tok: Tokenizer, group: int) -> None:
    """A stream that fell behind pushes several ids at once (wicore.engine.channel merges them)."""
    text = "Hi 🫨 there 龘 日本語のテキスト 😀👨‍👩‍👧!\n\tend"
    ids = tok.encode(text, add_bos=False)
    decoder = IncrementalDecoder(tok)
    pieces = [decoder.push_all(ids[i : i + group]) for i in range(0, len(ids), group)]
    pieces.append(decoder.flush())
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)
    assert decoder.push_all([]) == ""


@pytest.mark.slow
def test_incremental_decoder_skips_special_tokens_and_flushes_partial(tok: Tokenizer) -> None:
    ids = tok.encode("<start_of_turn>model\nok", add_bos=True) + [478, 397]  # ends inside an emoji
    decoder = IncrementalDecoder(tok)
    pieces = [decoder.push(i) for i in ids]
    assert "".join(pieces) == "model\nok"
    assert decoder.flush() == tok.decode(ids)[len("model\nok") :] == "\ufffd\ufffd"
    assert decoder.flush() == ""


@pytest.mark.slow  # 9 s on the 2-core VM, loaded
def test_a_vocabulary_converted_without_its_merges_is_refused(exported: tuple[Path, TokenizerInfo], tmp_path: Path) -> None:
    # What transformers 5.17 built from this GGUF: the pieces, none of the merges.
    from transformers import PreTrainedTokenizerFast

    data = json.loads((exported[0] / "tokenizer.json").read_text(encoding="utf-8"))
    whole = PreTrainedTokenizerFast(tokenizer_file=str(exported[0] / "tokenizer.json"))
    check_whole_words(whole, "gemma")  # the exported one passes
    data["model"]["merges"] = []
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    fragments = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert fragments.encode(" that", add_special_tokens=False) != [600]
    message = r"gemma: the tokenizer transformers .* splits .*'▁that'.*transformers>=5.18"
    with pytest.raises(UnsupportedModelError, match=message):
        check_whole_words(fragments, "gemma")
