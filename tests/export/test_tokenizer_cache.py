"""wicore.export.tokenizer_cache: a GGUF's converted tokenizer is kept in WiCore's cache and copied
into the next export of the same vocabulary, byte for byte; any other vocabulary converts anew."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

import wicore.export.tokenizer as export_tokenizer
from wicore.export import tokenizer_cache
from wicore.export.gguf_file import read_gguf
from wicore.export.tokenizer import TOKENIZER_FILES, export_tokenizer_from_gguf

TOKENS = ["<unk>", "<s>", "</s>", "▁", "a", "b", "c", "▁a", "ab", "▁ab", "▁abc"]


def write_gguf(path: Path, tokens: list[str]) -> Path:
    """A GGUF holding a SentencePiece ("llama") vocabulary and no tensors."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(i) for i in range(len(tokens))])
    writer.add_token_types([2, 3, 3, *[1] * (len(tokens) - 3)])  # unknown, control x2, normal
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("WICORE_CACHE", str(tmp_path / "wicore-cache"))
    return tmp_path / "wicore-cache" / "tokenizers"


def files(folder: Path) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in TOKENIZER_FILES}


def refuse_conversion(monkeypatch: pytest.MonkeyPatch) -> None:
    def convert(*args: object) -> None:
        raise AssertionError("the vocabulary was converted again")

    monkeypatch.setattr(export_tokenizer, "_hf_tokenizer_from_gguf", convert)


def test_a_second_export_copies_the_first_conversion(tmp_path, cache, monkeypatch):
    source = write_gguf(tmp_path / "v.gguf", TOKENS)
    first = export_tokenizer_from_gguf(source, tmp_path / "one")
    key = tokenizer_cache.cache_key(read_gguf(source).metadata)
    assert sorted(p.name for p in cache.iterdir()) == [key]
    assert sorted(p.name for p in (cache / key).iterdir()) == sorted([*TOKENIZER_FILES, "info.json"])

    refuse_conversion(monkeypatch)
    second = export_tokenizer_from_gguf(source, tmp_path / "two")
    assert second == first
    assert files(tmp_path / "two") == files(tmp_path / "one")
    assert (first.bos_token_id, first.eos_token_ids, first.add_bos) == (1, (2,), True)


def test_another_vocabulary_or_converter_is_another_entry(tmp_path, cache, monkeypatch):
    one = read_gguf(write_gguf(tmp_path / "one.gguf", TOKENS)).metadata
    other = read_gguf(write_gguf(tmp_path / "other.gguf", [*TOKENS[:-1], "▁abd"])).metadata
    assert tokenizer_cache.cache_key(one) == tokenizer_cache.cache_key(dict(one))
    assert tokenizer_cache.cache_key(one) != tokenizer_cache.cache_key(other)
    assert tokenizer_cache.cache_key(one) != tokenizer_cache.cache_key({**one, "general.architecture": "gemma3"})
    assert tokenizer_cache.cache_key(one) == tokenizer_cache.cache_key({**one, "general.name": "renamed"})

    import transformers

    key = tokenizer_cache.cache_key(one)
    monkeypatch.setattr(transformers, "__version__", transformers.__version__ + ".post1")
    assert tokenizer_cache.cache_key(one) != key


def test_a_damaged_entry_is_converted_again(tmp_path, cache):
    source = write_gguf(tmp_path / "v.gguf", TOKENS)
    first = export_tokenizer_from_gguf(source, tmp_path / "one")
    (entry,) = cache.iterdir()
    (entry / "info.json").write_text("{not json")
    assert export_tokenizer_from_gguf(source, tmp_path / "two") == first
    (entry / "tokenizer.json").unlink()
    assert export_tokenizer_from_gguf(source, tmp_path / "three") == first
    assert files(tmp_path / "three") == files(tmp_path / "one")


def test_a_cache_that_cannot_be_written_is_skipped(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("WICORE_CACHE", str(blocker))  # its tokenizers/ cannot be made
    source = write_gguf(tmp_path / "v.gguf", TOKENS)
    first = export_tokenizer_from_gguf(source, tmp_path / "one")
    assert export_tokenizer_from_gguf(source, tmp_path / "two") == first
    assert files(tmp_path / "two") == files(tmp_path / "one")
