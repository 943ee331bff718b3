"""Greedy tokens on five prompts: WiCore (an export with MatMulQ's prompt_precision; WICORE_MATMULQ_PROMPT
overrides it for the A/B), HF float32 on the same GGUF weights, llama.cpp; tokens equal to HF's a prompt.

usage: agree.py MODEL MODE EXPORT OUT.json
  MODEL gemma | smollm2 | tiny GGUF path; MODE ours (the export's attributes) | float | int8 (the variable on
  every node) | hf | llama. WiCore runs the prompts batched (their first step 32+ rows), one at a time, and
  seven copies batched (decode steps of 35 rows).
"""

import json
import os
import sys
from pathlib import Path

import numpy as np

model, mode, export, out = sys.argv[1:5]
N = 32
HF_CACHE = {  # the test suite's saved HF references (tests/conftest.py hf_reference), read in place
    "gemma": "/work/cache-int/exports-e7a6ef68c148/hf-gemma3-270m-transformers-5.24.0",
    "smollm2": "/work/cache-int/exports-e7a6ef68c148/hf-smollm2-135m-instruct-transformers-5.24.0",
}
GGUF = {"gemma": None, "smollm2": "/work/cache-int/gguf/smollm2-135m-instruct.gguf"}
if mode in ("float", "int8"):
    os.environ["WICORE_MATMULQ_PROMPT"] = mode
else:
    os.environ.pop("WICORE_MATMULQ_PROMPT", None)

from wicore.cli.verify import VERIFY_TEXT  # noqa: E402
from wicore.engine.engine import Engine, EngineConfig  # noqa: E402
from wicore.types.sampling import SamplingParams  # noqa: E402

LONG_TEXT = " ".join([VERIFY_TEXT] * 9)


def prompts_of(e) -> list[list[int]]:
    tok = e.tokenizer
    chat = lambda text: tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]), add_bos=False)  # noqa: E731
    if model == "gemma":  # docs/results/cpu-prefill-int8-2026-11-29/gemma_agree.py's five
        return [
            chat("Name three colours of the rainbow."),
            tok.encode("def fibonacci(n):"),
            tok.encode(LONG_TEXT + " In summary,"),
            tok.encode("The capital of France is"),
            chat("Write a short story about a lighthouse keeper who finds a message in a bottle. Keep it under 100 words, and give it a title."),
        ]
    if model == "smollm2":  # tests/test_smollm2.py's three chats and the two of PERFORMANCE.md's 2026-11-27 run
        return [
            chat("Write a short poem about the sea."),
            chat("What is the capital of France?"),
            tok.encode(tok.apply_chat_template([{"role": "system", "content": "You are a concise assistant."}, {"role": "user", "content": "Give me three tips for learning Python."}]), add_bos=False),
            chat("Explain why the sky is blue in two sentences."),
            chat("List three fruits that are red."),
        ]
    raise ValueError(model)


record = {"model": model, "mode": mode}
if model.endswith(".gguf"):  # a tiny GGUF: tests/export/test_gguf_llama_cpp.py's prompts (SmolLM2's tokenizer)
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "export"))
    from transformers import AutoTokenizer

    from test_gguf_llama_cpp import TEXTS

    s = GGUF["smollm2"]
    hf_tok = AutoTokenizer.from_pretrained(str(Path(s).parent), gguf_file=Path(s).name)
    prompts = [hf_tok(text)["input_ids"] for text in TEXTS]
else:
    with Engine(EngineConfig(model_dir=Path(export), num_threads=2, host_tier_gb=0)) as e:
        prompts = prompts_of(e)
record["lens"] = [len(p) for p in prompts]
if mode in ("ours", "float", "int8"):
    sp = SamplingParams(max_tokens=N, ignore_eos=True)
    # no prefix cache: every prompt's whole prefill runs (a cached chat template would leave a tail of < 32 rows)
    with Engine(EngineConfig(model_dir=Path(export), num_threads=2, host_tier_gb=0, enable_prefix_cache=False)) as e:
        record["batched"] = [c.token_ids for c in e.generate(prompts, sp)]
        record["single"] = [e.generate([p], sp)[0].token_ids for p in prompts]
        # seven copies at once: decode steps of 35 rows, each layer on the prompt GEMM (int8 where the export says)
        record["wide"] = [c.token_ids for c in e.generate(prompts * 7, sp)]
elif mode == "hf":
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(2)
    if model.endswith(".gguf"):
        raise ValueError("tiny models: HF's tokens come from the test's checkpoint (agree_tiny.py)")
    saved = Path(HF_CACHE[model])
    m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(saved), dtype=torch.float32, attn_implementation="eager")
    m.load_state_dict(torch.load(saved / "state_dict.pt", weights_only=True), strict=True)
    m.eval()
    with torch.no_grad():
        record["tokens"] = [
            m.generate(torch.tensor([p]), max_new_tokens=N, min_new_tokens=N, do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(p) :].tolist()
            for p in prompts
        ]
elif mode == "llama":
    import llama_cpp

    gguf = GGUF.get(model) or model
    if gguf is None or model == "gemma":
        from wicore.export.sources import packaged_gguf

        gguf = str(packaged_gguf("gemma3-270m"))
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=1024, n_threads=2, logits_all=True, verbose=False)
    record["tokens"] = []
    for ids in prompts:
        llm.reset()
        llm.eval(ids)
        got = []
        for _ in range(N):
            got.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval(got[-1:])
        record["tokens"].append(got)
    record["system_info"] = llama_cpp.llama_print_system_info().decode()
json.dump({**record, "prompts": prompts}, open(out, "w"))
print(model, mode, record["lens"])
