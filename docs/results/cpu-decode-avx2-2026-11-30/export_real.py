"""Ad-hoc (issue 37, 2026-11-30): what `wicore serve` exports on a CPU for SmolLM2-135M-Instruct (the pulled Q4_1 GGUF)
and the packaged Gemma 3 270M (Q4_K_M): fp32, ort-quant, portable attention (wicore/cli/models.py), with ONNX
Runtime's kernels ("ort", its default on a CPU without AVX-512 VNNI) and with WiCore's ("wicore"), into OUT/NAME-KERNELS.
usage: export_real.py OUT"""
import sys
from pathlib import Path
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source, packaged_gguf
out = Path(sys.argv[1])
sources = {"smollm2": "/work/cache-cpu55/gguf/smollm2-135m-instruct.gguf", "gemma3": str(packaged_gguf("gemma3-270m"))}
print(sources, flush=True)
for name, gguf in sources.items():
    for kernels in ("ort", "wicore"):
        config = ExportConfig(dtype="fp32", op_flavour="ort-quant", attention="portable", kernels=kernels, overwrite=True)
        export_model(open_source(gguf), out / f"{name}-{kernels}", config, progress=lambda _: None)
        print(name, kernels, flush=True)
