import sys
from pathlib import Path
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
for m in sys.argv[1:]:
    export_model(open_source(f"/work/tiny37/tiny-{m}.gguf"), Path(f"/work/cache-cpu37/x/{m}"), ExportConfig(op_flavour="ort-quant", kernels="wicore", overwrite=True), progress=lambda _: None)
    print(m, flush=True)
