"""Compile a weight source into a model folder: partitions, tokenizer, manifest. Atomically.

The folder is written under a temporary name beside the target and renamed at
the end; on any error the temporary folder is removed, so a failed export
never leaves a half-written model where a runtime could load it.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnx

from wicore.errors import WiCoreError
from wicore.graph.decoder import ATTENTIONS, DTYPES, OPSET, DecoderBuilder
from wicore.graph.manifest import Manifest, PartitionRecord, VisionRecord, sha256_file
from wicore.graph.ops import DataFile
from wicore.graph.paged_block import FUSED as BLOCK_FUSED
from wicore.graph.paged_block import MODES as BLOCK_ATTENTION
from wicore.graph.partition import plan_partitions
from wicore.graph.quant import QuantLinear
from wicore.graph.vision import FILE_NAME as VISION_FILE
from wicore.graph.vision import FLAVOURS as VISION_FLAVOURS
from wicore.graph.vision import VisionBuilder
from wicore.model.quant import SUPPORTED_BITS
from wicore.model.vision import VisionWeights
from wicore.model.weights import WeightSource

Progress = Callable[[str], None]


@dataclass(frozen=True)
class OpFlavour:
    """What an op flavour writes beyond standard ONNX ops."""

    quantized: bool  # linear layers as MatMulNBits (com.microsoft, wicore/graph/quant.py)
    fused_ops: bool  # float MatMuls, fused norms, RoPE and GELU, int32 index arithmetic (wicore/graph/fused_ops.py)


OP_FLAVOURS: dict[str, OpFlavour] = {
    "portable": OpFlavour(quantized=False, fused_ops=False),
    "ort-quant": OpFlavour(quantized=True, fused_ops=False),
    "webgpu": OpFlavour(quantized=False, fused_ops=True),  # ONNX Runtime's WebGPU EP kernels (CPU and CUDA run it too)
    "webgpu-quant": OpFlavour(quantized=True, fused_ops=True),  # the same with MatMulNBits linear layers (--weight-bits)
}


@dataclass(frozen=True)
class ExportConfig:
    dtype: str = "fp32"
    num_partitions: int = 1
    op_flavour: str = "portable"
    attention_stats: bool = False  # graphs also output the attention mass of each KV block
    overwrite: bool = False
    weight_bits: int = 8  # ort-quant: bits for weights without a lossless GGUF encoding (float sources)
    expert_bits: int | None = None  # ort-quant: a mixture's expert weights in these bits instead (None: weight_bits)
    # ort-quant: MatMulNBits activations, 4 = int8 (fast on CPU), 0 = float; None: per tensor (wicore/graph/quant.py)
    accuracy_level: int | None = None
    quantize_embedding: bool = False  # ort-quant: a float embedding table's rows in weight_bits as well
    attention: str = "portable"  # "paged": com.microsoft.PagedAttention over the fp16 KV (CUDA EP)
    vision_flavour: str = "auto"  # the vision partition's ops (resolved_vision_flavour)
    sampling_head: str = "auto"  # "on" / "off" / "auto": on with the paged attention (graph/sampling.py)
    kv_cache_dtype: str = "auto"  # "auto": the graphs' dtype; "int8": KV blocks in 8 bits (graph/kv_quant.py)
    # "wicore": WiCore's kernels (wicore/kernels): paged graphs' residual norms and gated MLP; ort-quant fp32
    # graphs' linear layers on wicore.MatMulQ (the CPU's int8-activation matmul, wicore/graph/matmul_q.py)
    kernels: str = "ort"
    # ort-quant fp16 graphs with kernels "wicore": the 4/8-bit linear layers on wicore.MatMulQ16 (CUDA's weight-only
    # matmul, wicore/graph/quant.py matmul_q16) instead of MatMulNBits: faster at 1 to 16 rows, slower above
    # (docs/PERFORMANCE.md, 2026-11-29), so for single-stream serving only
    matmul_q16: bool = False
    # ort-quant fp16 graphs in 8 bits with kernels "wicore": the linear layers and the head on wicore.MatMulI8 (int8
    # weights a scale per output channel; int8 tensor cores through cuBLASLt above 16 rows: wicore/graph/matmul_i8.py)
    matmul_i8: bool = False
    # paged graphs: the layer kinds on WiCore's BlockAttention (graph/paged_block.py), "off", "sliding",
    # "all" (every layer; float32 graphs for the CPU) or "auto" (resolved_block_attention)
    block_attention: str = "auto"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise WiCoreError(f"--dtype {self.dtype!r}: choose one of {', '.join(sorted(DTYPES))}")
        if self.op_flavour not in OP_FLAVOURS:
            raise WiCoreError(f"--op-flavour {self.op_flavour!r}: choose one of {', '.join(OP_FLAVOURS)}")
        if self.weight_bits not in SUPPORTED_BITS:
            raise WiCoreError(f"--weight-bits {self.weight_bits}: choose one of {', '.join(map(str, SUPPORTED_BITS))}")
        if self.expert_bits is not None:
            if self.expert_bits not in SUPPORTED_BITS:
                raise WiCoreError(f"--expert-bits {self.expert_bits}: choose one of {', '.join(map(str, SUPPORTED_BITS))}")
            if not OP_FLAVOURS[self.op_flavour].quantized:
                raise WiCoreError("--expert-bits needs quantized weights: add --weight-bits 4 or 8")
        if self.attention not in ATTENTIONS:
            raise WiCoreError(f"--attention {self.attention!r}: choose one of {', '.join(ATTENTIONS)}")
        if self.block_attention not in ("auto", *BLOCK_ATTENTION):
            raise WiCoreError(f"--block-attention {self.block_attention!r}: choose auto, {', '.join(BLOCK_ATTENTION)}")
        if self.block_attention not in ("auto", "off") and self.attention != "paged":
            raise WiCoreError("--block-attention needs --attention paged (the portable attention has its own kernels)")
        if (
            self.attention == "paged"
            and self.dtype != "fp16"
            and (self.resolved_block_attention() != "all" or self.kernels != "ort")
        ):
            raise WiCoreError(
                "--attention paged needs --dtype fp16 (ONNX Runtime's PagedAttention reads a float16 KV cache); "
                "fp32 only with --block-attention all --kernels ort (every layer on WiCore's CPU kernel)"
            )
        if self.attention == "paged" and self.attention_stats:
            raise WiCoreError("--attention paged gives no attention statistics; drop --attention-stats")
        if self.vision_flavour not in ("auto", *VISION_FLAVOURS):
            raise WiCoreError(f"--vision-flavour {self.vision_flavour!r}: choose auto, {', '.join(VISION_FLAVOURS)}")
        if self.sampling_head not in ("auto", "on", "off"):
            raise WiCoreError(f"--sampling-head {self.sampling_head!r}: choose auto, on or off")
        if self.kv_cache_dtype not in ("auto", "int8"):
            raise WiCoreError(f"--kv-cache-dtype {self.kv_cache_dtype!r}: choose auto or int8")
        if self.kv_cache_dtype == "int8" and self.attention == "paged":
            raise WiCoreError(
                "--kv-cache-dtype int8 needs the portable attention: ONNX Runtime's PagedAttention takes int8 caches "
                "only with scales fixed at export"
            )
        if (
            OP_FLAVOURS[self.op_flavour].fused_ops
            and self.attention == "paged"
            and (self.kernels != "ort" or self.resolved_block_attention() != "off")
        ):
            raise WiCoreError(
                f"--op-flavour {self.op_flavour} --attention paged runs every layer on the WebGPU EP's PagedAttention: "
                "drop --kernels wicore and --block-attention"
            )
        if OP_FLAVOURS[self.op_flavour].fused_ops and self.kernels != "ort":
            raise WiCoreError(f"--op-flavour {self.op_flavour} writes ONNX Runtime's WebGPU kernels: drop --kernels wicore")
        if self.kernels not in ("ort", "wicore"):
            raise WiCoreError(f"--kernels {self.kernels!r}: choose ort or wicore")
        if self.kernels == "wicore" and self.attention != "paged" and not OP_FLAVOURS[self.op_flavour].quantized:
            raise WiCoreError(
                "--kernels wicore needs --attention paged (its fused norms take float16 activations) or "
                "--op-flavour ort-quant (its CPU matmul)"
            )
        if self.num_partitions < 1:
            raise WiCoreError(f"--partitions must be at least 1, got {self.num_partitions}")
        if self.matmul_q16 and not (self.kernels == "wicore" and self.dtype == "fp16" and OP_FLAVOURS[self.op_flavour].quantized):
            raise WiCoreError("--matmul-q16 needs --kernels wicore, --dtype fp16 and quantized weights (--weight-bits 4 or 8)")
        if self.matmul_i8 and not (
            self.kernels == "wicore" and self.dtype == "fp16" and OP_FLAVOURS[self.op_flavour].quantized and self.weight_bits == 8
        ):
            raise WiCoreError("--matmul-i8 needs --kernels wicore, --dtype fp16 and --weight-bits 8")
        if self.matmul_i8 and self.matmul_q16:
            raise WiCoreError("--matmul-i8 and --matmul-q16 each place the linear layers: choose one")
        if self.quantize_embedding and not OP_FLAVOURS[self.op_flavour].quantized:
            raise WiCoreError("--quantize-embedding needs quantized weights: add --weight-bits 4 or 8")

    def quant(self, int8_prompts: bool = False) -> QuantLinear | None:
        """How linear layers are encoded: None for float MatMuls (portable); `int8_prompts` (the family's row):
        MatMulQ's prompts on int8 x in the layers (graph/quant.py)."""
        if not OP_FLAVOURS[self.op_flavour].quantized:
            return None
        return QuantLinear(
            self.weight_bits,
            expert_bits=self.expert_bits,
            accuracy_level=self.accuracy_level,
            quantize_embedding=self.quantize_embedding,
            kernels=self.kernels,
            matmul_q16=self.matmul_q16,
            matmul_i8=self.matmul_i8,
            layer_prompt="int8" if int8_prompts else "float",
        )

    def resolved_block_attention(self) -> str:
        """The layer kinds on BlockAttention (graph/paged_block.py). `auto`: on the paged graphs with WiCore's
        kernels (float16, the CUDA EP) paged_block.FUSED, the layer kinds paged_block.AUTO_KINDS where the
        op's own prologue serves them (the sliding layers: faster end to end than ORT's PagedAttention, prompts
        and decode; docs/PERFORMANCE.md); off elsewhere (`--kernels ort` loads no library of WiCore's)."""
        if self.block_attention != "auto":
            return self.block_attention
        on_cuda_kernels = self.attention == "paged" and self.kernels == "wicore" and self.dtype == "fp16"
        return BLOCK_FUSED if on_cuda_kernels else "off"

    def resolved_vision_flavour(self) -> str:
        """The vision partition's flavour (wicore.graph.vision): `auto` is `fused` (com.microsoft
        MultiHeadAttention and FastGelu) where the text graphs already need ONNX Runtime's contrib
        ops (ort-quant: CPU and CUDA EPs), `portable` (standard ops, every EP) otherwise."""
        if self.vision_flavour != "auto":
            return self.vision_flavour
        return "fused" if OP_FLAVOURS[self.op_flavour].quantized else "portable"

    def has_sampling_head(self) -> bool:
        """Whether the export draws sampled rows on the device (Manifest.sampling_head): `auto` where its logits live on an
        accelerator (the paged attention's CUDA graphs); on the CPU the host sampler costs the same."""
        return self.sampling_head == "on" or (self.sampling_head == "auto" and self.attention == "paged")


def stderr_progress(message: str) -> None:
    print(f"[wicore-export] {message}", file=sys.stderr, flush=True)


def export_model(source: WeightSource, out_dir: Path, config: ExportConfig, progress: Progress = stderr_progress) -> Manifest:
    """Write the compiled model to out_dir (replacing it only if config.overwrite)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not config.overwrite:
        raise WiCoreError(f"{out_dir} already exists; pass --force to replace it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        manifest = _write_model(source, tmp, config, progress)
        _replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    progress(f"done: {out_dir}")
    return manifest


def _write_model(source: WeightSource, folder: Path, config: ExportConfig, progress: Progress) -> Manifest:
    cfg = source.config
    if config.expert_bits is not None and not cfg.num_experts:
        raise WiCoreError(f"--expert-bits: this {cfg.family} model has no experts (an option for mixtures of experts); drop it")
    specs = plan_partitions(cfg.num_layers, config.num_partitions)
    vision = source.vision()
    if vision is not None and config.attention == "paged":
        progress("the vision tower is left out: the paged attention is causal only; export with --attention portable for images")
        vision = None
    builder = DecoderBuilder(
        cfg,
        config.dtype,
        attention_stats=config.attention_stats,
        quant=config.quant(cfg.family_row.int8_prompts),
        fused_ops=OP_FLAVOURS[config.op_flavour].fused_ops,
        attention=config.attention,
        image_inputs=vision is not None,
        kernels=config.kernels if config.attention == "paged" else "ort",  # else only the matmuls (quant) are WiCore's
        kv_cache_dtype=config.kv_cache_dtype,
        block_attention=config.resolved_block_attention(),
    )
    started = time.monotonic()
    progress(
        f"{cfg.num_layers} layers, {cfg.hidden_size} hidden, {config.dtype}, {config.op_flavour}, "
        f"{config.attention} attention, {len(specs)} partition(s)"
    )
    shared = DataFile(folder / "embed_tokens.data") if len(specs) > 1 else None
    records = []
    try:
        for spec in specs:
            data = DataFile(folder / f"{spec.file_name}.data")

            def layers(spec=spec):
                for i in range(spec.start, spec.stop):
                    progress(f"{spec.file_name}: layer {i + 1}/{cfg.num_layers} ({time.monotonic() - started:.0f}s)")
                    yield source.layer(i)

            model = builder.build(
                spec,
                layers(),
                data,
                embedding=source.embedding,
                final_norm=source.final_norm() if spec.has_lm_head else None,
                embedding_data=shared,
                lm_head=None if cfg.tie_word_embeddings else source.lm_head,
            )
            data.close()
            onnx.save_model(model, folder / spec.file_name)
            records.append(
                PartitionRecord(
                    spec.file_name,
                    spec.start,
                    spec.stop,
                    tuple(v.name for v in model.graph.input),
                    tuple(v.name for v in model.graph.output),
                )
            )
    finally:
        if shared is not None:
            shared.close()
    vision_record = None if vision is None else _write_vision(vision, folder, config, progress)
    progress("tokenizer")
    tokenizer = source.write_tokenizer(folder)
    progress("checksums")
    files = {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file()}
    manifest = Manifest(
        source=source.describe(),
        config=cfg,
        dtype=config.dtype,
        op_flavour=config.op_flavour,
        opset=OPSET,
        partitions=tuple(records),
        tokenizer=tokenizer,
        files=files,
        attention=config.attention,
        vision=vision_record,
        kv_cache_dtype=config.kv_cache_dtype,
        sampling_head=config.has_sampling_head(),
        kernels=config.kernels,
    )
    manifest.write(folder)
    return manifest


def _write_vision(vision: VisionWeights, folder: Path, config: ExportConfig, progress: Progress) -> VisionRecord:
    """The vision partition: vision.onnx + its external weights."""
    cfg, flavour = vision.config, config.resolved_vision_flavour()
    progress(
        f"{VISION_FILE}: {cfg.num_layers} SigLIP layers, {cfg.image_size}x{cfg.image_size}, "
        f"{cfg.mm_tokens_per_image} tokens, {flavour} flavour"
    )
    data = DataFile(folder / f"{VISION_FILE}.data")
    try:
        model = VisionBuilder(vision, config.dtype, flavour).build(data)
    finally:
        data.close()
    onnx.save_model(model, folder / VISION_FILE)
    inputs, outputs = tuple(v.name for v in model.graph.input), tuple(v.name for v in model.graph.output)
    return VisionRecord(VISION_FILE, inputs, outputs, cfg, flavour)


def _replace_dir(new: Path, target: Path) -> None:
    """Move `new` to `target`; an existing target is swapped out first and removed after."""
    old = None
    if target.exists():
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        target.rename(old)
    new.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
