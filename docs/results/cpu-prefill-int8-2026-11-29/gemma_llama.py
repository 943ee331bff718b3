import json, sys
import numpy as np
sys.path.insert(0, "/work/wt-prompt37/tools")
from benchlib import gguf_path, import_llama_cpp
llama_cpp = import_llama_cpp()
prompts = json.load(open("/tmp/p37/gemma_float.json"))["prompts"]
llm = llama_cpp.Llama(model_path=str(gguf_path()), n_ctx=1024, n_threads=2, logits_all=True, verbose=False)
res = []
for ids in prompts:
    llm.reset(); llm.eval(ids); out = []
    for _ in range(32):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1]))); llm.eval(out[-1:])
    res.append(out)
json.dump(res, open("/tmp/p37/gemma_llama.json", "w"))
