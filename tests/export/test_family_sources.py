"""Per-family source details: llama.cpp's Q/K row order, the chat template of a source without one."""

from __future__ import annotations

import numpy as np
import pytest

from wicore.errors import RequestError
from wicore.export.gguf import unpermute_rows
from wicore.export.tokenizer import GEMMA3_CHAT_TEMPLATE, NO_CHAT_TEMPLATE, fallback_chat_template
from wicore.model.tokenizer_info import TokenizerInfo


@pytest.mark.parametrize(("rows", "heads"), [(576, 9), (192, 3), (8, 1)])
def test_unpermute_rows_is_transformers_reverse_permute(rows, heads):
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    w = np.random.default_rng(0).standard_normal((rows, 5)).astype(np.float32)
    expected = LlamaTensorProcessor(config={})._reverse_permute_weights(w, heads, heads)
    np.testing.assert_array_equal(w[unpermute_rows(rows, heads)], expected)


def test_fallback_chat_template_is_gemmas_for_gemma_only():
    assert fallback_chat_template("gemma3") == fallback_chat_template("gemma3_text") == GEMMA3_CHAT_TEMPLATE
    assert fallback_chat_template("llama") == fallback_chat_template("qwen2") == NO_CHAT_TEMPLATE


def test_a_model_without_chat_template_refuses_chat_saying_why(tmp_path):
    from tokenizers import Tokenizer as FastTokenizer
    from tokenizers.models import WordLevel

    from wicore.inputs.tokenizer import Tokenizer

    FastTokenizer(WordLevel({"a": 0, "<eos>": 1}, unk_token="a")).save(str(tmp_path / "tokenizer.json"))
    info = TokenizerInfo(
        files=("tokenizer.json",),
        bos_token_id=None,
        eos_token_ids=(1,),
        pad_token_id=None,
        add_bos=False,
        chat_template=NO_CHAT_TEMPLATE,
    )
    tokenizer = Tokenizer(tmp_path, info)
    with pytest.raises(RequestError, match="this model ships no chat template .*use /v1/completions"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
