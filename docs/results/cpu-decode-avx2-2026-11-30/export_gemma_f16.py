"""Ad-hoc (issue 37, 2026-11-30): Gemma 3 270M's `wicore serve` CPU export with WiCore's kernels and its LM head
(262,144 x 640 Q8_0 codes) given the small heads' float16 scales (graph/quant.py WIDE_HEAD_CODES raised past it:
10.5 MB of scales a step instead of 21), into OUT. usage: export_gemma_f16.py OUT"""
import sys
from pathlib import Path
import wicore.graph.quant as Q
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source, packaged_gguf
Q.WIDE_HEAD_CODES = 1 << 40
config = ExportConfig(dtype="fp32", op_flavour="ort-quant", attention="portable", kernels="wicore", overwrite=True)
export_model(open_source(str(packaged_gguf("gemma3-270m"))), Path(sys.argv[1]), config, progress=lambda _: None)
