"""Which combinations of a decoder export's options can be built (wicore.graph.decoder), checked
before anything is built: a combination that cannot is refused by name, with what would do."""

from __future__ import annotations

from dataclasses import dataclass

from wicore.errors import UnsupportedModelError
from wicore.graph import paged_block
from wicore.model.families import Family


@dataclass(frozen=True)
class BuildOptions:
    dtype: str
    attention: str
    block_attention: str
    kernels: str
    kv_cache_dtype: str
    expert_kernel: str

    def checked(self, family: Family, quant: bool, attention_stats: bool, image_inputs: bool) -> str:
        """Raise for a combination that cannot be built for `family`; the expert kernel "auto" stands
        for: ONNX Runtime's MoE in the flavours that use contrib ops (`quant`, paged), the graph's in
        the portable one."""
        paged = self.attention == "paged"
        if paged_block.layer_kinds(self.block_attention) and not paged:
            raise ValueError(f"block_attention {self.block_attention!r} needs the paged attention")
        float_ok = self.dtype == "fp16" or (self.block_attention == "all" and self.kernels == "ort")  # no ORT PagedAttention left
        if paged and (not float_ok or attention_stats or image_inputs):
            raise ValueError(
                "the paged attention needs fp16 graphs (fp32: every layer on BlockAttention, ONNX Runtime's other ops), "
                "gives no attention statistics and is causal only (no images)"
            )
        if self.kv_cache_dtype not in ("auto", "int8") or (self.kv_cache_dtype == "int8" and paged):
            raise ValueError(
                f"kv_cache_dtype {self.kv_cache_dtype!r}: auto, or int8 with the portable or batch-invariant attention"
            )
        if self.kernels not in ("ort", "wicore") or (self.kernels == "wicore" and not paged):
            raise ValueError(f"kernels {self.kernels!r}: ort, or wicore with the paged attention (float16 activations)")
        if self.kernels == "wicore" and not family.pre_norms:
            raise UnsupportedModelError(
                f"WiCore's fused kernels add each block's output into the next pre-norm; {family.name} has no "
                "pre-norms: export it with ONNX Runtime's ops (--kernels ort)"
            )
        if self.expert_kernel not in ("auto", "graph", "ort-moe"):
            raise ValueError(f"expert_kernel {self.expert_kernel!r}: auto, graph or ort-moe")
        if family.name != "gemma3" and image_inputs:
            raise UnsupportedModelError(f"the {family.name} family is text only (the vision tower is Gemma 3's)")
        if self.expert_kernel == "auto":
            return "ort-moe" if quant or paged else "graph"
        return self.expert_kernel
