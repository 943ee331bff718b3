"""Ad-hoc (issue 37, 2026-11-30): the tiny GGUFs' `ort-quant --kernels wicore` exports into OUT/MODEL, with the
exporter on PYTHONPATH (main's: the head's 8-bit codes; this branch's: its 6-bit codes marked wide_codes).
usage: export_tiny.py OUT MODEL..."""
import sys
from pathlib import Path
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
for m in sys.argv[2:]:
    export_model(open_source(f"/work/tiny37/tiny-{m}.gguf"), Path(sys.argv[1]) / m, ExportConfig(op_flavour="ort-quant", kernels="wicore", overwrite=True), progress=lambda _: None)
    print(m, flush=True)
