"""A tiny random gpt-oss with a gpt-oss-like tokenizer: the model of the harmony serving tests.

The tokenizer is a byte-level BPE trained on a few sentences with gpt-oss's special tokens (its
`<|return|>` the eos token, `<|call|>` an end of the turn too, as generation_config.json of
openai/gpt-oss-20b says) and gpt-oss's own chat template; the model is tests/graph/test_gpt_oss.py's
shape at that vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

from scripted import GPT_OSS_TEMPLATE, HARMONY_SPECIALS

SPECIALS = ["<|endoftext|>", *HARMONY_SPECIALS]
CORPUS = [
    "analysis commentary final functions.get_weather to=functions json assistant user system developer",
    'What is the weather in Paris today? {"unit": "c", "days": 3} It is sunny and 21 degrees.',
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,:;!?'\"{}[]()",
]
VOCAB_SIZE = 384
SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 150_000.0,
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 128,  # shorter than the prompts: YaRN's ramp matters
    },
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "sliding_window": 8,
    "layer_types": ["sliding_attention", "full_attention"],
}


def build(folder: Path, seed: int = 0) -> Path:
    """Train the tokenizer, make the random model, save both HF-style into `folder`; returns it."""
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GptOssConfig, GptOssForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(CORPUS * 20, trainer)
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    folder.mkdir(parents=True, exist_ok=True)
    bpe.save(str(folder / "tokenizer.json"))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), eos_token="<|return|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = GPT_OSS_TEMPLATE
    vocab = bpe.token_to_id
    ends = [vocab("<|return|>"), vocab("<|call|>")]
    torch.manual_seed(seed)
    config = GptOssConfig(**SHAPE, vocab_size=bpe.get_vocab_size(), eos_token_id=ends, pad_token_id=vocab("<|endoftext|>"))
    model = GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(*((0.5, 0.5) if "norm" in name else (0.0, 0.3)))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": ends}))
    return folder
