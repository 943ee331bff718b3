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


@dataclass(frozen=True)
class Tolerance:
    """What an export must reach against HF on the verify text."""

    min_margin: float  # positions where HF's top logit leads its runner-up by this much must have HF's argmax
    max_perplexity_change: float  # |the text's perplexity under the graphs / under HF - 1|


# fp32 portable graphs compute what HF computes, in another order: every position agrees, near-ties
# included. fp16 weights, or ort-quant's int8 activations on the GGUF's own quantized weights (as
# llama.cpp runs them; HF runs fp32 on the same weights dequantized), move the logits a little. Measured
# with ort-quant on the 270M over 64 to 256 tokens of VERIFY_TEXT: HF's lead of its top logit over the
# runner-up moved by at most 0.41, the argmax flipped only where that lead was under 0.08 (4 of the
# first 64 positions: 93.75%), and the perplexity changed by at most 0.27%. So leads of 1.0 (2.4x the
# largest move) must agree, and the perplexity must stay within 2%.
EXACT = Tolerance(min_margin=0.0, max_perplexity_change=0.001)
APPROXIMATE = Tolerance(min_margin=1.0, max_perplexity_change=0.02)


def tolerance(op_flavour: str, dtype: str) -> Tolerance:
    return EXACT if (op_flavour, dtype) == ("portable", "fp32") else APPROXIMATE


@dataclass(frozen=True)
class VerifyReport:
    num_tokens: int
    max_abs_diff: float
    logit_scale: float  # max |logit| of the reference, to read the difference against
    argmax_agreement: float  # fraction of all positions with the same argmax
    num_clear: int  # positions where HF's lead is at least tolerance.min_margin
    num_clear_agreeing: int
    perplexity: float  # of the text's tokens 1.. under the graphs' logits
    reference_perplexity: float
    tolerance: Tolerance

    @property
    def perplexity_change(self) -> float:
        return self.perplexity / self.reference_perplexity - 1

    @property
    def ok(self) -> bool:
        clear = self.num_clear_agreeing == self.num_clear
        return clear and abs(self.perplexity_change) <= self.tolerance.max_perplexity_change

    def summary(self) -> str:
        tol = self.tolerance
        where = "every position" if tol.min_margin == 0 else f"where HF leads by >= {tol.min_margin:g}"
        return (
            f"verify: {self.num_tokens} positions; argmax agreement {self.argmax_agreement:.2%}, "
            f"{self.num_clear_agreeing}/{self.num_clear} {where} (all needed); perplexity {self.perplexity:.3f} "
            f"against HF's {self.reference_perplexity:.3f} ({self.perplexity_change:+.2%}, within "
            f"{tol.max_perplexity_change:.1%} needed); max |logit diff| {self.max_abs_diff:.3g} (HF's logits up to "
            f"{self.logit_scale:.3g}) -> {'OK' if self.ok else 'MISMATCH'}"
        )


def load_hf_model(source: str):
    """transformers' model on the same weights (fp32, eager attention); a pulled name is pulled first."""
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise WiCoreError("--verify needs torch and transformers: in the WiCore checkout, pip install '.[dev]'") from exc
    from wicore.export.pull import PULLABLE, pull

    if source in PACKAGED:
        path = packaged_gguf(source)
    else:
        path = pull(source) if source in PULLABLE and not Path(source).exists() else Path(source)
    kwargs = {"dtype": torch.float32, "attn_implementation": "eager"}
    if path.suffix == ".gguf":
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **kwargs).eval()
    return AutoModelForCausalLM.from_pretrained(str(path), **kwargs).eval()


def hf_logits(model, token_ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].float().numpy()


def compare_logits(ours: np.ndarray, ref: np.ndarray, token_ids: list[int], tol: Tolerance = EXACT) -> VerifyReport:
    """Logits at every position of `token_ids` ([n, vocab]) against the reference's."""
    rows = np.arange(len(ref))
    top2 = np.argsort(ref, axis=-1)[:, -2:]
    lead = ref[rows, top2[:, 1]] - ref[rows, top2[:, 0]]
    agree = ours.argmax(-1) == ref.argmax(-1)
    clear = lead >= tol.min_margin
    return VerifyReport(
        num_tokens=len(ref),
        max_abs_diff=float(np.abs(ours - ref).max()),
        logit_scale=float(np.abs(ref).max()),
        argmax_agreement=float(agree.mean()),
        num_clear=int(clear.sum()),
        num_clear_agreeing=int((agree & clear).sum()),
        perplexity=perplexity(ours, token_ids),
        reference_perplexity=perplexity(ref, token_ids),
        tolerance=tol,
    )


def perplexity(logits: np.ndarray, token_ids: list[int]) -> float:
    """exp of the mean negative log-likelihood of tokens 1.. given the logits before each."""
    x = logits[:-1].astype(np.float64)
    x -= x.max(-1, keepdims=True)
    log_probs = x - np.log(np.exp(x).sum(-1, keepdims=True))
    return float(np.exp(-log_probs[np.arange(len(x)), token_ids[1:]].mean()))


def verify_against_hf(model_dir: Path, source: str, num_tokens: int = 64) -> VerifyReport:
    """The exported model's logits at every position of a prompt (through the engine, as served)
    against HF transformers' on the source's weights."""
    from wicore.engine.engine import Engine, EngineConfig
    from wicore.types.sampling import SamplingParams

    with Engine(EngineConfig(model_dir=Path(model_dir), host_tier_gb=0.0)) as engine:
        if engine.manifest.tokenizer is not None:
            ids = engine.tokenizer.encode(" ".join([VERIFY_TEXT] * (1 + num_tokens // 60)))[:num_tokens]
        else:
            ids = np.random.default_rng(0).integers(0, engine.manifest.config.vocab_size, num_tokens).tolist()
        [done] = engine.generate([ids], SamplingParams(max_tokens=1, prompt_logits=True))
        tol = tolerance(engine.manifest.op_flavour, engine.manifest.dtype)
    assert done.prompt_logits is not None, done.error
    return compare_logits(done.prompt_logits, hf_logits(load_hf_model(source), ids), ids, tol)
