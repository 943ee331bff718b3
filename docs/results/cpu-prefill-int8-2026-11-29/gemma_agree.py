"""Gemma 3 270M (--kernels wicore export) greedy tokens, float vs int8 prompt GEMM (env var), against llama.cpp."""
import os, sys, json
import numpy as np
sys.path.insert(0, "/work/wt-prompt37"); sys.path.insert(0, "/work/wt-prompt37/tests")
from pathlib import Path
from wicore.engine.engine import Engine, EngineConfig
from wicore.types.sampling import SamplingParams
from wicore.cli.verify import VERIFY_TEXT
from wicore.export.sources import packaged_gguf
M = Path("/work/cache-int/models/gemma-3-270m-q4_k_m-1041c72839da-ort-quant-wicore")
LONG_TEXT = " ".join([VERIFY_TEXT] * 9)
mode = sys.argv[1]
if mode == "int8": os.environ["WICORE_MATMULQ_PROMPT"] = "int8"
out = {}
with Engine(EngineConfig(model_dir=M, num_threads=2, host_tier_gb=0)) as e:
    tok = e.tokenizer
    prompts = [
        tok.encode(tok.apply_chat_template([{"role": "user", "content": "Name three colours of the rainbow."}]), add_bos=False),
        tok.encode("def fibonacci(n):"),
        tok.encode(LONG_TEXT + " In summary,"),
        tok.encode("The capital of France is"),
        tok.encode(tok.apply_chat_template([{"role": "user", "content": "Write a short story about a lighthouse keeper who finds a message in a bottle. Keep it under 100 words, and give it a title."}]), add_bos=False),
    ]
    cs = e.generate(prompts, SamplingParams(max_tokens=32, ignore_eos=True))
    out["ours"] = [c.token_ids for c in cs]
    out["lens"] = [len(p) for p in prompts]
    # one at a time too (batching changes the rows a step)
    out["ours_single"] = [e.generate([p], SamplingParams(max_tokens=32, ignore_eos=True))[0].token_ids for p in prompts]
    out["text"] = [tok.decode(t) for t in out["ours_single"]]
if mode == "llama":
    from benchlib import import_llama_cpp
    pass
json.dump({**out, "prompts": prompts}, open(f"/tmp/p37/gemma_{mode}.json", "w"))
print(mode, out["lens"], [t[:60] for t in out["text"]])
