"""Random checkpoints cut to their first layers, exported as one of the shape benchmarks' variants
(bench_shapes.py, bench_long_shapes.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from moe_shapes import MOE_SHAPES
from moe_shapes import hf_config as moe_hf_config

from wicore.export.exporter import ExportConfig, export_model
from wicore.export.random_weights import RandomFloatSource, RandomQuantSource
from wicore.export.sources import open_source
from wicore.model.shapes import hf_config as gemma_hf_config

# variant -> export settings: fp16 graphs; "int4" / "int8" are ort-quant with 4- / 8-bit weights (fp16 activations on GPU)
_PAGED: dict[str, object] = dict(dtype="fp16", attention="paged")
_WICORE: dict[str, object] = dict(kernels="wicore", block_attention="off")  # residual norms, GeGLU on WiCore's kernels


def _quant(bits: int) -> dict[str, object]:
    return dict(_PAGED, op_flavour="ort-quant", weight_bits=bits, accuracy_level=0)


VARIANTS: dict[str, dict[str, object]] = {
    "portable": dict(dtype="fp16", attention="portable"),
    "paged": _PAGED,
    "paged-nohead": dict(_PAGED, sampling_head="off"),  # sampled rows' logits to the host
    # residual norms, GeGLU on WiCore's kernels, the attention on ORT's PagedAttention
    "paged-wicore": dict(_PAGED, **_WICORE),
    # and the sliding layers' attention on WiCore's BlockAttention (graph/paged_block.py); every layer's
    "paged-wicore-block": dict(_PAGED, kernels="wicore", block_attention="sliding"),
    "paged-wicore-all": dict(_PAGED, kernels="wicore", block_attention="all"),
    "int4-paged": _quant(4),
    "int8-paged": _quant(8),
    # quantized weights on MatMulNBits, the norms and GeGLU on WiCore's kernels: against paged-wicore (fp16, same kernels)
    "int4-paged-wicore": dict(_quant(4), **_WICORE),
    "int8-paged-wicore": dict(_quant(8), **_WICORE),
    # the linear layers on WiCore's MatMulQ16 instead (MatMulNBits' codes read in place; --matmul-q16)
    "int4-paged-q16": dict(_quant(4), **_WICORE, matmul_q16=True),
    "int8-paged-q16": dict(_quant(8), **_WICORE, matmul_q16=True),
    # the 8-bit layers and head on WiCore's MatMulI8 (int8 a channel; int8 tensor cores above 16 rows; --matmul-i8)
    "int8-paged-i8": dict(_quant(8), **_WICORE, matmul_i8=True),
    # and every layer's attention on WiCore's BlockAttentionQKV (its prologue fused): the fewest kernels at batch 1
    "int4-paged-q16-all": dict(_quant(4), kernels="wicore", block_attention="all", matmul_q16=True),
    # the embedding's rows from the head's 4-bit codes (wicore-export --quantize-embedding)
    "int4e-paged": dict(_quant(4), quantize_embedding=True),
}


def first_layers(full: Path, folder: Path, layers: int, layer_types: list[str] | None = None) -> Path:
    """`folder`: the checkpoint in `full` cut to its first `layers` layers, of `layer_types` where the
    config lists them (its config; the weight files linked, not copied)."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((full / "config.json").read_text())
    cfg.update(num_hidden_layers=layers)
    if layer_types is not None:
        cfg.update(layer_types=layer_types)
    (folder / "config.json").write_text(json.dumps(cfg))
    for f in full.glob("*.safetensors*"):
        if not (folder / f.name).exists():
            (folder / f.name).symlink_to(f)
    return folder


def export(folder: Path, variant: str, out: Path, partitions: int = 1) -> Path:
    if not (out / "wicore.json").is_file():
        t = time.perf_counter()
        settings = dict(VARIANTS[variant], num_partitions=partitions)
        export_model(open_source(str(folder)), out, ExportConfig(overwrite=True, **settings), progress=lambda _: None)  # type: ignore[arg-type]
        print(f"exported {out.name} in {time.perf_counter() - t:.0f} s", flush=True)
    return out


def random_export(shape: str, layers: int, variant: str, out: Path) -> Path:
    """`variant` of `shape`'s first `layers` layers (its full depth too) from random weights
    (wicore/export/random_weights.py): no checkpoint, so the 27B's 62 layers fit a device's disk.
    Quantized variants get random blocks, the embedding's rows gathered from the head's codes (the
    source's floats are zeros); float variants random uniform weights."""
    settings = VARIANTS[variant]
    if not (out / "wicore.json").is_file():
        t = time.perf_counter()
        if settings.get("op_flavour") == "ort-quant":
            source = RandomQuantSource.of_shape(shape, int(settings["weight_bits"]), layers)  # type: ignore[call-overload]
            settings = dict(settings, quantize_embedding=True)
        else:
            source = RandomFloatSource.of_shape(shape, layers=layers)
        config = ExportConfig(overwrite=True, **settings)  # type: ignore[arg-type]
        export_model(source, out, config, progress=lambda _: None)
        print(f"exported {out.name} in {time.perf_counter() - t:.0f} s", flush=True)
    return out


def make_checkpoints(shape: str, layers: tuple[int, ...], work: Path) -> dict[int, Path]:
    """One random bf16 checkpoint of `shape` (wicore.model.shapes or moe_shapes.py) with max(layers)
    layers, made on the GPU under `work`; a folder per layer count sharing its files."""
    import torch
    import transformers

    full = work / f"{shape}-hf"
    if not (full / "config.json").is_file():
        if shape in MOE_SHAPES:
            cls, kwargs = moe_hf_config(shape, max(layers))
        else:
            cls, kwargs = "Gemma3TextConfig", gemma_hf_config(shape, max(layers))
        torch.manual_seed(0)
        torch.set_default_dtype(torch.bfloat16)
        with torch.device("cuda"):
            model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**kwargs))
        torch.set_default_dtype(torch.float32)
        model.save_pretrained(full)
        del model
        torch.cuda.empty_cache()
    folders = {}
    for n in layers:
        types = json.loads((full / "config.json").read_text()).get("layer_types")
        if types is not None:
            types = types[:n]
            if "full_attention" not in types:  # the engine needs one; the fit needs the same mix at every depth
                types[-1] = "full_attention"
        folders[n] = first_layers(full, work / f"{shape}-hf-{n}", n, types)
    return folders


def split_quant_export(shape: str, layers: int, bits: int, work: Path) -> Path:
    """The shape's first `layers` layers, random `bits`-bit weights (the embedding gathered from the
    head's codes), paged attention, two partitions (one model over two cards: bench_pipeline_gpu.py,
    check_split_graphs_gpu.py); made once under `work`."""
    out = work / f"{shape}-{layers}-int{bits}e-2p"
    if not (out / "wicore.json").is_file():
        start = time.perf_counter()
        source = RandomQuantSource.of_shape(shape, bits, layers)
        settings = ExportConfig(
            dtype="fp16", attention="paged", op_flavour="ort-quant", weight_bits=bits, accuracy_level=0,
            quantize_embedding=True, num_partitions=2, overwrite=True,
        )  # fmt: skip
        export_model(source, out, settings, progress=lambda _: None)
        print(f"exported {out.name} in {time.perf_counter() - start:.0f} s", flush=True)
    return out
