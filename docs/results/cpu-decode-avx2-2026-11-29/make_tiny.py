"""The tiny Llama / Qwen2 GGUFs of issue 37 (tests/export/test_gguf_llama_cpp.py's checkpoints through llama.cpp's
converter and quantizer) into /work/tiny37/tiny-{family}-{quant}.gguf, with the HF folders beside them."""
import sys
from pathlib import Path
sys.path[:0] = ["tests", "tests/export"]
from llama_cpp_peer import convert, quantize, random_checkpoint
from test_gguf_llama_cpp import FAMILIES, SHAPE, _init
from transformers import AutoTokenizer
from wicore.export.pull import pull
out = Path("/work/tiny37")
gguf = pull("smollm2-135m-instruct", cache=Path("/work/cache-cpu37/gguf"))
tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
src = Path("/work/cache-cpu37/llama.cpp-src-0.3.36")
for family in FAMILIES:
    folder = out / f"tiny-{family}-hf"
    random_checkpoint(FAMILIES[family], SHAPE, tok, folder, _init)
    f32 = convert(src, folder, out / f"tiny-{family}-f32.gguf")
    for quant in ("Q4_K_M", "Q8_0"):
        print(quantize(f32, out / f"tiny-{family}-{quant}.gguf", quant), flush=True)
