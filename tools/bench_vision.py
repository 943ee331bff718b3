"""Gemma 3's vision tower at its real shapes: ms per image of WiCore's vision partition on an ONNX
Runtime device against HF transformers' vision tower + projector, same weights, same run.

Gemma 3 4B, 12B and 27B share one SigLIP encoder (27 layers, width 1152, 896 x 896 images in
14 x 14 patches: 4,096 patches, pooled to 256 tokens); only the projector's output width differs
(2560 for 4B, 5376 for 27B). The tool builds a random-weight Gemma3ForConditionalGeneration with
that tower and a one-layer text model of the target width, saves it as safetensors, exports it
with wicore-export's code (vision.onnx, --dtype, once per --vision-flavour), and times:

    wicore_F   vision.onnx of flavour F (portable: standard ops; fused: com.microsoft MultiHeadAttention
               and FastGelu) in an ONNX Runtime session on --device (the engine's VisionEncoder
               session), pixel values already on the device, features left there (IOBinding)
    hf         model.model.get_image_features(pixel_values) on the same device, --hf-dtype, --hf-attn

at each --batch, after --warmup runs: the median of --iters runs, divided by the batch. The largest
difference of each WiCore output from HF's at the first batch is recorded, with the largest HF value.

    PYTHONPATH=. python tools/bench_vision.py --shape 4b,27b --batch 1,8 --device cuda:0 --dtype fp16 \\
        --hf-dtype bf16 --vision-flavour portable,fused --json docs/results/gpu-vision.json
    PYTHONPATH=. python tools/bench_vision.py --shape tiny --device cpu --dtype fp32 --hf-dtype fp32   # a check, anywhere
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from benchlib import int_list, write_record

SIGLIP = dict(
    hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16, image_size=896, patch_size=14
)
SHAPES: dict[str, tuple[dict[str, int], int, int]] = {  # name: (vision tower, mm tokens, text width)
    "4b": (SIGLIP, 256, 2560),
    "27b": (SIGLIP, 256, 5376),
    "tiny": (dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=56, patch_size=7), 16, 64),
}  # fmt: skip


@dataclass(frozen=True)
class Config:
    shapes: tuple[str, ...]
    batches: tuple[int, ...]
    device: str
    dtype: str
    hf_dtype: str
    hf_attn: str
    flavours: tuple[str, ...]
    warmup: int
    iters: int
    threads: int | None
    work: str | None
    json: str | None


def parse_args(argv: Sequence[str] | None) -> Config:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="4b,27b", help=f"comma-separated: {', '.join(SHAPES)}")
    ap.add_argument("--batch", type=int_list, default=(1, 8), help="images a run, comma-separated")
    ap.add_argument("--device", default="cuda:0", help="ONNX Runtime device of the vision partition (cuda:0, cpu, ...)")
    ap.add_argument("--dtype", choices=("fp16", "fp32"), default="fp16", help="WiCore export dtype")
    ap.add_argument("--hf-dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    ap.add_argument("--hf-attn", choices=("sdpa", "eager"), default="sdpa")
    ap.add_argument(
        "--vision-flavour", default="portable,fused", help="WiCore's vision flavours to time, comma-separated: portable, fused"
    )
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads of both (default: all cores)")
    ap.add_argument("--work", default=None, help="folder for the checkpoints and exports (default: a temporary one)")
    ap.add_argument("--json", default=None, help="write the record here")
    args = ap.parse_args(argv)
    shapes = tuple(s for s in args.shape.split(",") if s)
    if not shapes or set(shapes) - set(SHAPES):
        raise SystemExit(f"--shape {args.shape!r}: choose from {', '.join(SHAPES)}")
    flavours = tuple(f for f in args.vision_flavour.split(",") if f)
    if not flavours or set(flavours) - {"portable", "fused"}:
        raise SystemExit(f"--vision-flavour {args.vision_flavour!r}: choose from portable, fused")
    return Config(
        shapes,
        args.batch,
        args.device,
        args.dtype,
        args.hf_dtype,
        args.hf_attn,
        flavours,
        args.warmup,
        args.iters,
        args.threads,
        args.work,
        args.json,
    )


def checkpoint(shape: str, folder: Path):
    """A random-weight Gemma3ForConditionalGeneration of `shape` (text: one small layer of the target
    width) saved into `folder`; returns the HF model (float32, CPU)."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    vision, mm_tokens, width = SHAPES[shape]
    text = dict(
        vocab_size=64, hidden_size=width, intermediate_size=64, num_hidden_layers=1, num_attention_heads=1,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=4096,
    )  # fmt: skip
    config = Gemma3Config(
        text_config=text,
        vision_config={**vision, "vision_use_head": False},
        mm_tokens_per_image=mm_tokens,
        boi_token_index=61,
        eoi_token_index=62,
        image_token_index=63,
    )
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # HF starts the projection at zero: draw it, so the outputs can be compared
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, width**-0.5)
    model.save_pretrained(folder)
    return model


def export(folder: Path, out: Path, dtype: str, flavour: str) -> Path:
    from wicore.export.exporter import ExportConfig, export_model
    from wicore.export.hf import HFSource

    config = ExportConfig(dtype=dtype, vision_flavour=flavour, overwrite=True)
    export_model(HFSource(folder), out, config, progress=lambda _: None)
    return out


def median_ms(run: Callable[[], None], warmup: int, iters: int) -> float:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def wicore_runner(model_dir: Path, config: Config) -> tuple[Callable[[np.ndarray], Callable[[], None]], Callable[[], np.ndarray]]:
    """run(pixels) -> a closure running vision.onnx on the device with the pixels bound there; and
    the last output as NumPy."""
    from wicore.devices.providers import onnxruntime, parse_device
    from wicore.executor.vision import VisionEncoder
    from wicore.graph import io
    from wicore.graph.manifest import Manifest

    ort = onnxruntime()
    manifest = Manifest.read(model_dir)
    device = parse_device(config.device)
    session = VisionEncoder(model_dir, manifest.vision, device, config.threads).session
    kind, index = device.ort_device
    last: list = []

    def bind(pixels: np.ndarray) -> Callable[[], None]:
        binding = session.io_binding()
        binding.bind_ortvalue_input(io.PIXEL_VALUES, ort.OrtValue.ortvalue_from_numpy(pixels, kind, index))
        binding.bind_output(io.IMAGE_FEATURES, kind, index)

        def run() -> None:
            session.run_with_iobinding(binding)
            last[:] = binding.get_outputs()

        return run

    return bind, lambda: last[0].numpy()


def hf_runner(model, config: Config) -> tuple[Callable[[np.ndarray], Callable[[], None]], Callable[[], np.ndarray]]:
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[config.hf_dtype]
    on = "cpu" if config.device == "cpu" else f"cuda:{config.device.partition(':')[2] or 0}"
    model.set_attn_implementation(config.hf_attn)
    model = model.to(on, dtype)
    last: list = []

    def bind(pixels: np.ndarray) -> Callable[[], None]:
        tensor = torch.from_numpy(pixels).to(on, dtype)

        def run() -> None:
            with torch.no_grad():
                out = model.model.get_image_features(tensor)
            last[:] = [getattr(out, "pooler_output", out)]  # an output object in recent transformers, a tensor before
            if on != "cpu":
                torch.cuda.synchronize()

        return run

    return bind, lambda: last[0].float().cpu().numpy()


def bench_shape(shape: str, work: Path, config: Config) -> dict[str, object]:
    import torch

    if config.threads:
        torch.set_num_threads(config.threads)
    model = checkpoint(shape, work / f"hf-{shape}")
    size = SHAPES[shape][0]["image_size"]
    engines = {"hf": hf_runner(model, config)}  # HF first: ORT's idle threads spin
    for flavour in config.flavours:
        model_dir = export(work / f"hf-{shape}", work / f"wicore-{shape}-{config.dtype}-{flavour}", config.dtype, flavour)
        engines[f"wicore_{flavour}"] = wicore_runner(model_dir, config)
    wicores = [name for name in engines if name != "hf"]
    rows = []
    for i, batch in enumerate(config.batches):
        pixels = np.random.default_rng(batch).uniform(-1, 1, (batch, 3, size, size)).astype(np.float32)
        row: dict[str, object] = {"batch": batch}
        outputs = {}
        for name, (bind, output) in engines.items():
            ms = median_ms(bind(pixels), config.warmup, config.iters)
            row[f"{name}_ms_per_image"] = round(ms / batch, 3)
            outputs[name] = output()
        for name in wicores:
            if i == 0:
                row[f"{name}_max_abs_diff"] = float(np.abs(outputs[name] - outputs["hf"]).max())
            row[f"{name}_speedup"] = round(row["hf_ms_per_image"] / row[f"{name}_ms_per_image"], 2)  # type: ignore[operator]
        if i == 0:
            row["max_abs_hf"] = float(np.abs(outputs["hf"]).max())
        print(f"{shape:>5} batch {batch:>3}: " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "batch"), flush=True)
        rows.append(row)
    return {
        "shape": shape,
        "vision": SHAPES[shape][0],
        "mm_tokens": SHAPES[shape][1],
        "text_width": SHAPES[shape][2],
        "runs": rows,
    }


def gpu_name(device: str) -> str | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return torch.cuda.get_device_name(int(device.partition(":")[2] or 0)) if torch.cuda.is_available() else None


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-vision-") as tmp:
        work = Path(config.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        results = [bench_shape(shape, work, config) for shape in config.shapes]
    if config.json:
        import onnxruntime
        import torch
        import transformers

        versions = {"onnxruntime": onnxruntime.__version__, "torch": torch.__version__, "transformers": transformers.__version__}
        write_record(Path(config.json), config, gpu=gpu_name(config.device), versions=versions, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
