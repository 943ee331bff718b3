"""Tokens equal to HF float32's a prompt, from agree.sh's records: python summary.py MODEL..."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent


def agreeing(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


for model in sys.argv[1:]:
    hf = json.loads((HERE / f"agree-{model}-hf.json").read_text())["tokens"]
    llama = json.loads((HERE / f"agree-{model}-llama.json").read_text())["tokens"]
    print(f"{model}: llama.cpp {[agreeing(t, h) for t, h in zip(llama, hf)]}")
    for mode in ("ours", "float", "int8"):
        rec = json.loads((HERE / f"agree-{model}-{mode}.json").read_text())
        for how in ("batched", "single", "wide"):
            if how in rec:
                runs = rec[how]
                got = [agreeing(t, hf[i % len(hf)]) for i, t in enumerate(runs)]
                if how == "wide":  # seven copies: the fewest of each prompt's copies
                    got = [min(got[i :: len(hf)]) for i in range(len(hf))]
                print(f"  {mode:5} {how:7} {got}")
