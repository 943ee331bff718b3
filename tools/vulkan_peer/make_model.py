"""A random Llama at SmolLM2-360M's shape (or `--tiny`) with SmolLM2's tokenizer: one Hugging Face folder
that llama.cpp (through its converter) and WiCore both read, so both run the same weights.

    python3 make_model.py OUT [--tiny]    # tokenizer.json / tokenizer_config.json beside this file
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPE = {
    "hidden_size": 960,
    "intermediate_size": 2560,
    "num_hidden_layers": 32,
    "num_attention_heads": 15,
    "num_key_value_heads": 5,
}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


def main(out: Path, tiny: bool) -> None:
    config = LlamaConfig(
        vocab_size=49152,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        **(TINY if tiny else SHAPE),
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    model.to(torch.float16).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(__file__).parent / name, out / name)
    print("params", sum(p.numel() for p in model.parameters()))


if __name__ == "__main__":
    main(Path(sys.argv[1]), "--tiny" in sys.argv)
