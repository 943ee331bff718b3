"""A tiny random Gemma3ForConditionalGeneration with a tokenizer and an image processor: the
oracle of the image tests (HF transformers' model, processor and chat template).

Shapes: SigLIP of 2 layers at width 32 over 56 x 56 images in 7 x 7 patches (64 patches), pooled
to 16 image tokens a side of 4; the text decoder is tests/conftest.py's TINY (sliding window 8,
so an image's 16 tokens are wider than the window). The tokenizer is a byte-level BPE trained
on a few sentences, with Gemma's special tokens; its vocabulary is the model's.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SPECIALS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
]
CORPUS = [
    "What is in this picture? Describe the image in one sentence.",
    "A red cat sits on a blue mat next to a green dog, and two birds fly over the hills.",
    "Compare the two images: which one is brighter, and what changed between them?",
    "user model system assistant hello world colors shapes numbers 0123456789",
]
IMAGE_SIZE, MM_TOKENS = 56, 16
VISION = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=IMAGE_SIZE, patch_size=7
)


@dataclass
class TinyMultimodal:
    folder: Path  # config.json, model.safetensors, tokenizer, preprocessor_config.json
    model: object  # Gemma3ForConditionalGeneration, eager attention
    processor: object  # Gemma3Processor (PIL image processor) with Gemma 3's chat template
    exports: dict[str, Path] = field(default_factory=dict)

    def export(self, dtype: str = "fp32") -> Path:
        """The model exported by wicore-export's code (once per dtype)."""
        if dtype not in self.exports:
            from wicore.export.exporter import ExportConfig, export_model
            from wicore.export.sources import open_source

            out = self.folder.parent / f"export-{dtype}"
            export_model(open_source(str(self.folder)), out, ExportConfig(dtype=dtype), progress=lambda _: None)
            self.exports[dtype] = out
        return self.exports[dtype]

    def inputs(self, messages: list[dict], images: list[bytes]) -> dict:
        """HF's prompt for `messages` (image parts as {"type": "image"}) with `images`:
        input_ids, pixel_values, token_type_ids (torch tensors)."""
        from PIL import Image

        text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        pil = [Image.open(io.BytesIO(b)) for b in images]
        return dict(self.processor(text=text, images=pil or None, return_tensors="pt", add_special_tokens=False))

    def logits(self, inputs: dict) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.model(**inputs).logits[0].float().numpy()


def build(folder: Path, text_config: dict, seed: int = 0) -> TinyMultimodal:
    """Train the tokenizer, make the random model (norms and projection drawn away from zero),
    save everything HF-style into `folder / "hf"`."""
    folder = folder / "hf"
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessorPil,
        Gemma3Processor,
        PreTrainedTokenizerFast,
    )

    from wicore.export.tokenizer import GEMMA3_CHAT_TEMPLATE

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(CORPUS * 20, trainer)
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    path = folder / "tokenizer.json"
    folder.mkdir(parents=True, exist_ok=True)
    bpe.save(str(path))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(path),
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        add_bos_token=True,
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )
    tokenizer.chat_template = GEMMA3_CHAT_TEMPLATE
    vocab = tokenizer.convert_tokens_to_ids
    torch.manual_seed(seed)
    config = Gemma3Config(
        text_config={**text_config, "vocab_size": bpe.get_vocab_size()},
        vision_config={**VISION, "vision_use_head": False},
        mm_tokens_per_image=MM_TOKENS,
        boi_token_index=vocab("<start_of_image>"),
        eoi_token_index=vocab("<end_of_image>"),
        image_token_index=vocab("<image_soft_token>"),
        bos_token_id=vocab("<bos>"),
        eos_token_id=[vocab("<eos>"), vocab("<end_of_turn>")],
        pad_token_id=vocab("<pad>"),
    )
    model = Gemma3ForConditionalGeneration(config).eval()
    model.set_attn_implementation("eager")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or "mm_input_projection" in name:
                param.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    image_processor = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    image_processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    processor = Gemma3Processor(image_processor, tokenizer, chat_template=GEMMA3_CHAT_TEMPLATE, image_seq_length=MM_TOKENS)
    return TinyMultimodal(folder, model, processor)


def png(seed: int, size: tuple[int, int] = (40, 70), fmt: str = "PNG") -> bytes:
    """A random RGB image of `size` (width, height), encoded."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt)
    return out.getvalue()


def user(*parts: str | bytes) -> list[dict]:
    """A one-turn conversation: text parts and images (bytes) in order, as HF's chat template takes them."""
    return [
        {"role": "user", "content": [{"type": "image"} if isinstance(p, bytes) else {"type": "text", "text": p} for p in parts]}
    ]
