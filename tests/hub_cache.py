"""A Hugging Face Hub cache laid out as huggingface_hub writes it, for offline tests of models named by Hub id.

HF_HOME/hub/models--org--name/refs/main          the commit of `main`
HF_HOME/hub/models--org--name/snapshots/<commit>/ the files
"""

from __future__ import annotations

import json
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TINY_LLAMA = dict(
    vocab_size=16,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    bos_token_id=1,
    eos_token_id=2,
)
WORDS = ["zero", "<s>", "</s>", "user", "assistant", ":", "hello", "there", "the", "capital", "of", "is", "paris", "a", "b", "c"]
CHAT = "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}assistant : {% endif %}"


def snapshot(cache: Path, repo_id: str) -> Path:
    """An empty snapshot folder of `repo_id` in a hub-layout cache, as huggingface_hub lays it out."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    folder = repo / "snapshots" / COMMIT
    folder.mkdir(parents=True)
    return folder


def tiny_llama_repo(cache: Path, repo_id: str) -> object:
    """A random tiny Llama with a word-level tokenizer and a chat template, cached as `repo_id`; the HF model."""
    import torch
    import transformers
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    folder = snapshot(cache, repo_id)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_LLAMA)).eval()
    model.save_pretrained(folder)
    tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="zero"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT, "add_bos_token": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return model
