"""Ad-hoc: the tiny GGUFs exported with their head in the GGUF's own widths (graph/quant.py WIDE_HEAD_CODES 0: Q6_K as
6-bit codes), into /work/cache-cpu37/x6/MODEL."""
import sys
from pathlib import Path
import wicore.graph.quant as Q
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
Q.WIDE_HEAD_CODES = 0
for m in sys.argv[1:]:
    export_model(open_source(f"/work/tiny37/tiny-{m}.gguf"), Path(f"/work/cache-cpu37/x6/{m}"), ExportConfig(op_flavour="ort-quant", kernels="wicore", overwrite=True), progress=lambda _: None)
    print(m, flush=True)
