"""A tiny random Gemma 3 text model with a real tokenizer: the model of the structured-output tests.

The tokenizer is a byte-level BPE (every byte is a token, so any text can be written) trained on
JSON and a few sentences, with Gemma's special tokens and chat template; its vocabulary is the
model's (tests/conftest.py's TINY otherwise).
"""

from __future__ import annotations

from pathlib import Path

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
CORPUS = [
    '{"name": "Alice", "age": 31, "tags": ["red", "blue"], "address": {"city": "Paris", "zip": "75001"}}',
    '[{"id": 1, "ok": true}, {"id": 2, "ok": false}, {"id": 3, "value": null, "score": -4.5e10}]',
    "What is the weather in Paris today? It is sunny and 21 degrees, with a light wind from the west.",
    "user model system assistant hello world yes no maybe 0123456789 abcdefghijklmnopqrstuvwxyz",
]
VOCAB_SIZE = 512


def train_tokenizer() -> object:
    """The byte-level BPE (a `tokenizers.Tokenizer`): ids 0-5 are SPECIALS, <eos> is 1."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(CORPUS * 20, trainer)
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return bpe


def build(folder: Path, text_config: dict, seed: int = 0) -> Path:
    """Train the tokenizer, make the random model, save both HF-style into `folder`; returns it."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, PreTrainedTokenizerFast

    from wicore.export.tokenizer import GEMMA3_CHAT_TEMPLATE

    bpe = train_tokenizer()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    bpe.save(str(path))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(path), bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>", add_bos_token=True
    )
    tokenizer.chat_template = GEMMA3_CHAT_TEMPLATE
    vocab = tokenizer.convert_tokens_to_ids
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        **{**text_config, "vocab_size": bpe.get_vocab_size()},
        bos_token_id=vocab("<bos>"),
        eos_token_id=[vocab("<eos>"), vocab("<end_of_turn>")],
        pad_token_id=vocab("<pad>"),
    )
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
