"""GGUF model source: the header becomes a DecoderConfig, tensors are dequantized on demand.

wicore.export.gguf_file memory-maps the file, so only the layer being built is ever
dequantized into float32 (every type in the packaged 270M: F32, Q8_0, Q6_K,
Q5_0, Q4_K; `gguf.quants.dequantize` covers the rest of llama.cpp's types).
Quantized 2-D tensors come back as `QuantizedTensor`s that also hold their
blocks, which the ort-quant flavour transcodes losslessly (export/quant.py).
llama.cpp's converter stores Gemma RMSNorm weights as `1 + w`; they are
returned here as `w`, the Hugging Face convention the builder expects (the
family's `norm_offset`, 0 for Llama and Qwen). For the `llama` architecture
it also interleaved the rows of each Q and K head (its RoPE rotates adjacent
pairs, HF's rotates halves); they are put back in HF's order here, blocks and
all, as transformers' GGUF loader does (`reverse_permute_weights`).

Mixtures of experts (Qwen3-MoE as `qwen3moe`, Mixtral as `llama` with `expert_count` in the
header) stack a layer's experts in one tensor a projection, split here into WiCore's
per-expert [out, in] matrices (wicore.model.weights.expected_shapes), blocks and all (a row's
blocks never cross experts):

    blk.N.ffn_gate_inp.weight   [E, H]      mlp.router
    blk.N.ffn_gate_exps.weight  [E, W, H]   mlp.experts.{e}.gate_proj
    blk.N.ffn_up_exps.weight    [E, W, H]   mlp.experts.{e}.up_proj
    blk.N.ffn_down_exps.weight  [E, H, W]   mlp.experts.{e}.down_proj
    blk.N.ffn_gate.E.weight     [W, H]      mlp.experts.{E}.gate_proj (Mixtral GGUFs of before
                                            the stacks: one tensor an expert, up and down alike)

llama.cpp renormalises the top k of every `qwen3moe` (its header has no norm_topk_prob) and of
Mixtral, as the released models do; a header's `expert_weights_norm` is honoured where present.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from wicore.errors import ModelSourceError, UnsupportedModelError
from wicore.export.gguf_file import GGUFTensor, dequantize, read_gguf
from wicore.export.gguf_gpt_oss import LAYER_NAMES as GPT_OSS_LAYER_NAMES
from wicore.export.gguf_gpt_oss import gpt_oss_config
from wicore.export.gguf_quant import can_transcode, transcode_gguf
from wicore.model.config import FULL, SLIDING, DecoderConfig, RopeConfig, default_layer_types
from wicore.model.families import family_of_gguf
from wicore.model.quant import BlockQuant, QuantizedTensor
from wicore.model.weights import LayerWeights

# A layer's stacked experts: GGUF tensor suffix -> the projection of each expert (module doc).
_EXPERT_NAMES = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
# GGUF tensor suffix -> Hugging Face name, and whether it is an RMSNorm weight.
_LAYER_NAMES: dict[str, tuple[str, bool]] = {
    "attn_q": ("self_attn.q_proj", False),
    "attn_k": ("self_attn.k_proj", False),
    "attn_v": ("self_attn.v_proj", False),
    "attn_output": ("self_attn.o_proj", False),
    "attn_q.bias": ("self_attn.q_proj.bias", False),
    "attn_k.bias": ("self_attn.k_proj.bias", False),
    "attn_v.bias": ("self_attn.v_proj.bias", False),
    "attn_q_norm": ("self_attn.q_norm", True),
    "attn_k_norm": ("self_attn.k_norm", True),
    "ffn_gate": ("mlp.gate_proj", False),
    "ffn_up": ("mlp.up_proj", False),
    "ffn_down": ("mlp.down_proj", False),
    "ffn_gate_inp": ("mlp.router", False),
    "attn_norm": ("input_layernorm", True),
    "post_attention_norm": ("post_attention_layernorm", True),
    "ffn_norm": ("pre_feedforward_layernorm", True),
    "post_ffw_norm": ("post_feedforward_layernorm", True),
}

# A family's own names, over the shared ones
_FAMILY_LAYER_NAMES = {"gpt_oss": GPT_OSS_LAYER_NAMES}


class GGUFFile:
    """A GGUF file (wicore.export.gguf_file, memory-mapped): its header fields and its tensors by name."""

    def __init__(self, path: Path, kind: str = "GGUF") -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelSourceError(f"{kind} file not found: {self.path}")
        self._contents = read_gguf(self.path)
        self._tensors = self._contents.tensors

    def _field(self, key: str, default: Any = None) -> Any:
        return self._contents.metadata.get(key, default)

    def _need(self, key: str) -> Any:
        """A header field the file must have."""
        value = self._field(key)
        if value is None:
            raise ModelSourceError(f"{self.path.name}: GGUF header lacks {key}")
        return value

    def _need_tensor(self, name: str) -> GGUFTensor:
        """A tensor the file must have."""
        t = self._tensors.get(name)
        if t is None:
            raise ModelSourceError(f"{self.path.name}: tensor {name} is missing")
        return t


class GGUFSource(GGUFFile):
    """A GGUF file of a family in wicore.model.families (llama.cpp's `gemma3`, `llama`, `qwen2`, `qwen3`,
    `qwen3moe`; Mixtral as `llama` with experts)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        arch = self._field("general.architecture")
        try:
            self.family = family_of_gguf(arch, int(self._field(f"{arch}.expert_count", 0) or 0))
        except UnsupportedModelError as exc:
            raise UnsupportedModelError(f"{self.path.name}: {exc}") from exc
        readers = {"gemma3": self._read_config, "gpt_oss": self._read_gpt_oss_config}
        self.config = readers.get(self.family.name, self._read_family_config)()
        own = _FAMILY_LAYER_NAMES.get(self.family.name, {})  # a family's names win over shared ones of the same tensor
        taken = {hf for hf, _ in own.values()}
        self._layer_names = {**{k: v for k, v in _LAYER_NAMES.items() if v[0] not in taken}, **own}

    def _read_gpt_oss_config(self) -> DecoderConfig:
        vocab_size = int(self._need_tensor("token_embd.weight").shape[-1])
        return gpt_oss_config(self.family, self._field, self._need, vocab_size, "output.weight" not in self._tensors)

    def _read_family_config(self) -> DecoderConfig:
        """Llama and Qwen: every layer full attention, one RoPE, the head tied unless output.weight exists."""
        arch = self.family.gguf_architecture
        need = lambda key: self._need(f"{arch}.{key}")
        if "rope_freqs.weight" in self._tensors or self._field(f"{arch}.rope.scaling.type") not in (None, "none"):
            raise UnsupportedModelError(
                f"{self.path.name}: RoPE scaling (rope_freqs / rope.scaling) from a GGUF is not supported; "
                "export the model's Hugging Face folder instead"
            )
        hidden, num_heads = int(need("embedding_length")), int(need("attention.head_count"))
        head_dim = int(self._field(f"{arch}.attention.key_length", hidden // num_heads))
        num_layers = int(need("block_count"))
        eos = int(self._field("tokenizer.ggml.eos_token_id", 2))
        return DecoderConfig(
            vocab_size=int(self._need_tensor("token_embd.weight").shape[-1]),
            hidden_size=hidden,
            intermediate_size=int(need("feed_forward_length")),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(self._field(f"{arch}.attention.head_count_kv", num_heads)),
            head_dim=head_dim,
            layer_types=(FULL,) * num_layers,
            sliding_window=int(need("context_length")),
            rope_global=RopeConfig(float(self._field(f"{arch}.rope.freq_base", 10_000.0))),
            rope_local=RopeConfig(float(self._field(f"{arch}.rope.freq_base", 10_000.0))),
            query_pre_attn_scalar=float(head_dim),
            rms_norm_eps=float(self._field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
            max_position_embeddings=int(need("context_length")),
            bos_token_id=int(self._field("tokenizer.ggml.bos_token_id", 1)),
            eos_token_id=eos,
            pad_token_id=int(self._field("tokenizer.ggml.padding_token_id", eos)),
            family=self.family.name,
            tie_word_embeddings="output.weight" not in self._tensors,
            **self._experts_config(),
        )

    def _experts_config(self) -> dict[str, Any]:
        """The mixture-of-experts fields of the config (none for a dense model)."""
        arch = self.family.gguf_architecture
        num_experts = int(self._field(f"{arch}.expert_count", 0) or 0)
        if not num_experts:
            return {}
        width = self._field(f"{arch}.expert_feed_forward_length") or self._need(f"{arch}.feed_forward_length")
        return {
            "num_experts": num_experts,
            "num_experts_per_tok": int(self._need(f"{arch}.expert_used_count")),
            "moe_intermediate_size": int(width),
            "norm_topk_prob": bool(self._field(f"{arch}.expert_weights_norm", True)),
        }

    def _read_config(self) -> DecoderConfig:
        need = lambda key: self._need(f"gemma3.{key}")
        num_layers = int(need("block_count"))
        hidden, num_heads = int(need("embedding_length")), int(need("attention.head_count"))
        head_dim = int(self._field("gemma3.attention.key_length", hidden // num_heads))
        pattern = self._field("gemma3.attention.sliding_window_pattern")
        if isinstance(pattern, list):  # per-layer booleans in newer converters
            layer_types = tuple(SLIDING if p else FULL for p in pattern)
        else:
            layer_types = tuple(default_layer_types(num_layers, int(pattern or 6)))
        scaling = self._field("gemma3.rope.scaling.type")
        factor = float(self._field("gemma3.rope.scaling.factor", 1.0)) if scaling == "linear" else 1.0
        if scaling not in (None, "none", "linear"):
            raise UnsupportedModelError(f"{self.path.name}: rope scaling {scaling!r} is not supported")
        # llama.cpp's rule: the 27B (62 layers) scales queries by (hidden / heads)^-0.5, the rest by head_dim.
        scalar = hidden / num_heads if num_layers == 62 else head_dim
        return DecoderConfig(
            vocab_size=int(self._need_tensor("token_embd.weight").shape[-1]),
            hidden_size=hidden,
            intermediate_size=int(need("feed_forward_length")),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=int(self._field("gemma3.attention.head_count_kv", num_heads)),
            head_dim=head_dim,
            layer_types=layer_types,
            sliding_window=int(need("attention.sliding_window")),
            rope_global=RopeConfig(float(self._field("gemma3.rope.freq_base", 1_000_000.0)), factor),
            rope_local=RopeConfig(10_000.0),
            query_pre_attn_scalar=float(scalar),
            rms_norm_eps=float(self._field("gemma3.attention.layer_norm_rms_epsilon", 1e-6)),
            max_position_embeddings=int(need("context_length")),
            bos_token_id=int(self._field("tokenizer.ggml.bos_token_id", 2)),
            eos_token_id=int(self._field("tokenizer.ggml.eos_token_id", 1)),
            pad_token_id=int(self._field("tokenizer.ggml.padding_token_id", 0)),
        )

    def _tensor(self, name: str, is_norm: bool = False, heads: int = 0) -> np.ndarray:
        """A tensor in HF's convention; `heads` > 0: a permuted Q or K of that many heads, put back in order."""
        t = self._need_tensor(name)
        data = read_tensor(t)
        shape = data.shape
        if is_norm:
            return data - self.family.norm_offset if self.family.norm_offset else data
        rows = unpermute_rows(shape[0], heads) if heads else None
        if rows is not None:
            data = np.ascontiguousarray(data[rows])
        if len(shape) == 2 and can_transcode(t.tensor_type):  # the ort-quant flavour reuses the blocks

            def blocks() -> BlockQuant:
                b = transcode_gguf(t.data, t.tensor_type, shape)
                if rows is None:
                    return b
                offsets = None if b.offsets is None else b.offsets[rows]
                return BlockQuant(b.codes[rows], b.scales[rows], offsets, b.bits, b.block_size)

            return QuantizedTensor(data, blocks)
        return data

    def _expert_weights(self, index: int, suffix: str) -> list[np.ndarray]:
        """Layer `index`'s experts of one projection: split out of the stack (`ffn_gate_exps`), or,
        in Mixtral GGUFs converted before llama.cpp stacked them (2024), one tensor an expert
        (`blk.N.ffn_gate.E.weight`)."""
        stacked = f"blk.{index}.{suffix}.weight"
        legacy = f"blk.{index}.{suffix.removesuffix('_exps')}.{{}}.weight"
        if stacked in self._tensors or legacy.format(0) not in self._tensors:
            return self._experts(stacked)
        return [self._tensor(legacy.format(e)) for e in range(self.config.num_experts)]

    def _experts(self, name: str, ndim: int = 3) -> list[np.ndarray]:
        """A stacked experts tensor [E, rows, cols] as one [rows, cols] weight an expert, each
        carrying its own blocks where the type transcodes (module doc); `ndim` 2: biases [E, rows]."""
        t = self._need_tensor(name)
        data = read_tensor(t)
        num_experts = self.config.num_experts
        if data.ndim != ndim or data.shape[0] != num_experts:
            dims = ", rows, cols" if ndim == 3 else ", rows"
            raise ModelSourceError(f"{self.path.name}: {name} has shape {data.shape}, not [{num_experts}{dims}]")
        if ndim != 3 or not can_transcode(t.tensor_type):
            return list(data)
        shape = (data.shape[1], data.shape[2])
        return [QuantizedTensor(data[e], partial(transcode_gguf, t.data[e], t.tensor_type, shape)) for e in range(num_experts)]

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "gguf",
            "path": str(self.path),
            "name": self._field("general.name"),
            "file_type": self._field("general.file_type"),
        }

    def embedding(self) -> np.ndarray:
        return self._tensor("token_embd.weight")

    def final_norm(self) -> np.ndarray:
        return self._tensor("output_norm.weight", is_norm=True)

    def lm_head(self) -> np.ndarray | None:
        return None if self.config.tie_word_embeddings else self._tensor("output.weight")

    def layer(self, index: int) -> LayerWeights:
        """The tensors the family has (wicore.model.weights.expected_shapes), under HF's names."""
        from wicore.model.weights import expected_shapes

        cfg = self.config
        wanted = expected_shapes(cfg)
        permuted = {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads} if self.family.gguf_permuted_qk else {}
        tensors = {}
        for suffix, (hf, is_norm) in self._layer_names.items():
            if hf in wanted:
                name = f"blk.{index}.{suffix}" if suffix.endswith(".bias") else f"blk.{index}.{suffix}.weight"
                tensors[hf] = self._tensor(name, is_norm, permuted.get(suffix, 0))
        if self.family.is_moe:
            for suffix, projection in _EXPERT_NAMES.items():
                for e, weight in enumerate(self._expert_weights(index, suffix)):
                    tensors[f"mlp.experts.{e}.{projection}"] = weight
                if self.family.moe_bias:  # [E, width]: one bias an expert
                    for e, bias in enumerate(self._experts(f"blk.{index}.{suffix}.bias", ndim=2)):
                        tensors[f"mlp.experts.{e}.{projection}.bias"] = bias
        return LayerWeights(index, tensors)

    def vision(self) -> None:
        """A GGUF holds the text model only: llama.cpp keeps the vision tower in a file of its own,
        read by wicore.export.gguf_mmproj."""
        return None

    def token_ids(self, tokens: tuple[str, ...]) -> dict[str, int]:
        """The vocabulary ids of those of `tokens` that are in it."""
        wanted = set(tokens)
        return {token: i for i, token in enumerate(self._field("tokenizer.ggml.tokens", [])) if token in wanted}

    def write_tokenizer(self, out_dir: Path) -> dict[str, Any] | None:
        from wicore.export.tokenizer import export_tokenizer_from_gguf

        return export_tokenizer_from_gguf(self.path, out_dir, self._contents.metadata).to_dict()


def unpermute_rows(num_rows: int, heads: int) -> np.ndarray:
    """Row order that undoes llama.cpp's Q/K permutation: within each head, its rows were
    (pairs, 2) -> interleaved; HF's order is (2, pairs), i.e. transformers' reverse_permute_weights."""
    dim = num_rows // heads // 2
    return np.arange(num_rows).reshape(heads, dim, 2).swapaxes(2, 1).reshape(num_rows)


def read_tensor(t: GGUFTensor) -> np.ndarray:
    """A GGUF tensor as float32, in Hugging Face's shape (ggml lists dimensions the other way)."""
    try:
        data = dequantize(t.data, t.tensor_type)
    except NotImplementedError as exc:
        raise UnsupportedModelError(f"{t.name}: GGUF type {t.tensor_type.name} cannot be dequantized") from exc
    shape = tuple(int(d) for d in reversed(t.shape))
    return np.ascontiguousarray(data.reshape(shape), dtype=np.float32)
