"""Tokenizer.token_bytes and the logprob shapes built on it: the bytes a token stands for, for
byte-level BPE (GPT-2's table: SmolLM2, Llama 3, Qwen) as for SentencePiece's byte fallback."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer as FastTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from wicore.api.logprobs import LogprobFormatter, TokenLogprobs
from wicore.inputs.tokenizer import Tokenizer
from wicore.model.tokenizer_info import TokenizerInfo
from wicore.types.sampling import Logprobs

TEXT = "I like it 😀 and 🎉, naïve café"


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """A byte-level BPE trained on a few words: the emoji stay split into byte pieces."""
    fast = FastTokenizer(models.BPE())
    fast.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    fast.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|im_end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    fast.train_from_iterator(["I like it and naive cafe"] * 20, trainer)
    folder = tmp_path_factory.mktemp("byte_level")
    fast.save(str(folder / "tokenizer.json"))
    info = TokenizerInfo(("tokenizer.json",), None, (0,), None, False, "")
    return Tokenizer(Path(folder), info)


def test_the_bytes_of_byte_level_tokens_join_to_the_text(byte_level):
    ids = byte_level.encode(TEXT)
    pieces = [byte_level.token_bytes(i) for i in ids]
    assert b"".join(pieces) == TEXT.encode("utf-8")
    partial = [p for p in pieces if not _is_utf8(p)]
    assert partial  # the emoji's bytes come in several tokens: each is part of a character
    assert byte_level.token_bytes(byte_level.encode("<|im_end|>")[0]) == b"<|im_end|>"  # a special token as written


def test_chat_logprob_bytes_are_the_real_bytes_and_completion_keys_stay_apart(byte_level):
    ids = byte_level.encode("😀")
    fmt = LogprobFormatter(byte_level)
    tokens = [TokenLogprobs(0, Logprobs(i, -0.5, tuple(ids), (-0.5,) * len(ids))) for i in ids]
    content = fmt.chat(tokens)["content"]
    assert b"".join(bytes(entry["bytes"]) for entry in content) == "😀".encode()
    assert all(entry["token"] == "\ufffd" for entry in content)  # no character of its own
    keys = fmt.completion(tokens)["top_logprobs"][0]
    assert list(keys) == ["bytes:" + "".join(f"\\x{b:02x}" for b in byte_level.token_bytes(i)) for i in ids]
    assert len(keys) == len(set(ids))  # one key per token: none collapse into U+FFFD


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.slow
def test_smollm2s_token_bytes_are_hfs_byte_level_pieces(smollm2, hf_tokenizer_smollm2):
    """The real byte-level vocabulary (SmolLM2-135M-Instruct), each token's bytes against
    transformers' own byte table, and an emoji reply's bytes joined."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from wicore.graph.manifest import Manifest

    folder = smollm2()
    tok = Tokenizer(folder, TokenizerInfo.from_dict(Manifest.read(folder).tokenizer))
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    text = "Pizza 🍕 and 😀, naïve"
    ids = hf_tokenizer_smollm2.encode(text, add_special_tokens=False)
    for token_id, piece in zip(ids, hf_tokenizer_smollm2.convert_ids_to_tokens(ids)):
        assert tok.token_bytes(token_id) == bytes(byte_of[c] for c in piece), piece
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")
    assert any(not _is_utf8(tok.token_bytes(i)) for i in ids)  # some token is part of an emoji
