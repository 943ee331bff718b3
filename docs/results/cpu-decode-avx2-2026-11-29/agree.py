"""Greedy agreement with HF float32 (tests/export/test_gguf_llama_cpp.py's prompts and rule): WiCore's export of each
tiny GGUF (2 threads) and llama.cpp on the same GGUF, tokens equal to HF's first 32 greedy tokens on five prompts.
usage: agree.py FAMILY QUANT EXPORT_DIR [LIB]"""
import sys
from pathlib import Path
sys.path[:0] = ["tests", "tests/export"]
import torch, transformers
from llama_cpp_peer import llama_cpp_greedy, num_agreeing
from test_gguf_llama_cpp import NUM_TOKENS, TEXTS
import wicore.executor.graphs as G
from wicore.engine.engine import Engine, EngineConfig
from wicore.types.sampling import SamplingParams
family, quant, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
if len(sys.argv) > 4: G.kernel_library = lambda devices, lib=sys.argv[4]: Path(lib)
hf = Path(f"/work/tiny37/tiny-{family}-hf")
tok = transformers.AutoTokenizer.from_pretrained(hf)
model = transformers.AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32).eval()
prompts = [tok(t)["input_ids"] for t in TEXTS]
torch.set_num_threads(1)
with torch.no_grad():
    ref = [model.generate(torch.tensor([p]), max_new_tokens=NUM_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(p):].tolist() for p in prompts]
with Engine(EngineConfig(model_dir=out, num_threads=2, host_tier_gb=0)) as engine:
    ours = [c.token_ids for c in engine.generate(prompts, SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True))]
theirs = llama_cpp_greedy(Path(f"/work/tiny37/tiny-{family}-{quant}.gguf"), prompts, NUM_TOKENS)
a = [num_agreeing(o, r) for o, r in zip(ours, ref)]
b = [num_agreeing(t, r) for t, r in zip(theirs, ref)]
print(f"{family} {quant} {out.name}: WiCore {a} llama.cpp {b} at least llama.cpp's on every prompt: {all(x >= y for x, y in zip(a, b))}")
