import sys
sys.path.insert(0, "/work/wt-serve256/tests")
from pathlib import Path
import tiny_chat
from conftest import TINY
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
cfg = {**TINY, "num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 1024, "sliding_window": 64}
hf = tiny_chat.build(Path("/tmp/s256/hf"), cfg)
export_model(open_source(str(hf)), Path("/tmp/s256/model"), ExportConfig(), progress=lambda _: None)
print("ok")
