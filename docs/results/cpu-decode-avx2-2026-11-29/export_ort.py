"""Ad-hoc: the tiny GGUFs' ort-quant export on ONNX Runtime's kernels (what `wicore serve` exports on a CPU without
AVX-512 VNNI: cli/models.py cpu_kernels), into /work/cache-cpu37/xo/MODEL."""
import sys
from pathlib import Path
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
for m in sys.argv[1:]:
    export_model(open_source(f"/work/tiny37/tiny-{m}.gguf"), Path(f"/work/cache-cpu37/xo/{m}"), ExportConfig(op_flavour="ort-quant", kernels="ort", overwrite=True), progress=lambda _: None)
    print(m, flush=True)
